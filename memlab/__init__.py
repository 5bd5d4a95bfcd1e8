"""memlab: a Jupyter-first research toolkit for long-term conversational memory (LoCoMo-10).

Stages, one direction: data -> memory -> index -> extract -> answer -> eval -> run -> trace/attribution -> plots.
Heavy modules load on first use, so ``import memlab`` stays fast.
"""

from __future__ import annotations

from typing import Any

from memlab.threads import sleep_idle_threads

sleep_idle_threads()  # before numpy, FAISS or torch load their OpenMP runtime (see memlab.threads)

__version__ = "0.1.0"

_LAZY = {"run_experiment": "memlab.run", "run_ablation": "memlab.run", "load_run": "memlab.run",
         "ExperimentConfig": "memlab.run", "load_locomo": "memlab.data", "subset": "memlab.run.notebook",
         "compare": "memlab.run.compare", "compare_runs": "memlab.run.compare"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memlab' has no attribute {name!r}")
