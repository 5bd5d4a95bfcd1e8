"""A run's batched question encode (`Answerer.prepare`) against one encode per question: same answers, less time.

Runs a config with the learned reader (`answer.params.scorer=learned`) twice in one process, each time with the
questions' minilm vectors neither read from nor written to the machine cache (so each run encodes every
question itself): first as every executor runs it (`memlab.run.answering.answer_batch` prepares each
conversation's questions in one pass), then with ``prepare`` switched off (each question encoded alone as it is
read). Prints how many predictions differ (and each one that does) and both runs' answering wall time.

    python benchmarks/reader_prepare.py [--config offline] [--results DIR]    # ~2 min on 2 cores, cached memories
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.semantic import shared
from memlab.run import ExperimentConfig, run_experiment


def one_run(config: str, root: Path, prepared: bool) -> tuple[pd.DataFrame, float]:
    """(predictions, answering seconds) of one run; ``prepared`` off: the reader's ``prepare`` does nothing."""
    real = ExtractiveAnswerer.prepare
    if not prepared:
        ExtractiveAnswerer.prepare = lambda self, questions: 0  # type: ignore[method-assign]
    try:
        cfg = ExperimentConfig.from_yaml(config).with_overrides({"answer.params.scorer": "learned"})
        run = run_experiment(cfg, results=root / ("prepared" if prepared else "alone"), progress=False)
    finally:
        ExtractiveAnswerer.prepare = real  # type: ignore[method-assign]
    return run.predictions, float(run.info["timings"]["answering_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="offline")
    ap.add_argument("--results", default=None, help="results root (default: a temporary folder)")
    args = ap.parse_args()
    vectors = shared()
    vectors.question_cache = False  # every question encoded by the run itself, in a batch or alone
    with tempfile.TemporaryDirectory(dir=args.results) as tmp:
        a, ta = one_run(args.config, Path(tmp), prepared=True)
        vectors.forget(a.question.tolist())  # the second run encodes its questions again, one at a time
        b, tb = one_run(args.config, Path(tmp), prepared=False)
    both = a.merge(b, on="qid", suffixes=("_prepared", "_alone")).set_index("qid")
    diff = both[both.prediction_prepared != both.prediction_alone]
    print(f"{args.config}, scorer learned, {len(both)} questions: {len(diff)} predictions differ "
          f"(prepared vs each question encoded alone); answering {ta:.1f} s wall prepared, {tb:.1f} s alone")
    for qid, r in diff.iterrows():
        print(f"  {qid}: prepared {r.prediction_prepared!r} (F1 {r.f1_prepared:.2f}), alone {r.prediction_alone!r} "
              f"(F1 {r.f1_alone:.2f})")
    print(f"({time.strftime('%Y-%m-%d %H:%M')}, 2 cores: the times are one run each, the counts exact)")


if __name__ == "__main__":
    main()
