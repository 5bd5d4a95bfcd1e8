"""Uncertainty for every number: clustered bootstrap CIs, paired comparisons, Holm, minimum detectable differences.

LoCoMo-10 has 10 conversations; the questions of one conversation share its memories, so they are
not independent. Every interval of one run's mean therefore comes from a *two-stage clustered bootstrap*: draw
conversations with replacement, then questions with replacement within each drawn conversation,
and take the mean over the pooled draw (question-weighted, like the point estimate). A 95 %
interval is the 2.5th and 97.5th percentile of ``n_boot`` such means (percentile bootstrap),
with a fixed seed so a rerun gives the same interval. A missing value (NaN: a question without
evidence for recall, a failed judge) drops out of that metric's mean and of its resamples.

Column names (what `category_summary` and `Comparison.table` write, and reports read):

- summary rows (index ``group``: the category number as text, then ``"overall 1-4"``, ``"overall 1-5"``):
  ``category``, ``label``,
  ``n`` (questions in the row), each metric (``f1``, ``bleu1``, ``em``, ``j``, ``recall@k``,
  ``context_recall``, ...) followed by ``<metric>_lo`` and ``<metric>_hi`` (95 % clustered
  bootstrap), and ``f1_mdd`` (and ``j_mdd`` when judged): the minimum difference a comparison
  with an equally noisy independent run could detect, ``2.8 * sqrt(2) * SE``.
- `Comparison.table` (one row per run x group x metric, runs in the order given): ``run`` (the run compared
  with the baseline A), ``group`` (as above), ``label``, ``metric``, ``n`` (shared questions with a value in both
  runs), ``a``, ``b`` (the two means), ``delta`` (b - a: positive when the run is higher than A), ``lo``, ``hi``
  (95 % paired bootstrap of delta), ``p_perm`` (paired sign-flip permutation test), ``p_perm_holm``,
  ``p_mcnemar`` (exact McNemar on correct = metric >= threshold), ``p_mcnemar_holm``, ``wins`` (b > a),
  ``losses`` (b < a), ``ties``, ``mdd`` (``2.8 * SE`` of the paired delta). `Comparison.legend` says the same
  in words and is printed under every comparison.

Minimum detectable difference: at two-sided alpha = 0.05 and 80 % power a true difference is
detected when it is about (z_0.975 + z_0.80) = 1.96 + 0.84 = 2.8 standard errors away from 0; the
SE is the bootstrap SD of the mean (paired: of the mean difference; one run: sqrt(2) x its SE, the
SE of the difference of two independent runs with this run's n and variance).

One method for the paired interval and the paired test. The interval of a delta inverts the permutation test
(`sign_flip`): it is every shift the test, run on ``diff - shift`` with the same units and sign patterns, does not
reject at 5 %, so it excludes 0 exactly when ``p_perm <= 0.05`` (a percentile bootstrap over 10 conversations was
narrower than the exact test: multi-hop F1 on LoCoMo-10 had [-0.039, +0.000] beside p = 0.002 with the
two-stage resample, and a one-stage one excluded 0 beside p = 0.098 for overall 1-4). The unit is the
conversation (sign flips of whole conversations) with ``unit='conversation'``; with fewer than `MIN_CLUSTERS`
conversations no clustered test can reach p < 0.05 and its interval is unbounded, so ``unit='auto'`` (the
default) then uses questions, and the legend says so. ``mdd`` takes its SE from a bootstrap over the same unit
(``cluster_bootstrap(inner=False)``). Holm: each comparison is one family per test, over all its rows (every run x
group x metric); ``p_perm_holm`` and ``p_mcnemar_holm`` are the adjusted values.

Permutation test: under the null the two runs are exchangeable on each question, so the sign of
each paired difference may be flipped. With the conversation as unit the sign of each conversation's summed
difference flips (valid when questions of a conversation are correlated; exact enumeration of all 2^C patterns
up to C = 16 conversations, so with 10 conversations the smallest two-sided p is 2/1024); with the question as
unit each question flips on its own (Monte Carlo, ``n_perm`` draws, p = (1 + hits) / (1 + n_perm)).
Statistic: the mean difference; two-sided.

McNemar: a question is *correct* when the metric >= ``threshold`` (default 0.5: F1 >= 0.5, and for
the binary EM / J the natural correct/incorrect). The discordant counts b (only A correct) and
c (only B correct) give the exact binomial p = P(|X - m/2| >= |b - m/2|), X ~ Bin(b + c, 1/2), at
every count (the chi-square form is only its large-sample approximation); p = 1 with no discordant pair.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as sps

from memlab.data.locomo import CATEGORY_LABELS

#: (z_0.975 + z_0.80): standard errors between 0 and a difference detected with 80 % power at alpha = 0.05.
MDD_FACTOR = 2.8
OVERALL = {"overall 1-4": (1, 2, 3, 4, 6, 7), "overall 1-5": (1, 2, 3, 4, 5, 6, 7)}  # as summary.OVERALL_GROUPS
N_BOOT = 2000


# ------------------------------------------------------------------------------ bootstrap
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
            s, k = xz[idx].sum(axis=1), valid[idx].sum(axis=1)
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


def _sd(x: np.ndarray) -> float:
    """Sample SD of the non-NaN values (NaN with fewer than two)."""
    v = x[~np.isnan(x)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")


def mean_ci(values: Sequence[float], clusters: Sequence[object], n_boot: int = N_BOOT, seed: int = 0,
            level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of one metric with the clustered bootstrap interval (`memlab.eval.longmemeval`'s summary)."""
    x = np.asarray(values, dtype=float)
    boot = cluster_bootstrap(x, clusters, n_boot=n_boot, seed=seed)
    lo, hi = percentile_ci(boot, level)
    return float(np.nanmean(x)) if np.any(~np.isnan(x)) else float("nan"), float(lo), float(hi)


