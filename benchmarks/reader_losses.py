"""Where the offline reader loses F1: each question's answer classified against its context (issue 36).

    python benchmarks/reader_losses.py [--contexts results/.cache/fit_reader/contexts-k5-10-20-40.pkl]
        [--k 10] [--categories 4 1] [--scorer weights] [--held-out CSV] [--examples 0]

For every captured question of the categories asked (at context size ``--k``), the reader's prediction
(``--scorer``'s choice; with ``--held-out`` the predictions of that CSV, e.g. ``fit_reader.py --learned
... --held-out``) is set against what the context could have given: the *sentence ceiling* of each
candidate sentence the reader read (the best official token F1 of any contiguous span of that sentence,
crediting only spans holding a content word of the gold; a temporal candidate also its resolved date at
day, month and year grain). Classes, in this order:

- ``abstained``: the reader said "Not mentioned";
- ``not in a candidate``: no candidate sentence reaches a ceiling of 0.5 (the gold is not readable as one);
- ``at ceiling``: F1 within 0.1 of the best candidate sentence's ceiling (nothing left to gain here);
- ``right sentence, too long``: the prediction comes from a sentence that reaches 0.5 and holds every
  gold token, but adds words (the official F1 is token-level: extra words cost precision);
- ``right sentence, wrong words``: it comes from such a sentence but misses gold words;
- ``wrong sentence``: the prediction's sentence does not reach 0.5 while another does — split by where the
  first sentence reaching 0.5 (the *holder*) stands: 2-3, 4-10, deeper, in the reader's own score order
  (``--scorer``) or, for a held-out CSV (which keeps no scores), in the context's order of candidates.

The loss of a class is its summed (best candidate ceiling - F1), shown per question of the category.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.reading_features import date_grains
from memlab.eval.ceiling import gold_parts
from memlab.eval.gold_checks import best_span_f1, content_tokens
from memlab.eval.scoring import is_abstention, score_answer, stemmed_tokens

CLASSES = ("abstained", "not in a candidate", "at ceiling", "right sentence, too long", "right sentence, wrong words",
           "wrong sentence: holder 2-3", "wrong sentence: holder 4-10", "wrong sentence: holder deeper")
HOLDS = 0.5


def sentence_ceiling(c: Any, answer: str, category: int) -> float:
    """The best official F1 a span of candidate ``c``'s sentence (or its resolved date) could score."""
    toks = [stemmed_tokens(c.text)]
    parts = gold_parts(answer, category)
    best = sum(best_span_f1(stemmed_tokens(p), toks, content_tokens(p)) for p in parts) / len(parts)
    if c.kind == "temporal" and c.when is not None:
        best = max([best, *(score_answer(a, answer, category) for _, a in date_grains(c.answer, c.phrase, c.when))])
    return best


def source_of(pred: str, cands: list[Any]) -> int | None:
    """The candidate a prediction was cut from: the first whose answer is it, else whose text holds all its
    words (a window or a composed part)."""
    first = pred.split(", ")[0]
    for i, c in enumerate(cands):
        if c.answer == pred or c.answer == first:
            return i
    words = set(stemmed_tokens(first))
    for i, c in enumerate(cands):
        if words and words <= set(stemmed_tokens(c.text)):
            return i
    return None


