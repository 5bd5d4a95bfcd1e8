"""Evidence Recall@k on LoCoMo-10 for dense, TF-IDF, BM25 and hybrid RRF retrieval.

    python benchmarks/retrieval_recall.py [--path locomo10.json] [--memory turns|observations|both]
        [--style speaker-date-context] [--embedder tfidf-lsa] [--ks 1,5,10,20]

Recall@k of a question = share of its evidence dialog ids among the source_ids of the top-k hits
(the LoCoMo definition); questions without usable evidence are left out. Prints one table per
memory set: rows are (mode, category), columns Recall@k, plus overall 1-4 and 1-5.
"""

from __future__ import annotations

import argparse
import sys
import time

import pandas as pd

from memlab.eval.retrieval import recall_table, run_recall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--path")
    ap.add_argument("--memory", default="both", choices=["turns", "observations", "both", "turns+observations"])
    ap.add_argument("--style", default="speaker-context")
    ap.add_argument("--embedder", default="tfidf-lsa")
    ap.add_argument("--modes", default="dense,tfidf,bm25,hybrid,hybrid-bm25")
    ap.add_argument("--ks", default="1,5,10,20")
    ap.add_argument("--rrf-k", type=int, default=60)
    ap.add_argument("--no-date", action="store_true", help="index texts without the [date] prefix")
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    sets = ["turns", "observations"] if args.memory == "both" else [args.memory]
    pd.set_option("display.width", 200)
    for mem in sets:
        t0 = time.perf_counter()
        per_q = run_recall(args.path, memory=mem, style=args.style, embedder=args.embedder,
                           modes=args.modes.split(","), ks=ks, rrf_k=args.rrf_k,
                           date_in_text=not args.no_date)
        table = recall_table(per_q, ks)
        print(f"\n=== memory set: {mem} (style {args.style}, embedder {args.embedder}), "
              f"{per_q.qid.nunique()} questions, {time.perf_counter() - t0:.1f} s ===")
        print(table.to_string(float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
