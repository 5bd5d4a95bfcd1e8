"""Intervals of one run's means: the two-stage clustered bootstrap (conversations, then questions within them),
percentile intervals and minimum detectable differences, per summary group (definitions: `memlab.eval.stats`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from memlab.data.locomo import CATEGORY_LABELS

#: (z_0.975 + z_0.80): standard errors between 0 and a difference detected with 80 % power at alpha = 0.05.
MDD_FACTOR = 2.8
#: The two overall figures: 1-4 is what most papers report (1,540 questions on LoCoMo-10); 1-5
#: adds the adversarial questions, whose abstention rule rewards a system that says little.
#: LongMemEval's categories 6 and 7 (memlab.data.longmemeval) count in both: "1-4" is every question but
#: the abstention ones (category 5), "1-5" every question; on LoCoMo (no 6, 7) the groups are unchanged.
OVERALL_GROUPS: dict[str, tuple[int, ...]] = {"overall 1-4": (1, 2, 3, 4, 6, 7), "overall 1-5": (1, 2, 3, 4, 5, 6, 7)}
N_BOOT = 2000
#: Replicates gathered at once in the inner resample (`cluster_bootstrap`): bounds its transient memory.
GATHER_ROWS = 256


def cluster_bootstrap(values: np.ndarray | Sequence[float], clusters: Sequence[object], n_boot: int = N_BOOT,
                      seed: int = 0, inner: bool = True) -> np.ndarray:
    """Bootstrap means of each column of ``values`` (n x M, or n) over a two-stage clustered resample.

    Returns an ``n_boot x M`` array (NaN where a replicate drew no value of that metric). ``inner=False``
    resamples conversations only (whole clusters kept). Columns share the draws, so metrics are comparable.
    """
    x = np.asarray(values, dtype=float)
    one = x.ndim == 1
    x = x.reshape(len(x), -1) if x.size else x.reshape(0, x.shape[1] if x.ndim == 2 else 1)
    cl = np.asarray(pd.factorize(pd.Series(list(clusters), dtype=object))[0])
    if len(cl) != len(x):
        raise ValueError(f"cluster_bootstrap: {len(x)} values but {len(cl)} cluster labels")
    if len(x) == 0:
        out = np.full((n_boot, x.shape[1]), np.nan)
        return out[:, 0] if one else out
    valid = ~np.isnan(x)
    xz = np.where(valid, x, 0.0)
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(cl == c) for c in range(cl.max() + 1)]
    n_c = len(groups)
    pick = rng.integers(0, n_c, size=(n_boot, n_c))  # which conversation fills each slot of each replicate
    sums = np.zeros((n_boot, x.shape[1]))
    counts = np.zeros((n_boot, x.shape[1]))
    for c, rows in enumerate(groups):
        slots = pick == c
        m = int(slots.sum())
        if m == 0:
            continue
        reps = np.nonzero(slots)[0]  # replicate of each slot (a replicate may hold c twice: two inner draws)
        if inner:
            idx = rows[rng.integers(0, len(rows), size=(m, len(rows)))]
            gaps = ~valid[rows].all(axis=0)  # only a column with a missing value here needs its draws counted
            s = np.empty((m, x.shape[1]))
            k = np.full((m, x.shape[1]), len(rows))
            # the gathered draws are m x questions x metrics floats (60 MB for a LoCoMo conversation): summed
            # a block of replicates at a time, each row's sum the same as whole (the metrics axis is innermost)
            for a in range(0, m, GATHER_ROWS):
                part = idx[a:a + GATHER_ROWS]
                s[a:a + len(part)] = xz[part].sum(axis=1)
                if gaps.any():
                    k[a:a + len(part), gaps] = valid[:, gaps][part].sum(axis=1)
        else:
            s = np.broadcast_to(xz[rows].sum(axis=0), (m, x.shape[1]))
            k = np.broadcast_to(valid[rows].sum(axis=0), (m, x.shape[1]))
        np.add.at(sums, reps, s)
        np.add.at(counts, reps, k)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return means[:, 0] if one else means


def naive_bootstrap(values: np.ndarray | Sequence[float], n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """Plain i.i.d. bootstrap means (each question its own cluster): what ignoring the clustering gives."""
    x = np.asarray(values, dtype=float)
    return cluster_bootstrap(x, list(range(len(x))), n_boot=n_boot, seed=seed, inner=False)


def percentile_ci(boot: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    a = (1 - level) / 2
    with warnings.catch_warnings():  # an all-NaN column (a metric with no value here) gives NaN bounds
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(boot, a, axis=0), np.nanquantile(boot, 1 - a, axis=0)


def nan_sd(x: np.ndarray) -> float:
    """Sample SD of the non-NaN values (NaN with fewer than two)."""
    v = x[~np.isnan(x)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")


def groups_of(frame: pd.DataFrame, category_col: str = "category") -> list[tuple[object, str, pd.DataFrame]]:
    """(group, label, rows): each category present (group = its number as text, like the summary index),
    then overall 1-4 and overall 1-5."""
    out: list[tuple[object, str, pd.DataFrame]] = []
    for cat, g in frame.groupby(category_col, sort=True):
        out.append((str(int(cat)), CATEGORY_LABELS.get(int(cat), str(cat)), g))
    for name, cats in OVERALL_GROUPS.items():
        out.append((name, "", frame[frame[category_col].isin(cats)]))
    return out


def _whole(x: np.ndarray) -> bool:
    """Whether every value is a whole number (or missing) small enough that any replicate's sum (at most n^2
    draws) is exact in floating point, whatever the order of the additions."""
    v = x[~np.isnan(x)]
    return bool(not len(v) or ((v == np.round(v)).all() and np.abs(v).max() * len(x) ** 2 < 2**53))


def _known_bootstrap(vals: np.ndarray, n_boot: int) -> np.ndarray:
    """The bootstrap means of the columns whose every replicate is known without resampling, exactly as
    `cluster_bootstrap` gives them (columns share the draws, not their values): NaN for a column with no value,
    ``c`` for a column of one whole number ``c`` and no gap (each replicate sums k copies: exactly k c);
    ``inf`` marks the columns to resample (all of them when there are no rows)."""
    out = np.full((n_boot, vals.shape[1]), np.inf)
    for i in range(vals.shape[1] if len(vals) else 0):
        col = vals[:, i]
        if np.isnan(col).all():
            out[:, i] = np.nan
        elif (col == col[0]).all() and _whole(col):
            out[:, i] = col[0]
    return out


def ci_columns(frame: pd.DataFrame, metrics: Sequence[str], cluster_col: str = "conversation_id",
               category_col: str = "category", n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95,
               mdd_metrics: Sequence[str] = ("f1", "j")) -> pd.DataFrame:
    """``<metric>_lo``/``<metric>_hi`` per group (and ``<metric>_mdd`` for ``mdd_metrics``), indexed like
    `memlab.eval.category_summary`."""
    if cluster_col not in frame.columns:
        raise KeyError(f"ci_columns: no cluster column {cluster_col!r} (the conversation of each question); "
                       f"have {list(frame.columns)}")
    rows = {}
    for name, _, g in groups_of(frame, category_col):
        vals = g[list(metrics)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        boot = _known_bootstrap(vals, n_boot)
        todo = np.flatnonzero(np.isinf(boot[0]))
        if len(todo) == vals.shape[1] or not _whole(vals[:, todo]):
            boot = cluster_bootstrap(vals, g[cluster_col].tolist(), n_boot=n_boot, seed=seed)
        elif len(todo):  # the same draws, fewer columns: whole-number sums do not depend on how numpy adds them
            boot[:, todo] = cluster_bootstrap(vals[:, todo], g[cluster_col].tolist(), n_boot=n_boot, seed=seed)
        lo, hi = percentile_ci(boot, level)
        row: dict[str, float] = {}
        for i, m in enumerate(metrics):
            row[f"{m}_lo"], row[f"{m}_hi"] = float(lo[i]), float(hi[i])
            if m in mdd_metrics:
                row[f"{m}_mdd"] = MDD_FACTOR * np.sqrt(2) * nan_sd(boot[:, i]) if len(g) > 1 else float("nan")
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")