def groups_of(frame: pd.DataFrame, category_col: str = "category") -> list[tuple[object, str, pd.DataFrame]]:
    """(group, label, rows): each category present (group = its number as text, like the summary index),
    then overall 1-4 and overall 1-5."""
    out: list[tuple[object, str, pd.DataFrame]] = []
    for cat, g in frame.groupby(category_col, sort=True):
        out.append((str(int(cat)), CATEGORY_LABELS.get(int(cat), str(cat)), g))
    for name, cats in OVERALL.items():
        out.append((name, "", frame[frame[category_col].isin(cats)]))
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
        boot = cluster_bootstrap(vals, g[cluster_col].tolist(), n_boot=n_boot, seed=seed)
        lo, hi = percentile_ci(boot, level)
        row: dict[str, float] = {}
        for i, m in enumerate(metrics):
            row[f"{m}_lo"], row[f"{m}_hi"] = float(lo[i]), float(hi[i])
            if m in mdd_metrics:
                row[f"{m}_mdd"] = MDD_FACTOR * np.sqrt(2) * _sd(boot[:, i]) if len(g) > 1 else float("nan")
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


# ------------------------------------------------------------------------------ tests
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
    m = b + c
    if m == 0:
        return 1.0
    return float(min(1.0, 2 * sps.binom.cdf(min(b, c), m, 0.5)))


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


# ------------------------------------------------------------------------------ comparison
#: Below this many conversations no conversation-level sign-flip test can reach p < 0.05 (2 / 2^5 = 0.0625),
#: so ``unit='auto'`` then treats questions as the unit, for the interval and the test alike.
MIN_CLUSTERS = 6
UNITS = ("auto", "conversation", "question")


class ComparisonError(ValueError):
    """Runs cannot be compared (different data or questions, nothing scored); the message says which and how."""


