"""Local executor vs Ray executor on this machine, side by side in one run.

    python benchmarks/grid_scaling.py [--path locomo10.json] [--conversations 2] [--questions 20]
                                      [--latency 0.2] [--concurrency 2] [--address ADDR]

1. the offline ``topk-ablation`` grid (4 cells: top-k 5/10/20/40) on the first ``--conversations``
   conversations, ``--questions`` questions each;
2. a model-backed grid (``original`` arm, top-k 5/10) against the scripted OpenAI-compatible server on
   127.0.0.1 answering every request after ``--latency`` seconds (a remote model's round trip), with
   ``run.concurrency`` = ``--concurrency`` requests in flight per task.

Each grid runs in a fresh results root per executor (cold caches: every model call is made). Prints wall
times, the speed-up, the model calls, and whether local and Ray gave the same predictions. Ray starts a
local instance with every core of this machine (or joins ``--address``); its start-up is timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="local vs Ray executor")
    ap.add_argument("--path", default=os.environ.get("MEMLAB_LOCOMO"))
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--address")
    args = ap.parse_args(argv)

    import pandas as pd

    from memlab.data import load_locomo
    from memlab.run import ExperimentConfig
    from memlab.run.executors import run_grid
    from memlab.run.ray_cluster import connect
    from memlab.testing import Reply, ScriptedServer
    from memlab.testing.models import scripted_model as responder

    convs = [c.sample_id for c in load_locomo(args.path)][: args.conversations]
    subset = {"dataset.path": args.path, "dataset.conversations": convs, "dataset.question_limit": args.questions}
    t0 = time.perf_counter()
    ray = connect(args.address)
    ray_start = time.perf_counter() - t0
    cpus = int(ray.cluster_resources().get("CPU", 0))
    print(f"machine: {os.cpu_count()} cores; Ray: {cpus} CPU slot(s), started/joined in {ray_start:.1f} s "
          f"(not counted below); {len(convs)} conversation(s) x {args.questions} questions per cell")

    def slow(body: dict) -> Reply:
        r = responder(body)
        r.delay = args.latency
        return r

    rows = []
    with ScriptedServer(responder=slow) as srv:
        offline = ExperimentConfig.from_yaml("topk-ablation").with_overrides(subset)
        model = ExperimentConfig.from_dict({
            "name": "orig", "extraction": {"name": "turns"},
            "answer": {"name": "original", "model": "openai/scripted-reader"},
            "models": {"api_base": srv.api_base, "max_retries": 0}, "run": {"concurrency": args.concurrency},
            "grid": {"retrieval.top_k": [5, 10]}}).with_overrides(subset)
        for label, cfg in (("topk-ablation (offline)", offline),
                           (f"original, {args.latency * 1000:.0f} ms/call", model)):
            walls, preds, calls = {}, {}, {}
            for kind in ("local", "ray"):
                with tempfile.TemporaryDirectory() as tmp:
                    n0 = len(srv.requests)
                    t0 = time.perf_counter()
                    runs = run_grid(cfg, results=tmp, executor=kind, progress=False)
                    walls[kind] = time.perf_counter() - t0
                    calls[kind] = len(srv.requests) - n0
                    preds[kind] = pd.concat([r.predictions[["qid", "prediction", "f1"]] for r in runs])
            same = preds["local"].reset_index(drop=True).equals(preds["ray"].reset_index(drop=True))
            rows.append({"grid": label, "cells": len(cfg.expand()), "questions": len(preds["local"]),
                         "model calls": calls["local"], "local s": round(walls["local"], 1),
                         "ray s": round(walls["ray"], 1), "speed-up": round(walls["local"] / walls["ray"], 2),
                         "same predictions": same})
    print(pd.DataFrame(rows).to_string(index=False))
    print(json.dumps({"cpu_slots": cpus, "latency_s": args.latency, "concurrency": args.concurrency}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
