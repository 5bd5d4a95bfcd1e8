"""Uncertainty for every number: clustered bootstrap CIs, paired comparisons, Holm, minimum detectable differences.

LoCoMo-10 has 10 conversations; the questions of one conversation share its memories, so they are
not independent. Every interval here therefore comes from a *two-stage clustered bootstrap*: draw
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
- `Comparison.table` (one row per group x metric): ``group`` (as above), ``label``, ``metric``, ``n``
  (shared questions with a value in both runs), ``a``, ``b`` (the two means), ``delta`` (b - a),
  ``lo``, ``hi`` (95 % paired clustered bootstrap of delta), ``p_perm`` (paired sign-flip
  permutation test), ``p_mcnemar`` (exact McNemar on correct = metric >= threshold), ``wins``
  (b > a), ``losses`` (b < a), ``ties``, ``mdd`` (``2.8 * SE`` of the paired delta).

Minimum detectable difference: at two-sided alpha = 0.05 and 80 % power a true difference is
detected when it is about (z_0.975 + z_0.80) = 1.96 + 0.84 = 2.8 standard errors away from 0; the
SE is the bootstrap SD of the mean (paired: of the mean difference; one run: sqrt(2) x its SE, the
SE of the difference of two independent runs with this run's n and variance).

Permutation test: under the null the two runs are exchangeable on each question, so the sign of
each paired difference may be flipped. ``cluster=True`` (default) flips whole conversations at once
(valid when questions of a conversation are correlated; exact enumeration of all 2^C patterns up to
C = 16 conversations, so with 10 conversations the smallest two-sided p is 2/1024);
``cluster=False`` flips each question on its own (Monte Carlo, ``n_perm`` draws, p = (1 + hits) /
(1 + n_perm)). Statistic: the mean difference; two-sided.

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
    """(mean, lo, hi) of one metric with the clustered bootstrap interval."""
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
    d = np.asarray(diffs, dtype=float)
    keep = ~np.isnan(d)
    d = d[keep]
    if len(d) == 0:
        return float("nan")
    t_obs = abs(d.sum())
    tol = 1e-9 * max(1.0, np.abs(d).sum())
    if clusters is not None:
        cl = np.asarray(pd.factorize(pd.Series(list(clusters), dtype=object))[0])[keep]
        units = np.bincount(cl, weights=d)
        units = units[np.bincount(cl) > 0]
    else:
        units = d
    if len(units) <= max_exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(units))))
        t = np.abs(signs @ units)
        return float(np.mean(t >= t_obs - tol))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_perm, 2000):
        b = min(2000, n_perm - start)
        signs = rng.choice((-1.0, 1.0), size=(b, len(units)))
        hits += int((np.abs(signs @ units) >= t_obs - tol).sum())
    return (1 + hits) / (1 + n_perm)


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
class ComparisonError(ValueError):
    """Two runs cannot be compared (different data or questions); the message says which and how."""


@dataclass
class Comparison:
    """Paired comparison of run B against run A (``delta = b - a``)."""

    a_name: str
    b_name: str
    table: pd.DataFrame
    """One row per group x metric (columns: see the module docstring)."""
    flipped: pd.DataFrame
    """Questions whose correct/incorrect status (``threshold_metric >= threshold``) differs, both predictions."""
    threshold_metric: str = "f1"
    threshold: float = 0.5
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"Comparison({self.b_name} vs {self.a_name}; correct = {self.threshold_metric} >= {self.threshold})\n"
                + format_comparison(self.table))


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


def compare_predictions(a: pd.DataFrame, b: pd.DataFrame, metrics: Sequence[str] = ("f1", "bleu1", "em", "j"),
                        a_sha: str | None = None, b_sha: str | None = None, a_name: str = "A", b_name: str = "B",
                        questions: str = "same", threshold_metric: str = "f1", threshold: float = 0.5,
                        cluster_perm: bool = True, n_boot: int = N_BOOT, n_perm: int = 10000, seed: int = 0,
                        level: float = 0.95, cluster_col: str = "conversation_id") -> Comparison:
    """Paired comparison of two scored prediction frames (one row per question, ``qid`` column).

    Refuses (`ComparisonError`) different dataset sha256s, or different question sets unless
    ``questions='intersection'``. Metrics absent or all-NaN in either run are skipped (noted).
    """
    shared = check_comparable(a, b, a_sha, b_sha, a_name, b_name, questions)
    notes = []
    if len(shared) < max(len(a), len(b)):
        notes.append(f"compared on the {len(shared)} shared questions ({a_name}: {len(a)}, {b_name}: {len(b)})")
    A = a.set_index("qid").loc[shared]
    B = b.set_index("qid").loc[shared]
    used = []
    for m in metrics:
        has = [m in F.columns and pd.to_numeric(F[m], errors="coerce").notna().any() for F in (A, B)]
        if all(has):
            used.append(m)
        elif any(has):  # a metric neither run has (J without a judge) is simply not compared
            notes.append(f"{m}: only {a_name if has[0] else b_name} has values, skipped")
    frame = A[["category", cluster_col]].copy()
    rows = []
    for name, label, g in groups_of(frame.reset_index()):
        ids = g["qid"].tolist()
        clusters = g[cluster_col].tolist()
        va = A.loc[ids, used].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        vb = B.loc[ids, used].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        d = vb - va
        boot = cluster_bootstrap(d, clusters, n_boot=n_boot, seed=seed)
        lo, hi = percentile_ci(boot, level)
        for i, m in enumerate(used):
            ok = ~np.isnan(d[:, i])
            di = d[ok, i]
            p_mc, _, _ = mcnemar_exact(va[ok, i] >= threshold, vb[ok, i] >= threshold)
            rows.append({
                "group": name, "label": label, "metric": m, "n": int(ok.sum()),
                "a": float(np.nanmean(va[ok, i])) if ok.any() else np.nan,
                "b": float(np.nanmean(vb[ok, i])) if ok.any() else np.nan,
                "delta": float(di.mean()) if ok.any() else np.nan, "lo": float(lo[i]), "hi": float(hi[i]),
                "p_perm": sign_flip_test(di, np.asarray(clusters, dtype=object)[ok] if cluster_perm else None,
                                         n_perm=n_perm, seed=seed),
                "p_mcnemar": p_mc,
                "wins": int((di > 0).sum()), "losses": int((di < 0).sum()), "ties": int((di == 0).sum()),
                "mdd": MDD_FACTOR * _sd(boot[:, i]) if ok.sum() > 1 else np.nan,
            })
    table = pd.DataFrame(rows)
    flipped = flipped_questions(A, B, threshold_metric, threshold, a_name, b_name)
    return Comparison(a_name=a_name, b_name=b_name, table=table, flipped=flipped,
                      threshold_metric=threshold_metric, threshold=threshold, notes=notes)


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
                 baseline_name: str = "baseline", **kw: object) -> tuple[pd.DataFrame, dict[str, Comparison]]:
    """Every run against the baseline; ``p_perm_holm`` / ``p_mcnemar_holm`` are Holm-adjusted over the runs
    (one family per group x metric: the k - 1 comparisons with the baseline)."""
    comps = {name: compare_predictions(baseline, frame, a_sha=shas.get(baseline_name), b_sha=shas.get(name),
                                       a_name=baseline_name, b_name=name, **kw)  # type: ignore[arg-type]
             for name, frame in others.items()}
    if not comps:
        raise ValueError("compare_grid: no run to compare with the baseline")
    table = pd.concat([c.table.assign(run=name) for name, c in comps.items()], ignore_index=True)
    for col in ("p_perm", "p_mcnemar"):
        table[f"{col}_holm"] = np.nan
        for _, idx in table.groupby(["group", "metric"], sort=False).groups.items():
            table.loc[idx, f"{col}_holm"] = holm(table.loc[idx, col].to_numpy(dtype=float))
    front = ["run", "group", "label", "metric"]
    return table[front + [c for c in table.columns if c not in front]], comps


def format_comparison(table: pd.DataFrame, digits: int = 3) -> str:
    def fmt(x: object) -> str:
        return f"{x:.{digits}f}" if isinstance(x, float) else str(x)

    t = table.copy()
    for c in [c for c in t.columns if c.startswith("p_")]:
        t[c] = t[c].map(lambda p: "nan" if pd.isna(p) else (f"{p:.2g}" if p < 0.001 else f"{p:.3f}"))
    return t.to_string(index=False, float_format=lambda x: fmt(float(x)))


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