@dataclass
class Comparison:
    """Runs against a baseline A, question by question; every delta is ``run - A`` (positive: the run is higher).

    ``table`` has one row per run x group x metric (columns: see the module docstring); ``flipped`` the questions
    whose correct/incorrect status differs from A's, with a ``run`` column; ``unit`` the resampling unit shared by
    the interval and the permutation test.
    """

    baseline: str
    runs: list[str]
    table: pd.DataFrame
    flipped: pd.DataFrame
    unit: str = "conversation"
    clusters: int = 0
    threshold_metric: str = "f1"
    threshold: float = 0.5
    notes: list[str] = field(default_factory=list)

    def direction(self, run: str | None = None) -> str:
        """``"B - A"`` spelled with the names: the sign convention of every delta."""
        return f"{run if run is not None else 'run'} \u2212 {self.baseline}"

    def legend(self) -> list[str]:
        """What each column of the table is, in words: printed under every comparison."""
        return comparison_legend(self.unit, self.clusters, self.threshold_metric, self.threshold,
                                 int(self.table["p_perm"].notna().sum()) if len(self.table) else 0)

    def __str__(self) -> str:
        return format_comparison(self)

    __repr__ = __str__


def comparison_legend(unit: str, clusters: int, threshold_metric: str, threshold: float, tests: int) -> list[str]:
    """The legend of a comparison table (see `Comparison.legend`)."""
    ci = ("95 % interval of the delta by inverting p_perm: every shift the same permutation test does not reject "
          "at 0.05, so it excludes 0 exactly when p_perm <= 0.05")
    if unit == "conversation":
        perm = (f"two-sided paired permutation test of the mean delta: the sign of each conversation's summed "
                f"delta flipped, exact over all 2^{clusters} patterns (smallest possible p {2 / 2 ** clusters:.3g})"
                if clusters <= 16 else "two-sided paired permutation test of the mean delta: the sign of each "
                "conversation's summed delta flipped (Monte Carlo)")
    else:
        why = (f"used because {clusters} conversation(s) < {MIN_CLUSTERS} cannot reach p < 0.05 as a clustered "
               "test, so questions of one conversation are treated as independent" if clusters < MIN_CLUSTERS
               else "questions of one conversation treated as independent, as asked")
        perm = ("two-sided paired permutation test of the mean delta, each question's sign flipped on its own "
                f"(exact up to 16 questions, else random flips; {why})")
    lines = [
        f"lo, hi: {ci}.",
        f"p_perm: {perm}.",
        f"p_mcnemar: exact McNemar test on correct = {threshold_metric} >= {threshold} (questions where only one run "
        "is correct); it tests the share correct, not the mean, and treats questions as independent.",
        f"*_holm: Holm-adjusted over all {tests} rows of this table (every run x group x metric), one family per test.",
        f"mdd: minimum detectable difference, 2.8 x the SE of the delta (bootstrap over the same {unit}s): a true "
        "difference this large is "
        "detected with 80 % power at alpha 0.05; a |delta| below it with a large p means this comparison cannot "
        "tell, not that there is no difference.",
        "wins / losses / ties: questions where the run scored higher / lower / the same as the baseline.",
    ]
    if unit == "conversation" and tests:
        floor = 2 / 2 ** clusters * tests if clusters <= 16 else 0.0
        if floor >= 0.05:
            lines.append(f"note: with {clusters} conversations the smallest p_perm is {2 / 2 ** clusters:.3g}, so "
                         f"after Holm over {tests} tests no p_perm_holm can fall below {min(floor, 1):.3g}; "
                         "compare fewer metrics (--metrics f1) for a sharper test.")
    return lines


