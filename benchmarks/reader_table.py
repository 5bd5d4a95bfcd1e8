"""The reader's held-out table: per category and k, F1 [95% CI] of the learned reader (held out by
conversation, from ``fit_reader.py --learned ... --held-out CSV``) beside the hand-weighted reader and the
answer ceiling of the same contexts, and the predictions that change between the smallest and largest k.

    python benchmarks/reader_table.py --held-out results/.cache/fit_reader/heldout-offline.csv \\
        [--contexts results/.cache/fit_reader/contexts-k5-10-20-40.pkl]

The hand-weighted column uses the shipped weights (`memlab.answer.reader_weights`, fit on all ten
conversations, so it is not held out; its own cross-validated overall figures are in that module's FIT).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import pandas as pd

from memlab.answer.extractive import ExtractiveAnswerer
from memlab.eval.ceiling import answer_ceiling, context_lines
from memlab.eval.scoring import score_answer
from memlab.eval.summary import category_summary

GROUPS = ("1", "2", "3", "4", "5", "overall 1-4", "overall 1-5")


def cell(s: pd.DataFrame, grp: str, col: str) -> str:
    if grp not in s.index:
        return "-"
    return f"{s.loc[grp, col]:.3f} [{s.loc[grp, col + '_lo']:.3f}, {s.loc[grp, col + '_hi']:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--held-out", required=True, help="the CSV fit_reader.py --learned --held-out wrote")
    ap.add_argument("--contexts", default="results/.cache/fit_reader/contexts-k5-10-20-40.pkl")
    args = ap.parse_args()
    for p in (args.held_out, args.contexts):
        if not Path(p).is_file():
            sys.exit(f"{p}: not found")
    learned = pd.read_csv(args.held_out, keep_default_na=False)
    with open(args.contexts, "rb") as f:
        store = pickle.load(f)
    reader = ExtractiveAnswerer(scorer="weights")
    rows = []
    for q in store:
        cat = int(q["category"])
        for k in sorted({int(x) for x in learned.k.unique()}):
            ctx = q["contexts"][k]
            pred, _, _ = reader.choose(reader.read(q["question"], ctx, q["speakers"]), k)
            ceil = answer_ceiling(q["answer"], cat, context_lines([e for _, e in ctx])) if cat != 5 else float("nan")
            rows.append({"qid": q["qid"], "conversation_id": q["conversation_id"], "category": cat, "k": k,
                         "f1": score_answer(pred, q["answer"], cat), "prediction": pred, "ceiling": ceil})
    weights = pd.DataFrame(rows)
    print("| k | category | learned F1 (held out) | hand weights F1 | ceiling | n |")
    print("|---|---|---|---|---|---|")
    for k in sorted(learned.k.unique()):
        sl = category_summary(learned[learned.k == k], metrics=("f1",))
        sw = category_summary(weights[weights.k == k], metrics=("f1",))
        sc = category_summary(weights[(weights.k == k) & (weights.category != 5)], metrics=("ceiling",))
        for grp in GROUPS:
            n = int(sl.loc[grp, "n"]) if "n" in sl.columns and grp in sl.index else "-"
            print(f"| {k} | {grp} | {cell(sl, grp, 'f1')} | {cell(sw, grp, 'f1')} | "
                  f"{cell(sc, grp, 'ceiling') if grp not in ('5', 'overall 1-5') else '-'} | {n} |")
    ks = sorted(learned.k.unique())
    for name, df in (("learned", learned), ("hand weights", weights)):
        a = df[df.k == ks[0]].set_index("qid").prediction.astype(str)
        b = df[df.k == ks[-1]].set_index("qid").prediction.astype(str)
        print(f"{name}: predictions changed between k={ks[0]} and k={ks[-1]}: {int((a != b.loc[a.index]).sum())} "
              f"of {len(a)}")


if __name__ == "__main__":
    main()
