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
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memlab.answer.extractive import ExtractiveAnswerer
from memlab.eval.bootstrap import cluster_bootstrap, percentile_ci
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
    ap.add_argument("--held-out", default=None, help="the CSV fit_reader.py --learned --held-out wrote (without "
                    "it: only the hand-weighted reader and the ceiling are computed, into --weights-csv)")
    ap.add_argument("--contexts", default="results/.cache/fit_reader/contexts-k5-10-20-40.pkl")
    ap.add_argument("--weights-csv", default=None, help="the hand-weighted reader's predictions and the ceiling "
                    "per (question, k): read when present, else computed and written here")
    ap.add_argument("--ks", type=int, nargs="+", default=[5, 10, 20, 40])
    ap.add_argument("--before", default=None, metavar="JSON:FAMILY",
                    help="a model file (or its fit summaries, benchmarks/reader_before.json) and family: its FIT's "
                    "held-out figures are shown as the learned reader before this fit")
    ap.add_argument("--title", default=None, help="a heading printed above the table")
    ap.add_argument("--compare", nargs=2, metavar=("A_CSV", "B_CSV"), default=None,
                    help="two held-out CSVs of the same questions: paired F1 difference B - A [95%% CI] per group")
    ap.add_argument("--importances", default=None, metavar="JSON:FAMILY",
                    help="print the family's fitted importances (model file) instead of a table")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.importances:
        return importances(*args.importances.rsplit(":", 1))
    for p in [args.contexts] + ([args.held_out] if args.held_out else []):
        if not Path(p).is_file():
            sys.exit(f"{p}: not found")
    if args.weights_csv and Path(args.weights_csv).is_file():
        weights = pd.read_csv(args.weights_csv, keep_default_na=False)
    else:
        weights = weights_frame(args.contexts, args.ks)
        if args.weights_csv:
            weights.to_csv(args.weights_csv, index=False)
    if args.held_out:
        before = load_before(args.before) if args.before else None
        if args.title:
            print(f"{args.title}\n")
        table(pd.read_csv(args.held_out, keep_default_na=False), weights, before)


def load_before(spec: str) -> dict[str, Any]:
    """The held-out summaries of an earlier fit (``PATH:FAMILY``): a model file's ``families[FAMILY].fit`` or a
    summaries file's ``FAMILY`` entry (`benchmarks/reader_before.json`)."""
    path, _, family = spec.rpartition(":")
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    fit = data["families"][family]["fit"] if "families" in data else data[family]
    if "held_out" not in fit:
        sys.exit(f"{path}: family {family!r} has no held_out figures")
    return fit


def importances(path: str, family: str) -> None:
    """A fitted family's importances: the sentence forest's permutation importances (its FIT), the span
    forest's share of splits per feature (read from its trees), the abstain rule's coefficients."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))["families"][family]
    imp = spec["fit"].get("importances", {})
    print("Sentence forest, permutation importance (drop in the mean official F1 of each group's best-scored "
          "sentence when the feature is shuffled; in-sample, so it ranks features):\n")
    print("| feature | importance |\n|---|---|")
    for name, v in imp.items():
        if abs(v) >= 0.001:
            print(f"| {name} | {v:+.4f} |")
    small = [n for n, v in imp.items() if abs(v) < 0.001]
    print(f"\n|importance| < 0.001: {', '.join(small) or 'none'}.\n")
    forest = spec["span"]
    counts = np.zeros(len(forest["features"]))
    for t in forest["trees"]:
        for f, leaf in zip(t["feature"], t["leaf"]):
            if not leaf:
                counts[f] += 1
    share = counts / max(counts.sum(), 1)
    top = np.argsort(-share)[:15]
    print(f"Span forest ({len(forest['trees'])} trees), share of splits per feature (top 15): "
          + ", ".join(f"{forest['features'][i]} {share[i]:.3f}" for i in top if share[i] > 0) + ".\n")
    a = spec["abstain"]
    print(f"Abstain rule (logistic, threshold {a['threshold']}): "
          + ", ".join(f"{n} {c:+.2f}" for n, c in zip(a["features"], a["coef"]) if abs(c) >= 0.05) + ".")


def compare(a_csv: str, b_csv: str) -> None:
    """Paired held-out comparison: per category and overall, mean F1 of A and B and B - A with its 95% interval
    (clustered bootstrap over conversations, then questions; the same draws for both)."""
    a = pd.read_csv(a_csv, keep_default_na=False)
    b = pd.read_csv(b_csv, keep_default_na=False)
    shared = set(a.k) & set(b.k)  # e.g. a four-k fit against a k = 10 one: the k's both hold
    a, b = a[a.k.isin(shared)], b[b.k.isin(shared)]
    m = a.merge(b, on=["qid", "k", "conversation_id", "category"], suffixes=("_a", "_b"))
    if len(m) != len(a) or len(m) != len(b):
        sys.exit(f"{a_csv} and {b_csv} do not hold the same (question, k) rows ({len(a)}, {len(b)}, {len(m)} shared)")
    print(f"A = {a_csv}\nB = {b_csv}")
    print("| k | group | n | A F1 | B F1 | B - A [95% CI] |\n|---|---|---|---|---|---|")
    for k, g in m.groupby("k"):
        parts = [(str(c), g[g.category == c]) for c in sorted(g.category.unique())]
        parts += [("overall 1-4", g[g.category != 5]), ("overall 1-5", g)]
        for name, part in parts:
            d = (part.f1_b - part.f1_a).to_numpy()
            lo, hi = percentile_ci(cluster_bootstrap(d, part.conversation_id.tolist()))
            print(f"| {k} | {name} | {len(part)} | {part.f1_a.mean():.3f} | {part.f1_b.mean():.3f} | "
                  f"{d.mean():+.3f} [{float(np.ravel(lo)[0]):+.3f}, {float(np.ravel(hi)[0]):+.3f}] |")


def weights_frame(contexts: str, ks: list[int]) -> pd.DataFrame:
    """The hand-weighted reader's prediction, its F1 and the answer ceiling of every captured (question, k)."""
    with open(contexts, "rb") as f:
        store = pickle.load(f)
    reader = ExtractiveAnswerer(scorer="weights")
    rows = []
    for q in store:
        cat = int(q["category"])
        for k in ks:
            ctx = q["contexts"][k]
            pred, _, _ = reader.choose(reader.read(q["question"], ctx, q["speakers"]), k)
            ceil = answer_ceiling(q["answer"], cat, context_lines([e for _, e in ctx])) if cat != 5 else float("nan")
            rows.append({"qid": q["qid"], "conversation_id": q["conversation_id"], "category": cat, "k": k,
                         "f1": score_answer(pred, q["answer"], cat), "prediction": pred, "ceiling": ceil})
    return pd.DataFrame(rows)