def check_comparable(a: pd.DataFrame, b: pd.DataFrame, a_sha: str | None, b_sha: str | None,
                     a_name: str = "A", b_name: str = "B", questions: str = "same") -> list[str]:
    """The shared question ids, or `ComparisonError` naming what differs (dataset sha256, question set)."""
    if questions not in ("same", "intersection"):
        raise ValueError(f"questions = {questions!r}; expected 'same' or 'intersection'")
    if not a_sha or not b_sha:
        missing = [n for n, s in ((a_name, a_sha), (b_name, b_sha)) if not s]
        raise ComparisonError(f"cannot check the dataset of {', '.join(missing)}: no dataset sha256 recorded")
    if a_sha != b_sha:
        raise ComparisonError(f"different datasets: {a_name} ran on sha256 {a_sha[:12]}..., "
                              f"{b_name} on {b_sha[:12]}...; a paired comparison needs the same file")
    qa, qb = list(a["qid"]), list(b["qid"])
    for name, q in ((a_name, qa), (b_name, qb)):
        if len(set(q)) != len(q):
            raise ComparisonError(f"{name}: duplicate question ids in the predictions")
    sb = set(qb)
    shared = [q for q in qa if q in sb]
    if len(shared) != len(qa) or len(shared) != len(qb):
        msg = (f"different question sets: {a_name} has {len(qa)} questions, {b_name} has {len(qb)}, "
               f"{len(shared)} shared")
        if questions != "intersection":
            raise ComparisonError(msg + "; pass questions='intersection' (CLI: --intersection) to compare "
                                        "on the shared questions only")
        if not shared:
            raise ComparisonError(msg)
    return shared


def check_scored(frame: pd.DataFrame, name: str, run_dir: object = "<run folder>") -> None:
    """A run whose every question errored has nothing to compare: say so instead of resampling nothing."""
    if "error" in frame.columns and len(frame) and frame["error"].notna().all():
        raise ComparisonError(f"{name}: every one of its {len(frame)} questions ended in an error (column error of "
                              "predictions.parquet), so it has no score to compare; retry them with: "
                              f"memlab run --resume {run_dir}")


def resolve_unit(unit: str, clusters: int) -> str:
    """``auto``: conversations when there are at least `MIN_CLUSTERS` of them, else questions."""
    if unit not in UNITS:
        raise ValueError(f"unit = {unit!r}; expected one of {', '.join(UNITS)}")
    if unit == "auto":
        return "conversation" if clusters >= MIN_CLUSTERS else "question"
    return unit


def compare_predictions(a: pd.DataFrame, b: pd.DataFrame, metrics: Sequence[str] = ("f1", "bleu1", "em", "j"),
                        a_sha: str | None = None, b_sha: str | None = None, a_name: str = "A", b_name: str = "B",
                        questions: str = "same", threshold_metric: str = "f1", threshold: float = 0.5,
                        unit: str = "auto", n_boot: int = N_BOOT, n_perm: int = 10000, seed: int = 0,
                        level: float = 0.95, cluster_col: str = "conversation_id") -> Comparison:
    """Paired comparison of two scored prediction frames (one row per question, ``qid`` column); ``b - a``.

    Refuses (`ComparisonError`) different dataset sha256s, different question sets unless
    ``questions='intersection'``, and a run whose every question errored. Metrics absent or all-NaN in either
    run are skipped (noted). p-values are Holm-adjusted over the table's rows (``p_perm_holm``, ``p_mcnemar_holm``).
    """
    shared = check_comparable(a, b, a_sha, b_sha, a_name, b_name, questions)
    A = a.set_index("qid").loc[shared]
    B = b.set_index("qid").loc[shared]
    for name, F in ((a_name, A), (b_name, B)):
        check_scored(F, name)
    notes = []
    if len(shared) < max(len(a), len(b)):
        notes.append(f"compared on the {len(shared)} shared questions ({a_name}: {len(a)}, {b_name}: {len(b)})")
    used = []
    for m in metrics:
        has = [m in F.columns and pd.to_numeric(F[m], errors="coerce").notna().any() for F in (A, B)]
        if all(has):
            used.append(m)
        elif any(has):  # a metric neither run has (J without a judge) is simply not compared
            notes.append(f"{m}: only {a_name if has[0] else b_name} has values, skipped")
    if not used:
        raise ComparisonError(f"no metric among {', '.join(metrics)} has a value in both {a_name} and {b_name}")
    n_clusters = int(A[cluster_col].nunique())
    unit = resolve_unit(unit, n_clusters)
    frame = A[["category", cluster_col]].copy()
    rows = []
    for name, label, g in groups_of(frame.reset_index()):
        ids = g["qid"].tolist()
        clusters = g[cluster_col].tolist() if unit == "conversation" else list(range(len(g)))
        va = A.loc[ids, used].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        vb = B.loc[ids, used].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        d = vb - va
        boot = cluster_bootstrap(d, clusters, n_boot=n_boot, seed=seed, inner=False)  # the SE behind mdd
        for i, m in enumerate(used):
            ok = ~np.isnan(d[:, i])
            di = d[ok, i]
            p_perm, lo, hi = sign_flip(di, np.asarray(clusters, dtype=object)[ok] if unit == "conversation" else None,
                                       n_perm=n_perm, seed=seed, level=level)
            p_mc, _, _ = mcnemar_exact(va[ok, i] >= threshold, vb[ok, i] >= threshold)
            rows.append({
                "run": b_name, "group": name, "label": label, "metric": m, "n": int(ok.sum()),
                "a": float(np.nanmean(va[ok, i])) if ok.any() else np.nan,
                "b": float(np.nanmean(vb[ok, i])) if ok.any() else np.nan,
                "delta": float(di.mean()) if ok.any() else np.nan, "lo": lo, "hi": hi, "p_perm": p_perm,
                "p_mcnemar": p_mc,
                "wins": int((di > 0).sum()), "losses": int((di < 0).sum()), "ties": int((di == 0).sum()),
                "mdd": MDD_FACTOR * _sd(boot[:, i]) if ok.sum() > 1 else np.nan,
            })
    table = _with_holm(pd.DataFrame(rows))
    flipped = flipped_questions(A, B, threshold_metric, threshold, a_name, b_name).assign(run=b_name)
    return Comparison(baseline=a_name, runs=[b_name], table=table, flipped=flipped, unit=unit, clusters=n_clusters,
                      threshold_metric=threshold_metric, threshold=threshold, notes=notes)


