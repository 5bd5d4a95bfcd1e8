"""Experiments: configs as data and the runner, one module per stage.

`config` (what a run varies) → `selection` (which questions) → `components` (registries → objects)
→ `extraction` (cached store, traces) → `answering` (records, resume log) → `results` (scores,
summary, `load_run`); `runner.run_experiment` is the sequence; `records` defines what is written.
"""

from memlab.run.config import ConfigError, ExperimentConfig
from memlab.run.records import PredictionRecord, RunStatus
from memlab.run.results import Run, load_run
from memlab.run.runner import run_ablation, run_experiment

__all__ = ["ConfigError", "ExperimentConfig", "PredictionRecord", "Run", "RunStatus", "load_run", "run_ablation",
           "run_experiment"]
