"""Each model arm against one OpenAI-compatible endpoint, on a fixed small LoCoMo subset, next to the offline arm.

    python benchmarks/local_model.py --api-base http://127.0.0.1:8000/v1 --model openai/local
    python benchmarks/local_model.py --scripted        # the scripted server imitating llama-cpp-python

The subset: ``--per-category`` questions of each of the five categories of one conversation
(default conv-26, 2 each = 10), evenly spaced through that category's questions in the file, so
all five categories are covered (the first N questions of conv-26 cover only categories 1-3).
Memories come from the model-free ``turns`` extractor (``--extractor llm`` uses the model), so
the arms differ only in how they read. Prints, per arm: n, errors, F1 over the scored questions,
tokens/QA, calls/QA, p50/p95 latency and malformed tool calls; each arm's run folder holds the
per-question rows. ``--scripted`` shows that the script works; its numbers are not a model's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ARMS = ("extractive", "long-context", "original", "optimized")


def subset(path: Path, conversation: str, per_category: int, out: Path) -> pd.DataFrame:
    """Write a LoCoMo file with ``per_category`` questions of each category (evenly spaced); return them."""
    samples = json.loads(path.read_text(encoding="utf-8"))
    sample = next((s for s in samples if s["sample_id"] == conversation), None)
    if sample is None:
        raise SystemExit(f"{path}: no conversation {conversation!r}; have {[s['sample_id'] for s in samples]}")
    keep = []
    for cat in (1, 2, 3, 4, 5):
        qs = [i for i, q in enumerate(sample["qa"]) if q.get("category") == cat]
        if not qs:
            raise SystemExit(f"{conversation}: no question of category {cat}")
        picks = sorted({qs[int(round(x))] for x in np.linspace(0, len(qs) - 1, min(per_category, len(qs)))})
        keep += picks
    keep.sort()
    sample = dict(sample, qa=[sample["qa"][i] for i in keep])
    out.write_text(json.dumps([sample]), encoding="utf-8")
    return pd.DataFrame([{"q_index": i, "category": sample["qa"][j]["category"]} for j, i in enumerate(keep)])


def scripted_model(body: dict):
    """A model-shaped script (reads its prompt): extraction adds each message; the agent searches once."""
    from memlab.testing import Reply

    msgs = body["messages"]
    system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else ""
    tools = {t["function"]["name"] for t in body.get("tools", [])}
    if "add_memory" in tools:
        found = re.findall(r"^\[(D\d+:\d+)\] \((\d{4}-\d{2}-\d{2})\) ([^:]+): (.*)$", system, re.M)
        return Reply(tool_calls=[{"name": "add_memory", "arguments": {
            "memory": f"{spk} said: {txt}", "kind": "episode", "event_time": day, "source_ids": [mid]}}
            for mid, day, spk, txt in found], prompt_tokens=len(system) // 4, completion_tokens=20)
    if "memory_search" in tools:
        if not any(m["role"] == "tool" for m in msgs) and body.get("tool_choice") != "none":
            return Reply(tool_calls=[{"name": "memory_search", "arguments": {"query": msgs[-1]["content"]}}],
                         prompt_tokens=len(system) // 4, completion_tokens=15)
        results = [json.loads(m["content"]).get("results", []) for m in msgs if m["role"] == "tool"]
        first = next((r[0]["text"] for r in results if r), "Not mentioned in the conversation.")
        return Reply(text=first[:80], prompt_tokens=len(json.dumps(msgs)) // 4, completion_tokens=10)
    lines = re.findall(r"^- (?:\[[^\]]*\] )?(.+)$", system, re.M) or re.findall(r"^[A-Z]\w+: (.+)$", system, re.M)
    return Reply(text=(lines[0] if lines else "Not mentioned in the conversation.")[:80],
                 prompt_tokens=len(system) // 4, completion_tokens=8)


def row(arm: str, pred: pd.DataFrame, info: dict) -> dict:
    ok = pred[pred["error"].isna()]
    n = len(pred)
    lat = ok["latency_s"] if len(ok) else pd.Series([np.nan])
    return {"arm": arm, "n": n, "errors": int(pred["error"].notna().sum()),
            "f1": round(float(ok["f1"].mean()), 3) if len(ok) else float("nan"),
            "f1_se": round(float(ok["f1"].std(ddof=1) / np.sqrt(len(ok))), 3) if len(ok) > 1 else float("nan"),
            "tokens/QA": round(float((pred["prompt_tokens"] + pred["completion_tokens"]).sum() / n), 1),
            "calls/QA": round(float(pred["calls"].sum() / n), 2),
            "p50_s": round(float(lat.quantile(0.5)), 3), "p95_s": round(float(lat.quantile(0.95)), 3),
            "malformed_tool_calls": int(pred["malformed_tool_calls"].sum()),
            "first_error": next(iter(pred["error"].dropna()), "")[:90]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api-base", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="openai/local", help="litellm model name (default openai/local)")
    ap.add_argument("--scripted", action="store_true", help="run against the scripted llama-cpp-python imitation")
    ap.add_argument("--path", default=None, help="LoCoMo file (default: MEMLAB_LOCOMO / the shared copy)")
    ap.add_argument("--conversation", default="conv-26")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS[1:]), help="model arms (the offline arm always runs)")
    ap.add_argument("--extractor", default="turns", choices=("turns", "llm"))
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--context-window", type=int, default=None)
    ap.add_argument("--results", default=None, help="results root (default: a temporary folder)")
    a = ap.parse_args(argv)
    if not a.api_base and not a.scripted:
        ap.error("give --api-base (a running server) or --scripted")
    from memlab.data import resolve_locomo_path
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.testing import ScriptedServer

    arms = [x for x in a.arms.split(",") if x]
    bad = [x for x in arms if x not in ARMS[1:]]
    if bad:
        ap.error(f"--arms: unknown {bad}; allowed: {', '.join(ARMS[1:])}")
    root = Path(a.results or tempfile.mkdtemp(prefix="memlab-local-"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / f"subset-{a.conversation}.json"
    picked = subset(Path(resolve_locomo_path(a.path)), a.conversation, a.per_category, data)
    srv = ScriptedServer.imitating("llama-cpp-python", responder=scripted_model).start() if a.scripted else None
    api_base = srv.api_base if srv else a.api_base
    per_cat = picked.category.value_counts().sort_index().to_dict()
    print(f"endpoint {api_base} ({'scripted llama-cpp-python imitation, not a model' if srv else a.model}); "
          f"{len(picked)} questions of {a.conversation}, per category {per_cat}")
    rows = []
    try:
        for arm in ["extractive", *arms]:
            doc = {"name": f"local-{arm}", "dataset": {"path": str(data)},
                   "extraction": {"name": a.extractor, **({"model": a.model} if a.extractor == "llm" else {})},
                   "answer": {"name": arm, **({"model": a.model} if arm != "extractive" else {})},
                   "models": {"api_base": api_base, "timeout": a.timeout, "context_window": a.context_window},
                   "run": {"max_error_rate": 1.0}}
            run = run_experiment(ExperimentConfig.from_dict(doc), results=root, progress=False)
            rows.append(row(arm if arm != "extractive" else "extractive (offline)", run.predictions, run.info))
    finally:
        if srv is not None:
            srv.stop()
    table = pd.DataFrame(rows).set_index("arm")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 90):
        print(table.to_string())
    print(f"runs under {root}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
