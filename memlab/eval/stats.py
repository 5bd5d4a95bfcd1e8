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

Where each part lives: `memlab.eval.bootstrap` (one run's intervals and MDD), `memlab.eval.significance`
(sign-flip, McNemar, Holm), `memlab.eval.comparison` (`Comparison`, `compare_predictions`, `compare_grid`); this
module holds the definitions above, the judge's own statistics, and every public name of the three.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from memlab.eval.bootstrap import (
    MDD_FACTOR,
    N_BOOT,
    OVERALL_GROUPS,
    ci_columns,
    cluster_bootstrap,
    groups_of,
    naive_bootstrap,
    percentile_ci,
)
from memlab.eval.comparison import (
    MIN_CLUSTERS,
    UNITS,
    Comparison,
    ComparisonError,
    check_comparable,
    check_scored,
    compare_grid,
    compare_predictions,
    comparison_legend,
    flipped_questions,
    format_comparison,
    format_p,
    resolve_unit,
)
from memlab.eval.significance import holm, mcnemar_exact, mcnemar_from_counts, sign_flip, sign_flip_test

__all__ = ["MDD_FACTOR", "MIN_CLUSTERS", "N_BOOT", "OVERALL_GROUPS", "UNITS", "Comparison", "ComparisonError",
           "check_comparable", "check_scored", "ci_columns", "cluster_bootstrap", "compare_grid", "compare_predictions",
           "comparison_legend", "flipped_questions", "format_comparison", "format_p", "groups_of", "holm",
           "judge_disagreements", "judge_repeat_sd", "mcnemar_exact", "mcnemar_from_counts", "naive_bootstrap",
           "percentile_ci", "resolve_unit", "sign_flip", "sign_flip_test"]


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