def _with_holm(table: pd.DataFrame) -> pd.DataFrame:
    """``p_perm_holm`` / ``p_mcnemar_holm`` after their raw columns: Holm over every row of the table."""
    out = table.copy()
    for col in ("p_perm", "p_mcnemar"):
        if col not in out.columns:
            continue
        adj = holm(out[col].to_numpy(dtype=float))
        if f"{col}_holm" in out.columns:
            out[f"{col}_holm"] = adj
        else:
            out.insert(out.columns.get_loc(col) + 1, f"{col}_holm", adj)
    return out


def flipped_questions(A: pd.DataFrame, B: pd.DataFrame, metric: str = "f1", threshold: float = 0.5,
                      a_name: str = "A", b_name: str = "B") -> pd.DataFrame:
    """Questions (indexed by qid in both frames) correct in one run and not the other, with both predictions."""
    if metric not in A.columns or metric not in B.columns:
        return pd.DataFrame()
    ca = pd.to_numeric(A[metric], errors="coerce") >= threshold
    cb = pd.to_numeric(B[metric], errors="coerce") >= threshold
    flip = ca != cb
    cols = [c for c in ("category", "conversation_id", "question", "answer") if c in A.columns]
    out = A.loc[flip, cols].copy()
    out["prediction_a"] = A.loc[flip, "prediction"] if "prediction" in A.columns else None
    out["prediction_b"] = B.loc[flip, "prediction"] if "prediction" in B.columns else None
    out[f"{metric}_a"] = pd.to_numeric(A.loc[flip, metric], errors="coerce")
    out[f"{metric}_b"] = pd.to_numeric(B.loc[flip, metric], errors="coerce")
    out["direction"] = np.where(cb[flip], f"fixed by {b_name}", f"broken by {b_name}")
    return out.reset_index()


