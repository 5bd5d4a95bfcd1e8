"""Every model arm against a real model: llama.cpp serving SmolLM2-135M-Instruct, on a fixed LoCoMo subset.

The subset: conv-26, every session extracted, and a fixed sample of 6 questions per category (``dataset.per_category:
6``, ``sample_seed: 0``: 30 questions). The arms, each with the same model as judge (JSON-schema verdicts):

- ``offline``: turns + LoCoMo's observations, the extractive reader (no model but the judge), the baseline;
- ``original``: the LLM extractor (``basic`` prompt) and one model answer over the top-10 memories;
- ``optimized``: the LLM extractor (``structured`` prompt) and the model's memory-tool loop (JSON steps);
- ``long-context``: the whole transcript in the prompt (conv-26 is ~16k tokens: over SmolLM2's 8,192 window);
- ``session-recall``: the sessions around the top turn hits, read by the model;
- ``mem0``: mem0 with ``infer=true`` (its own extraction prompts on the same server), the extractive reader.

An arm whose run fails (mem0's extraction prompt alone is over SmolLM2's 8,192-token window, which llama.cpp caps
at the model's training context) is a row saying why.

Every model role runs on the server with ``structured_output: json_schema`` (SmolLM2's chat template has no
tools), the default per-role ``max_tokens``, one slot. Prints, per arm: F1 and J with 95 % intervals (n), evidence
Recall@10, errors (of which cut off at max_tokens), extraction ops by kind, model calls and tokens per question,
wall time; then plan vs actual per role, and the attribution shares of the failed questions.

    python benchmarks/real_model.py [--results DIR] [--arms original,optimized] [--per-category 6]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

MODEL = "openai/local"
ARMS: dict[str, dict[str, Any]] = {
    "offline": {"extraction": {"name": "turns+observations"}, "answer": {"name": "extractive"}},
    "original": {"extraction": {"name": "llm", "prompt": "basic", "model": MODEL},
                 "answer": {"name": "original", "model": MODEL}},
    "optimized": {"extraction": {"name": "llm", "prompt": "structured", "model": MODEL},
                  "answer": {"name": "optimized", "model": MODEL}},
    "long-context": {"answer": {"name": "long-context", "model": MODEL}},
    "session-recall": {"answer": {"name": "session-recall", "model": MODEL},
                       "retrieval": {"participant_boost": True, "dedupe": False, "kind_fallback": False}},
    "mem0": {"system": {"name": "mem0", "params": {"infer": True, "model": MODEL}}, "answer": {"name": "extractive"},
             "extraction": {"model": MODEL}},
}


def config(arm: str, api_base: str, locomo: str, per_category: int) -> dict[str, Any]:
    base = {"name": f"smol-{arm}", "dataset": {"path": locomo, "conversations": ["conv-26"],
                                               "per_category": per_category, "sample_seed": 0},
            "judge": {"model": MODEL},
            "models": {"api_base": api_base, "structured_output": "json_schema", "timeout": 300},
            "run": {"allow_failed_extraction": True, "max_error_rate": 1.0}}
    for k, v in ARMS[arm].items():
        base[k] = {**base.get(k, {}), **v}
    return base


def ops_by_kind(run_dir: Path) -> str:
    p = run_dir / "traces" / "extraction.jsonl"
    if not p.is_file():
        return "-"
    kinds: collections.Counter[str] = collections.Counter()
    dropped = 0
    for line in p.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if "result" in r:
            res = str(r["result"])
            kinds[res.split(":")[0] if res.startswith("cleared") else res] += 1
        dropped += len(r.get("dropped") or [])
    out = ", ".join(f"{k} {v}" for k, v in kinds.most_common())
    return (out or "none") + (f"; dropped {dropped}" if dropped else "")


def fmt(row: Any, m: str) -> str:
    v, lo, hi = row.get(m), row.get(f"{m}_lo"), row.get(f"{m}_hi")
    if v is None or v != v:
        return "-"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]" if lo == lo and hi == hi else f"{v:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=None, help="results root (default: a temporary folder)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--per-category", type=int, default=6)
    args = ap.parse_args()
    import tempfile

    from memlab import attribution, trace
    from memlab.data import resolve_locomo_path
    from memlab.llm.serve import LocalServer
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.run.plan import plan_vs_actual, probe_throughput

    locomo = str(resolve_locomo_path(None))
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    root = Path(args.results or tempfile.mkdtemp(prefix="memlab-real-model-"))
    rows, plans, shares = [], [], []
    with LocalServer(threads=2) as srv:
        from memlab.llm import ModelClient

        pp, tg = probe_throughput(ModelClient(MODEL, api_base=srv.api_base, api_key="x", timeout=120))
        for arm in arms:
            t0 = time.perf_counter()
            try:
                run = run_experiment(ExperimentConfig.from_dict(config(arm, srv.api_base, locomo,
                                                                       args.per_category)),
                                     results=root, progress=False)
            except Exception as e:  # noqa: BLE001 - the row says why the arm could not run
                rows.append(f"| {arm} | failed after {time.perf_counter() - t0:,.0f} s: "
                            f"{' '.join(str(e).split())[:300]} |||||||||")
                continue
            wall = time.perf_counter() - t0
            s, info, pred = run.summary, run.info, run.predictions
            o5, o4 = s.loc["overall 1-5"], s.loc["overall 1-4"]
            by_role = info["models"].get("by_role", {})
            calls = sum(r["calls"] for r in by_role.values())
            ptok = sum(r["prompt_tokens"] for r in by_role.values())
            ctok = sum(r["completion_tokens"] for r in by_role.values())
            n = len(pred)
            errors = int(pred["error"].notna().sum())
            rows.append(f"| {arm} | {fmt(o4, 'f1')} | {fmt(o5, 'f1')} | {fmt(o5, 'j')} | "
                        f"{o5.get('recall@10', float('nan')):.3f} | {errors} ({info['models'].get('truncated', 0)} cut "
                        f"off) | {ops_by_kind(run.run_dir)} | {calls / n:.1f} | {ptok / n:,.0f} / {ctok / n:,.0f} | "
                        f"{wall:,.0f} |")
            for r in plan_vs_actual(info):
                plans.append(f"| {arm} | {r['role']} | {r['calls_planned']} / {r['calls']} | "
                             f"{r['prompt_tokens_planned'] or 0:,} / {r['prompt_tokens'] or 0:,} | "
                             f"≤ {r['completion_tokens_max'] or 0:,} / {r['completion_tokens'] or 0:,} | "
                             f"{r['truncated'] or 0} |")
            if arm != "offline":
                att = attribution.attribute(trace.load(run.run_dir))
                counts = att["label"].value_counts()
                shares.append(f"| {arm} | {len(att)} | " + ", ".join(
                    f"{k} {v / len(att):.0%}" for k, v in counts.items()) + " |")
    print(f"SmolLM2-135M-Instruct (Q4_1) on llama.cpp, 1 slot, 2 threads: {pp:.0f} prompt tokens/s, {tg:.1f} "
          f"generated tokens/s (throughput probe). conv-26, {args.per_category} questions per category (seed 0, n "
          f"{args.per_category * 5}); every role on the server with JSON-schema replies; 95 % intervals.\n")
    print("| arm | F1 1-4 | F1 1-5 | J 1-5 | Recall@10 | errors | extraction ops | calls/QA | prompt / completion "
          "tokens/QA | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nPlan (`memlab run --plan`, completion tokens: the max_tokens bound) vs actual, per role:\n")
    print("| arm | role | calls plan / actual | prompt tokens plan / actual | completion tokens plan / actual | "
          "cut off |")
    print("|---|---|---|---|---|---|")
    print("\n".join(plans))
    print("\nFailed questions by attribution label:\n")
    print("| arm | failed | shares |")
    print("|---|---|---|")
    print("\n".join(shares))


if __name__ == "__main__":
    main()
