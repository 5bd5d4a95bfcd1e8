"""CPU cost per question of the offline reader on top of search: hand weights vs the learned scorer.

    python benchmarks/reader_cost.py [--cache results/.cache/fit_reader] [--ks 10 40] [--n 300] [--family offline]

Reads the contexts ``benchmarks/fit_reader.py`` captured (no retrieval is timed: this is the reader's own
cost) and times ``read`` + ``choose`` per question with `time.process_time`, the two scorers alternating
question by question in one process so machine load falls on both alike (the ratio is the robust figure).
The first pass over the sample warms the per-text caches both readers share and is not counted; the questions'
minilm vectors (a family reading `memlab.answer.semantic`) are dropped from the process before the timed pass, so
each timed question pays its one encode, as a new question does (``--question encode``; ``cached``: it is read
back from the machine cache, as after a search that embedded it with minilm; ``batch``: as in a run, each
conversation's questions — all of them, not only the sampled — are encoded in one pass by the reader's
``prepare``, as `memlab.run.answering.answer_batch` does, and that pass's CPU time is shared equally among them);
its memories' sentence vectors are cached by text.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np

from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.semantic import shared


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default="results/.cache/fit_reader")
    ap.add_argument("--contexts", default="contexts-k5-10-20-40.pkl", help="a capture file under --cache")
    ap.add_argument("--ks", type=int, nargs="+", default=[10, 40])
    ap.add_argument("--n", type=int, default=300, help="questions sampled (every n-th of the capture)")
    ap.add_argument("--family", default="offline")
    ap.add_argument("--question", choices=("encode", "cached", "batch"), default="encode",
                    help="a family reading minilm similarity: each timed question is encoded alone (a search that "
                    "did not embed it, as offline's), read back from the machine cache (a dense search wrote it "
                    "there), or encoded with its conversation's questions in one pass (a run's prepare)")
    args = ap.parse_args()
    shared().question_cache = args.question == "cached"
    path = Path(args.cache) / args.contexts
    if not path.is_file():
        sys.exit(f"{path}: no captured contexts (run benchmarks/fit_reader.py first)")
    with open(path, "rb") as f:
        store = pickle.load(f)
    sample = store[:: max(1, len(store) // args.n)][: args.n]
    readers = {"weights": ExtractiveAnswerer(scorer="weights"),
               "learned": ExtractiveAnswerer(scorer="learned", reader_family=args.family)}
    for k in args.ks:
        times: dict[str, list[float]] = {n: [] for n in readers}
        for rep in range(2):
            shared().forget([q["question"] for q in store])
            share = {n: prepared(reader, store) if args.question == "batch" else {} for n, reader in readers.items()}
            for q in sample:
                for name, reader in readers.items():
                    t = time.process_time()
                    r = reader.read(q["question"], q["contexts"][k], q["speakers"])
                    reader.choose(r, k)
                    if rep:
                        times[name].append(time.process_time() - t + share[name].get(q["conversation_id"], 0.0))
        w, lrn = (np.array(times[n]) * 1e3 for n in ("weights", "learned"))
        print(f"k={k}: n={len(w)} questions; CPU ms per question (mean, median, p95): "
              f"weights {w.mean():.2f} / {np.median(w):.2f} / {np.percentile(w, 95):.2f}; "
              f"learned {lrn.mean():.2f} / {np.median(lrn):.2f} / {np.percentile(lrn, 95):.2f}; "
              f"learned on top of weights {lrn.mean() - w.mean():+.2f} ms (ratio {lrn.mean() / w.mean():.2f})",
              flush=True)
    print(f"({time.strftime('%Y-%m-%d %H:%M')}, shared machine: timings are noisy, read the ratio)")


def prepared(reader: ExtractiveAnswerer, store: list[dict]) -> dict[str, float]:
    """Per conversation: the CPU seconds per question of the reader's one ``prepare`` pass over all its questions,
    as a run makes it."""
    by_conv: dict[str, list[str]] = {}
    for q in store:
        by_conv.setdefault(q["conversation_id"], []).append(q["question"])
    out = {}
    for conv, qs in by_conv.items():
        t = time.process_time()
        reader.prepare(qs)
        out[conv] = (time.process_time() - t) / len(qs)
    return out


if __name__ == "__main__":
    main()
