"""Side-by-side per-category comparison of finished runs (``memlab report``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from memlab.run.runner import Run, load_run

DEFAULT_METRICS = ("f1", "bleu1", "recall@10", "tokens_qa", "context_tokens_qa", "calls_qa", "latency_p50_s")


def compare(runs: Sequence[Run | str | Path], metrics: Sequence[str] = DEFAULT_METRICS) -> pd.DataFrame:
    """One row per category group; columns (metric, run name)."""
    loaded = [r if isinstance(r, Run) else load_run(r) for r in runs]
    frames = {}
    for r in loaded:
        name = r.run_dir.name
        cols = [m for m in metrics if m in r.summary.columns]
        frames[name] = r.summary[["n", *cols]]
    out = pd.concat(frames, axis=1)
    out = out.swaplevel(axis=1).sort_index(axis=1, level=0, sort_remaining=False)
    order = [m for m in ("n", *metrics) if m in out.columns.get_level_values(0)]
    return out.reindex(columns=order, level=0)


def format_compare(table: pd.DataFrame) -> str:
    return table.to_string(float_format=lambda x: f"{x:.3f}")
