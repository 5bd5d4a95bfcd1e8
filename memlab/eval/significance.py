"""Paired tests: the sign-flip permutation test and the interval that inverts it, exact McNemar, Holm's
adjustment (definitions: `memlab.eval.stats`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd


def sign_flip_test(diffs: Sequence[float], clusters: Sequence[object] | None = None, n_perm: int = 10000,
                   seed: int = 0, max_exact: int = 16) -> float:
    """Two-sided paired permutation p-value for mean(diffs) = 0 (see the module notes; ``clusters=None``
    flips questions one by one)."""
    return sign_flip(diffs, clusters, n_perm=n_perm, seed=seed, max_exact=max_exact)[0]


def sign_flip(diffs: Sequence[float], clusters: Sequence[object] | None = None, n_perm: int = 10000,
              seed: int = 0, max_exact: int = 16, level: float = 0.95) -> tuple[float, float, float]:
    """(p, lo, hi): the sign-flip test of mean(diffs) = 0 and the interval that inverts it.

    The interval is every shift delta the same test does not reject at ``1 - level`` when run on
    ``diffs - delta`` (same units, same sign patterns), so it excludes 0 exactly when p <= 1 - level.
    Each pattern's statistic |sum_u s_u (S_u - delta n_u)| against the observed |sum_u (S_u - delta n_u)|
    (S_u, n_u: a unit's summed difference and its number of questions) stops counting at one point on each
    side of the estimate, found in closed form, so the bounds are exact for these patterns. With fewer than
    six units (2/2^5 > 0.05) a side can be unbounded (inf).
    """
    d = np.asarray(diffs, dtype=float)
    keep = ~np.isnan(d)
    d = d[keep]
    if len(d) == 0:
        return float("nan"), float("nan"), float("nan")
    tol = 1e-9 * max(1.0, np.abs(d).sum())
    if clusters is not None:
        cl = np.asarray(pd.factorize(pd.Series(list(clusters), dtype=object))[0])[keep]
        sizes = np.bincount(cl)
        units, counts = np.bincount(cl, weights=d)[sizes > 0], sizes[sizes > 0].astype(float)
    else:
        units, counts = d, np.ones(len(d))
    exact = len(units) <= max_exact
    if exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(units))))
        flipped, flipped_n = signs @ units, signs @ counts
    else:
        rng = np.random.default_rng(seed)
        parts = []
        for start in range(0, n_perm, 2000):
            signs = rng.choice((-1.0, 1.0), size=(min(2000, n_perm - start), len(units)))
            parts.append((signs @ units, signs @ counts))
        flipped, flipped_n = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    k = len(flipped)
    hits = int((np.abs(flipped) >= abs(units.sum()) - tol).sum())
    p = hits / k if exact else (1 + hits) / (1 + k)
    total, est = counts.sum(), units.sum() / counts.sum()
    a = flipped - est * flipped_n  # each pattern's statistic at delta = est (where the observed one is 0)
    # rank of the last accepted bound among the patterns' crossing points, largest first
    j = int(np.floor((1 - level) * k)) if exact else int(np.floor((1 - level) * (1 + k) - 1))

    def reach(side: float) -> float:
        """How far from ``est`` (side +1: up, -1: down) the test keeps accepting."""
        if j < 0:
            return float("inf")
        with np.errstate(divide="ignore", invalid="ignore"):
            denom = total + side * np.sign(a) * flipped_n
            x = np.where(denom > 0, np.abs(a) / denom, np.inf)
        zero = np.abs(a) <= tol
        x[zero] = np.where(np.abs(flipped_n[zero]) >= total, np.inf, 0.0)
        return float(np.sort(x)[::-1][j])

    return float(p), float(est - reach(-1.0)), float(est + reach(1.0))


def mcnemar_exact(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> tuple[float, int, int]:
    """(p, b, c): exact McNemar on paired booleans; b = only A correct, c = only B correct."""
    a = np.asarray(a_correct, dtype=bool)
    bb = np.asarray(b_correct, dtype=bool)
    b = int((a & ~bb).sum())
    c = int((~a & bb).sum())
    return mcnemar_from_counts(b, c), b, c


def mcnemar_from_counts(b: int, c: int) -> float:
    """Two-sided exact McNemar: twice the binomial(b + c, 1/2) tail at min(b, c), capped at 1. Summed in exact
    integers (one correctly rounded division), so no scipy.stats import (~1 s of CPU) and no rounding in the sum."""
    m = b + c
    if m == 0:
        return 1.0
    term, tail = 1, 1  # C(m, 0); then C(m, i + 1) = C(m, i) * (m - i) / (i + 1), exact
    for i in range(min(b, c)):
        term = term * (m - i) // (i + 1)
        tail += term
    return min(1.0, 2 * tail / (1 << m))


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1; NaN stays NaN, not counted)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out
