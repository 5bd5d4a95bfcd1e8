"""What the trace-only evidence ranks cost the answering stage, measured side by side.

    python benchmarks/evidence_ranks_cost.py [--conversations conv-26 conv-30] [--repeats 3]

Runs the `offline` config on a few conversations with `memlab.answer.base.evidence_ranks` on and
off (alternating, same process, extraction cached) and prints the answering stage's time, best of
``--repeats``, per question and as a ratio. The answer latency a run reports excludes this cost
(ranks are searched after the answer).
"""

from __future__ import annotations

import argparse
import tempfile

import memlab.run.answering as answering
from memlab.run import ExperimentConfig, run_experiment


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", nargs="+", default=["conv-26", "conv-30"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.conversations": args.conversations})
    real = answering.evidence_ranks

    def off(*a, **k):
        return {"depth": 0, "evidence_memories": [], "queries": []}

    with tempfile.TemporaryDirectory() as root:
        run_experiment(cfg, results=root, progress=False)  # extraction into the cache
        times: dict[str, list[float]] = {"with ranks": [], "without": []}
        n = 0
        for _ in range(args.repeats):
            for mode, fn in (("with ranks", real), ("without", off)):
                answering.evidence_ranks = fn
                run = run_experiment(cfg, results=root, progress=False)
                times[mode].append(run.info["timings"]["answering_s"])
                n = run.info["questions"]
        answering.evidence_ranks = real
    for mode, v in times.items():
        print(f"{mode:11s}: answering {min(v):.2f} s (best of {len(v)}) for {n} questions, "
              f"{1000 * min(v) / n:.1f} ms/question")
    print(f"ratio with/without: {min(times['with ranks']) / min(times['without']):.2f}")


if __name__ == "__main__":
    main()