def classify(q: dict[str, Any], k: int, reader: ExtractiveAnswerer, pred: str | None) -> dict[str, Any]:
    cat = int(q["category"])
    r = reader.read(q["question"], q["contexts"][k], q["speakers"])
    info: dict[str, Any] = {}
    if pred is None:
        pred, _, info = reader.choose(r, k)
    f1 = score_answer(pred, q["answer"], cat)
    ceil = np.array([sentence_ceiling(c, q["answer"], cat) for c in r.candidates]) if r.candidates else np.zeros(0)
    best = float(ceil.max()) if len(ceil) else 0.0
    src = info.get("chosen", source_of(pred, r.candidates))
    row = {"qid": q["qid"], "category": cat, "question": q["question"], "gold": str(q["answer"]),
           "prediction": pred, "f1": f1, "best": best, "candidates": len(r.candidates)}
    if is_abstention(pred):
        kind = "abstained"
    elif best < HOLDS:
        kind = "not in a candidate"
    elif f1 >= best - 0.1:
        kind = "at ceiling"
    elif src is not None and ceil[src] >= HOLDS:
        p, g = Counter(stemmed_tokens(pred)), Counter(stemmed_tokens(str(q["answer"])))
        kind = "right sentence, too long" if not (g - p) else "right sentence, wrong words"
        row["sentence"] = r.candidates[src].text
    else:
        if info.get("scores") is not None:
            order = np.argsort(-np.asarray(info["scores"]), kind="stable")
            pos = 1 + int(np.flatnonzero(ceil[order] >= HOLDS)[0])
        else:  # a held-out prediction: rank the holding sentence by retrieval rank among candidates
            pos = 1 + int(np.flatnonzero(ceil >= HOLDS)[0])
        kind = ("wrong sentence: holder 2-3" if pos <= 3 else "wrong sentence: holder 4-10" if pos <= 10
                else "wrong sentence: holder deeper")
        row["sentence"] = r.candidates[int(np.argmax(ceil))].text
    row["kind"] = kind
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="results/.cache/fit_reader/contexts-k5-10-20-40.pkl")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--categories", type=int, nargs="+", default=[4, 1])
    ap.add_argument("--scorer", default="weights", choices=("weights", "learned"))
    ap.add_argument("--family", default="offline")
    ap.add_argument("--held-out", default=None, help="take each prediction from this held-out CSV instead")
    ap.add_argument("--examples", type=int, default=0, help="print this many examples of each class")
    ap.add_argument("--csv", default=None, help="write every classified question here")
    args = ap.parse_args()
    if not Path(args.contexts).is_file():
        sys.exit(f"{args.contexts}: no captured contexts (run benchmarks/fit_reader.py first)")
    with open(args.contexts, "rb") as f:
        store = pickle.load(f)
    preds: dict[str, str] = {}
    if args.held_out:
        df = pd.read_csv(args.held_out, keep_default_na=False)
        df = df[df.k == args.k]
        if df.empty:
            sys.exit(f"{args.held_out}: no rows at k = {args.k}")
        preds = dict(zip(df.qid, df.prediction.astype(str)))
    reader = ExtractiveAnswerer(scorer=args.scorer, reader_family=args.family)
    rows = [classify(q, args.k, reader, preds.get(q["qid"]) if args.held_out else None)
            for q in store if int(q["category"]) in args.categories]
    out = pd.DataFrame(rows)
    if args.csv:
        out.to_csv(args.csv, index=False)
    src = args.held_out or f"scorer={args.scorer}"
    for cat in args.categories:
        d = out[out.category == cat]
        n = len(d)
        print(f"\ncategory {cat} (n {n}, k = {args.k}, {src}): F1 {d.f1.mean():.3f}, best candidate sentence ceiling "
              f"{d.best.mean():.3f}\n")
        print("| class | n | share | F1 | sentence ceiling | loss per question |\n|---|---|---|---|---|---|")
        for kind in CLASSES:
            g = d[d.kind == kind]
            if len(g):
                print(f"| {kind} | {len(g)} | {len(g) / n:.1%} | {g.f1.mean():.3f} | {g.best.mean():.3f} | "
                      f"{(g.best - g.f1).clip(lower=0).sum() / n:.3f} |")
        for kind in CLASSES if args.examples else ():
            for _, x in d[d.kind == kind].head(args.examples).iterrows():
                print(f"  [{kind}] Q: {x.question} | gold: {x.gold} | pred: {x.prediction} | "
                      f"sentence: {str(x.get('sentence', ''))[:140]}")


if __name__ == "__main__":
    main()
