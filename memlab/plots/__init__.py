"""Plots (matplotlib): each returns the `Figure` and, with ``save_to``, writes PNG and SVG there.

- `category_bars`: a metric per category, one bar per arm, with 95 % interval error bars;
- `f1_vs_tokens`: per-category F1 against Tokens/QA, one point per arm and category, Pareto fronts;
- `topk_curve`: F1 and tokens against k (a top-k ablation);
- `topk_panels`: per k, F1 beside what retrieval delivered (answer ceiling, answer-bearing, evidence recall of
  the context, context tokens), one panel per group (overall 1-4, multi-hop); `topk_measures` is its table;
- `reconcile_thresholds`: a reconcile sweep's ops, near-duplicates left, recall and F1 per update policy;
- `attribution_bars`: failure labels stacked per category and arm, as shares with their counts;
- `recall_curves`: evidence Recall@k against k per category.

One module per kind of plot: `memlab.plots.quality` (category bars, F1 against tokens, recall curves),
`memlab.plots.topk`, `memlab.plots.reconcile`, `memlab.plots.failures`; what they share (colours, intervals,
saving) is `memlab.plots.style`.

Conventions every plot keeps: error bars from the ``<metric>_lo`` / ``<metric>_hi`` interval columns (taken
from the summary, or bootstrapped from a `Run`'s per-question scores, `memlab.run.report.ci_frame`);
category labels carry their number and n (``1 multi-hop (n=282)``); quality axes start at 0; a legend names
each arm's marker; no text is drawn next to points (labels would overlap); Tokens/QA of an arm that sends no
prompt is its context tokens, and the axis says so.
"""

from memlab.attribution import LABELS
from memlab.plots.failures import attribution_bars
from memlab.plots.quality import category_bars, f1_vs_tokens, pareto_front, recall_curves
from memlab.plots.reconcile import reconcile_thresholds
from memlab.plots.style import (
    ARM_COLORS,
    CATEGORY_COLORS,
    CONTEXT_AXIS,
    HATCHES,
    LABEL_COLORS,
    MARKERS,
    TOKENS_AXIS,
    interval,
    sends_prompt,
    tokens_per_qa,
)
from memlab.plots.topk import TOPK_MEASURES, topk_curve, topk_measures, topk_panels

__all__ = ["ARM_COLORS", "CATEGORY_COLORS", "CONTEXT_AXIS", "HATCHES", "LABELS", "LABEL_COLORS", "MARKERS",
           "TOKENS_AXIS", "TOPK_MEASURES", "attribution_bars", "category_bars", "f1_vs_tokens", "interval",
           "pareto_front", "recall_curves", "reconcile_thresholds", "sends_prompt", "tokens_per_qa", "topk_curve",
           "topk_measures", "topk_panels"]
