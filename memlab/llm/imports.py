"""Importing litellm (lazily, never fetching remote config) and counting tokens offline."""

from __future__ import annotations

import os
import threading
from typing import Any

_OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # bundled model-cost map instead of a remote fetch at import
    "LITELLM_OFFLINE_MODE": "true",
}


_IMPORT_LOCK = threading.Lock()


def import_litellm() -> Any:
    for k, v in _OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    with _IMPORT_LOCK:  # threads importing it at once (first calls of a parallel run) were slow
        import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


def _tiktoken_offline() -> None:
    """Point tiktoken at litellm's bundled encodings (plain tiktoken would try to download them)."""
    import importlib.util

    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.submodule_search_locations:
        d = os.path.join(list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers")
        if os.path.isdir(d):
            os.environ["TIKTOKEN_CACHE_DIR"] = d


_ENCODER: Any = None


def count_tokens(text: str) -> int:
    """o200k tokens of a text, offline and without importing litellm (a model-free cost measure)."""
    global _ENCODER
    if _ENCODER is None:
        _tiktoken_offline()
        import tiktoken

        _ENCODER = tiktoken.get_encoding("o200k_base")
    return len(_ENCODER.encode(text, disallowed_special=()))
