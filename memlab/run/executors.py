"""Executors: where the runs of a grid execute. ``local`` runs them one after the other in this process
(`run_experiment`); ``ray`` submits (grid cell x conversation) tasks to a Ray cluster
(`memlab.run.ray_executor`). Both write the same run folders; ``run.executor`` picks one, the CLI's
``--executor`` overrides it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memlab.run.config import EXECUTORS, ConfigError, ExperimentConfig
from memlab.run.results import Run
from memlab.run.runner import resolve_run_config, run_experiment


def run_grid(config: ExperimentConfig | str | Path | None = None, results: str | Path | None = None,
             progress: bool = True, *, executor: str | None = None, address: str | None = None,
             resume: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None,
             force_config: bool = False, trust_run_config: bool = False, reuse: bool = False) -> list[Run]:
    """Every run of a config (each grid point; a config without a grid is one run), or ``resume`` one run,
    on the chosen executor (default: the config's ``run.executor``); ``trust_run_config`` and ``reuse`` (local
    executor only) as in `run_experiment`."""
    if resume is not None:
        cfg, _ = resolve_run_config(None, resume, overrides, force_config, trust_run_config)
    else:
        cfg = ExperimentConfig.of(config, overrides, caller="run_grid")
    kind = executor or cfg.run.executor
    if kind not in EXECUTORS:
        raise ConfigError(f"executor = {kind!r}; allowed: {', '.join(EXECUTORS)}")
    if kind == "ray":
        from memlab.run.ray_executor import run_grid_ray

        if reuse:
            raise ConfigError("reuse: the local executor only (the ray executor runs every grid point)")

        if resume is not None:
            return run_grid_ray(resume=resume, progress=progress, address=address, overrides=overrides,
                                force_config=force_config, trust_run_config=trust_run_config)
        return run_grid_ray(cfg, results=results, progress=progress, address=address)
    if resume is not None:
        return [run_experiment(None, resume=resume, progress=progress, overrides=overrides,
                               force_config=force_config, trust_run_config=trust_run_config)]
    return [run_experiment(c, results=results, progress=progress, reuse=reuse) for c in cfg.expand()]
