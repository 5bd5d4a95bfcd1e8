"""Experiments: configs as data, the runner (cached extraction, answering, scoring, traces), reports."""

from memlab.run.config import ConfigError, ExperimentConfig
from memlab.run.runner import Run, load_run, run_ablation, run_experiment

__all__ = ["ConfigError", "ExperimentConfig", "Run", "load_run", "run_ablation", "run_experiment"]