def table(learned: pd.DataFrame, weights: pd.DataFrame, before: dict[str, Any] | None = None) -> None:
    """The markdown table: per k and category, the learned reader (held out), the learned reader before (its
    earlier FIT, held out, when ``before``), the hand weights, the ceiling; then the predictions changed."""
    weights = weights.assign(ceiling=pd.to_numeric(weights.ceiling, errors="coerce"))
    old = before["held_out"] if before else {}
    head = "| k | category | learned F1 (held out) |" + (" learned before (held out) |" if before else "")
    print(head + " hand weights F1 | ceiling | n |")
    print("|---" * (6 + bool(before)) + "|")
    for k in sorted(learned.k.unique()):
        sl = category_summary(learned[learned.k == k], metrics=("f1",))
        sw = category_summary(weights[weights.k == k], metrics=("f1",))
        sc = category_summary(weights[(weights.k == k) & (weights.category != 5)], metrics=("ceiling",))
        for grp in GROUPS:
            n = int(sl.loc[grp, "n"]) if "n" in sl.columns and grp in sl.index else "-"
            b = old.get(str(k), {}).get(grp)
            was = (f" {b[0]:.3f} [{b[1]:.3f}, {b[2]:.3f}] |" if b else " - |") if before else ""
            print(f"| {k} | {grp} | {cell(sl, grp, 'f1')} |{was} {cell(sw, grp, 'f1')} | "
                  f"{cell(sc, grp, 'ceiling') if grp not in ('5', 'overall 1-5') else '-'} | {n} |")
    ks = sorted(learned.k.unique())
    said = []
    for name, df in (("learned", learned), ("hand weights", weights)):
        a = df[df.k == ks[0]].set_index("qid").prediction.astype(str)
        b = df[df.k == ks[-1]].set_index("qid").prediction.astype(str)
        said.append(f"{name} {int((a != b.loc[a.index]).sum())} of {len(a)}")
    if before and f"changed_k{ks[0]}_k{ks[-1]}" in old:
        said.insert(1, f"learned before {old[f'changed_k{ks[0]}_k{ks[-1]}']} of {len(a)}")
    per_k = []
    for k in ks:
        g = learned[learned.k == k]
        ab = g.kind == "abstain" if "kind" in g.columns else pd.Series(False, index=g.index)
        per_k.append(f"k = {k} {ab[g.category != 5].mean():.3f} / {ab[g.category == 5].mean():.3f}")
    rates = ", ".join(per_k)
    moved = f"Predictions changed between k = {ks[0]} and k = {ks[-1]}: {'; '.join(said)}. " if len(ks) > 1 else ""
    print(f"\n{moved}Learned abstain rate, categories 1-4 / 5: {rates}.")


if __name__ == "__main__":
    main()
