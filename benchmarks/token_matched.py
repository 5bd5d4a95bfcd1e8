"""Memory systems compared at one context budget (``retrieval.context_tokens``), from finished run folders.

    for c in offline retrieval-best mem0-offline; do
      memlab run $c --results R --set retrieval.context_tokens=500 --set retrieval.top_k=100; done
    python benchmarks/token_matched.py R/offline-* R/retrieval-best-* R/mem0-offline-* [--reference K10_RUN ...]

Per run: its top-k and budget, F1 over categories 1-4 with its 95 % clustered-bootstrap interval and n, Recall@10 and
the reader's context recall, the context tokens per question (o200k, the memories plus the question) and the
memories each reader got (mean, min, max). ``--reference`` adds rows for runs of the same configs at equal k (their
budget empty), for what the budget changed. Then the paired F1 and context-token deltas of every budget run against
the first (`memlab.compare(..., token_matched=BUDGET)`, which refuses a run made at another budget).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

import memlab
from memlab.run.labels import run_labels, run_legend
from memlab.run.report_format import markdown_table
from memlab.run.results import Run, load_run


def row(run: Run, label: str) -> dict:
    s = run.summary.copy()
    s.index = s.index.astype(str)
    o = s.loc["overall 1-4"]
    p = run.predictions
    p = p[pd.to_numeric(p.category) <= 4]
    mems = p.retrieved_ids.map(lambda x: 0 if x is None else len(x))
    r = run.config.retrieval
    return {"run": label, "top_k": r.top_k, "context_tokens": r.context_tokens if r.context_tokens else "-",
            "F1 1-4 [95 % CI]": f"{o.f1:.3f} [{o.f1_lo:.3f}, {o.f1_hi:.3f}]", "n": int(o.n),
            "R@10 1-4": f"{o['recall@10']:.3f}", "context recall 1-4": f"{o['context_recall']:.3f}",
            "context tokens/QA": f"{p.context_tokens.mean():.0f} (max {p.context_tokens.max()})",
            "memories/QA": f"{mems.mean():.1f} ({mems.min()}-{mems.max()})"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders made at one budget; the first is the baseline")
    ap.add_argument("--reference", nargs="*", default=[], help="runs of the same configs at equal k (no budget)")
    a = ap.parse_args(argv)
    runs = [load_run(d) for d in a.runs]
    budgets = {r.config.retrieval.context_tokens for r in runs}
    if len(budgets) != 1 or None in budgets:
        print(f"the runs were made at budgets {sorted(map(str, budgets))}: give runs of one retrieval.context_tokens",
              file=sys.stderr)
        return 2
    (budget,) = budgets
    every = runs + [load_run(d) for d in a.reference]
    labels = run_labels(every)  # one naming for the table, the comparison and the legend
    table = pd.DataFrame([row(r, lab) for r, lab in zip(every, labels)])
    print(f"### Systems at a {budget:,}-token context budget\n")
    print(markdown_table(table))
    print("\nRuns:\n\n" + markdown_table(run_legend(every)))
    cmp = memlab.compare(*runs, token_matched=budget, metrics=("f1",), names=labels[:len(runs)])
    t = cmp.table[(cmp.table.group == "overall 1-4")]
    deltas = pd.DataFrame({"run": t.run, "metric": t.metric, "n": t.n, "A": t.a.round(3), "B": t.b.round(3),
                           "B - A [95 % CI]": [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(t.delta, t.lo,
                                                                                                      t.hi)],
                           "p_perm (Holm)": t.p_perm_holm})
    print(f"\nPaired, overall 1-4, every delta is run - {cmp.baseline} (A):\n")
    print(markdown_table(deltas))
    for n in cmp.notes:
        print(f"\nnote: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
