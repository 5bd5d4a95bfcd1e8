"""What memlab's local torch models (minilm, SPLADE) share: loading them quietly, and their number format."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Literal


@contextlib.contextmanager
def quiet_model_load() -> Iterator[None]:
    """Load a transformers model without its "Loading weights" progress bar (a flood in notebook output);
    the bar's global setting is restored afterwards."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


#: The number format a local model (minilm, SPLADE) runs in. ``bfloat16`` cuts their CPU time by 1.4-2x on a CPU
#: with native bf16 arithmetic (AVX512-BF16 or AMX; elsewhere it is emulated, and slower than float32) and moves
#: their vectors slightly (minilm: cosine >= 0.9999 to float32's on LoCoMo-10's memories): for fast sweeps. The
#: model's id names it, so the caches never serve one format's vectors for the other.
ModelDtype = Literal["float32", "bfloat16"]


def dtype_tag(dtype: str) -> str:
    """What a model id adds for a number format (nothing for float32: the ids, and caches, made before it)."""
    return "" if dtype == "float32" else f",{dtype}"


def cast_model(model: Any, dtype: str) -> Any:
    """The torch model in ``dtype`` (in place; float32 is how the models load)."""
    if dtype != "float32":
        # torch's bf16 matrix products go through oneDNN, and length-sorted batches have hundreds of shapes:
        # oneDNN keeps a compiled kernel per shape (1,024 by default; retrieval-best in bf16 peaked at 1.60 GB
        # with the default and 1.33 GB with 16), and torch's ideep layer a computation per shape (also 1,024:
        # 81 MB kept after one minilm pass over LoCoMo-10's turns, 4 MB with 16, and no slower). Both are read
        # when first used; a user's own setting wins.
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
        os.environ.setdefault("LRU_CACHE_CAPACITY", "16")
        import torch

        model.to(getattr(torch, dtype))
    return model
