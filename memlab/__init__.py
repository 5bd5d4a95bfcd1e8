"""memlab: a Jupyter-first research toolkit for long-term conversational memory (LoCoMo-10).

Stages, one direction: data -> memory -> index -> extract -> answer -> eval -> run -> trace/attribution -> plots.
Heavy modules load on first use, so ``import memlab`` stays fast. The public verbs (docs/reference):
``run_experiment``, ``report`` (the per-category table of runs), ``compare`` (runs against a baseline).
"""

from __future__ import annotations

from typing import Any

from memlab.threads import sleep_idle_threads

sleep_idle_threads()  # before numpy, FAISS or torch load their OpenMP runtime (see memlab.threads)

__version__ = "0.1.0"

#: public name -> (module, attribute)
_LAZY = {"run_experiment": ("memlab.run", "run_experiment"), "run_ablation": ("memlab.run", "run_ablation"),
         "load_run": ("memlab.run", "load_run"), "ExperimentConfig": ("memlab.run", "ExperimentConfig"),
         "load_locomo": ("memlab.data", "load_locomo"), "subset": ("memlab.run.notebook", "subset"),
         "compare": ("memlab.run.compare", "compare"), "report": ("memlab.run.report", "report_table")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'memlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
