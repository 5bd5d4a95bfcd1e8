"""``memlab.compare``: paired comparison of finished runs (statistics in `memlab.eval.stats`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from memlab.data import sha256_file
from memlab.eval.stats import Comparison, compare_grid, compare_predictions
from memlab.run.results import Run, load_run

DEFAULT_METRICS = ("f1", "bleu1", "em", "j", "context_recall")


def dataset_sha(run: Run) -> str | None:
    """The dataset sha256 the run recorded; for older runs, the hash of its dataset file if still there."""
    sha = run.info.get("dataset_sha256")
    if sha:
        return str(sha)
    path = run.info.get("dataset")
    return sha256_file(path) if path and Path(path).is_file() else None


def _load(r: Run | str | Path) -> Run:
    return r if isinstance(r, Run) else load_run(r)


def compare(run_a: Run | str | Path, run_b: Run | str | Path, metrics: Sequence[str] = DEFAULT_METRICS,
            questions: str = "same", threshold_metric: str = "f1", threshold: float = 0.5,
            cluster_perm: bool = True, n_boot: int = 2000, seed: int | None = None) -> Comparison:
    """Run B against run A, question by question (``delta = b - a``): `Comparison` with ``.table``
    (group x metric: delta, lo, hi, p_perm, p_mcnemar, wins, losses, ties, mdd, n) and ``.flipped``.

    Refuses runs over different datasets (sha256) or question sets (``questions='intersection'``
    compares the shared questions). ``seed`` defaults to run A's ``run.seed``.
    """
    a, b = _load(run_a), _load(run_b)
    return compare_predictions(a.predictions, b.predictions, metrics=metrics, a_sha=dataset_sha(a),
                               b_sha=dataset_sha(b), a_name=a.run_dir.name, b_name=b.run_dir.name,
                               questions=questions, threshold_metric=threshold_metric, threshold=threshold,
                               cluster_perm=cluster_perm, n_boot=n_boot,
                               seed=a.config.run.seed if seed is None else seed)


def compare_runs(runs: Sequence[Run | str | Path], metrics: Sequence[str] = DEFAULT_METRICS,
                 questions: str = "same", threshold_metric: str = "f1", threshold: float = 0.5,
                 cluster_perm: bool = True, n_boot: int = 2000,
                 seed: int | None = None) -> tuple[pd.DataFrame, dict[str, Comparison]]:
    """Every run against the first (the baseline), p-values Holm-adjusted over the runs (``*_holm``)."""
    loaded = [_load(r) for r in runs]
    if len(loaded) < 2:
        raise ValueError("compare_runs: give a baseline and at least one more run")
    names = [r.run_dir.name for r in loaded]
    if len(set(names)) != len(names):
        names = [str(r.run_dir) for r in loaded]
    base = loaded[0]
    shas = {n: dataset_sha(r) for n, r in zip(names, loaded)}
    return compare_grid(base.predictions, {n: r.predictions for n, r in zip(names[1:], loaded[1:])}, shas,
                        baseline_name=names[0], metrics=metrics, questions=questions,
                        threshold_metric=threshold_metric, threshold=threshold, cluster_perm=cluster_perm,
                        n_boot=n_boot, seed=base.config.run.seed if seed is None else seed)
