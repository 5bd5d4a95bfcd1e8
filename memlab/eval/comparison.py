"""Paired comparison of runs against a baseline A, question by question: the table of deltas with intervals,
p-values (raw and Holm-adjusted), wins / losses / ties and MDD, the flipped questions, and its legend
(definitions: `memlab.eval.stats`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlab.eval.bootstrap import MDD_FACTOR, N_BOOT, cluster_bootstrap, groups_of, nan_sd
from memlab.eval.significance import holm, mcnemar_exact, sign_flip

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
                "mdd": MDD_FACTOR * nan_sd(boot[:, i]) if ok.sum() > 1 else np.nan,
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