def compare_grid(baseline: pd.DataFrame, others: Mapping[str, pd.DataFrame], shas: Mapping[str, str | None],
                 baseline_name: str = "baseline", **kw: object) -> Comparison:
    """Every run against the baseline, in the order given: one `Comparison` whose Holm columns are adjusted over
    its whole table (every run x group x metric)."""
    comps = [compare_predictions(baseline, frame, a_sha=shas.get(baseline_name), b_sha=shas.get(name),
                                 a_name=baseline_name, b_name=name, **kw)  # type: ignore[arg-type]
             for name, frame in others.items()]
    if not comps:
        raise ValueError("compare_grid: no run to compare with the baseline")
    first = comps[0]
    return Comparison(baseline=baseline_name, runs=[r for c in comps for r in c.runs],
                      table=_with_holm(pd.concat([c.table for c in comps], ignore_index=True)),
                      flipped=pd.concat([c.flipped for c in comps], ignore_index=True),
                      unit=first.unit, clusters=first.clusters, threshold_metric=first.threshold_metric,
                      threshold=first.threshold, notes=[f"{c.runs[0]}: {n}" for c in comps for n in c.notes])


def format_p(p: object) -> str:
    return "n/a" if p is None or pd.isna(p) else (f"{p:.2g}" if float(p) < 0.001 else f"{float(p):.3f}")


def format_comparison(cmp: Comparison, digits: int = 3) -> str:
    """The comparison as text: who is A and B, the table with a signed ``run - A`` column, and the legend."""
    t = cmp.table.copy()
    for c in [c for c in t.columns if c.startswith("p_")]:
        t[c] = t[c].map(format_p)
    single = len(cmp.runs) == 1
    delta = "B \u2212 A" if single else "run \u2212 A"
    t = t.rename(columns={"a": "A", "b": "B" if single else "run", "delta": delta})
    if single:
        t = t.drop(columns=["run"])
    head = [f"A (baseline) = {cmp.baseline}; " + (f"B = {cmp.runs[0]}; every delta is B \u2212 A"
                                                  if single else "every delta is run \u2212 A")
            + " (positive: higher than A)."]
    body = t.to_string(index=False, float_format=lambda x: f"{x:.{digits}f}")
    notes = [f"note: {n}" for n in cmp.notes]
    return "\n".join(head + [body, ""] + cmp.legend() + notes)


# ------------------------------------------------------------------------------ judge
def judge_repeat_sd(frame: pd.DataFrame, repeats_col: str = "j_repeats",
                    category_col: str = "category") -> pd.DataFrame:
    """Per group: ``j_sd`` (SD across judge repeats of the group's mean J) and ``j_repeats`` (how many)."""
    rows = {}
    for name, _, g in groups_of(frame, category_col):
        reps = [r for r in g[repeats_col] if isinstance(r, (list, tuple)) and len(r)]
        k = max((len(r) for r in reps), default=0)
        if k == 0:
            rows[name] = {"j_sd": np.nan, "j_repeats": 0}
            continue
        mat = np.full((len(reps), k), np.nan)
        for i, r in enumerate(reps):
            mat[i, : len(r)] = [np.nan if v is None else float(v) for v in r]
        per_repeat = np.nanmean(mat, axis=0)
        rows[name] = {"j_sd": float(np.std(per_repeat, ddof=1)) if k > 1 else np.nan, "j_repeats": k}
    return pd.DataFrame.from_dict(rows, orient="index")


def judge_disagreements(frame: pd.DataFrame, f1_high: float = 0.5, f1_low: float = 0.2) -> pd.DataFrame:
    """Questions where F1 and J disagree: F1 >= ``f1_high`` but J = 0, or F1 < ``f1_low`` but J = 1.

    J here is the question's mean over judge repeats; 0 and 1 mean every repeat agreed.
    """
    if "j" not in frame.columns:
        raise KeyError("judge_disagreements: no 'j' column (the run had no judge)")
    f1 = pd.to_numeric(frame["f1"], errors="coerce")
    j = pd.to_numeric(frame["j"], errors="coerce")
    hi_no = (f1 >= f1_high) & (j == 0)
    lo_yes = (f1 < f1_low) & (j == 1)
    cols = [c for c in ("qid", "category", "question", "answer", "prediction", "f1", "j") if c in frame.columns]
    out = frame.loc[hi_no | lo_yes, cols].copy()
    out["kind"] = np.where(hi_no[hi_no | lo_yes], f"F1 >= {f1_high}, J = 0", f"F1 < {f1_low}, J = 1")
    return out.reset_index(drop=True)
