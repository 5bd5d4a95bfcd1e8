"""The one door to litellm: imported lazily (7-8 s) and never allowed to fetch remote config at import."""

from __future__ import annotations

import os
from typing import Any

_OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # bundled model-cost map instead of a remote fetch at import
    "LITELLM_OFFLINE_MODE": "true",
}


def import_litellm() -> Any:
    for k, v in _OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm
