"""Full cost accounting: prices (litellm map, user table, local, unknown) and build + judge tokens per question."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from memlab.eval.cost import Models, Price, PriceTable, PriceTableError, add_dollars, amortize, cost_columns
from memlab.run import ExperimentConfig, run_experiment
from memlab.testing import Reply, ScriptedServer


def test_litellm_price_map_with_cached_discount():
    p = PriceTable().price("gpt-4o-mini")
    assert p.source == "litellm" and p.input > 0 and 0 < p.cached_input < p.input and p.output > p.input
    # 1,000 prompt tokens of which 400 cached, 100 completion tokens
    assert p.cost(1000, 100, 400) == pytest.approx(600 * p.input + 400 * p.cached_input + 100 * p.output)
    assert p.cost(1000, 100, 400) < p.cost(1000, 100, 0)
    emb = PriceTable().price("litellm:text-embedding-3-small")
    assert emb.source == "litellm" and emb.input > 0


def test_local_unknown_and_offline_models_cost_zero_and_say_why():
    t = PriceTable()
    assert t.price("gpt-4o-mini", api_base="http://127.0.0.1:8000/v1").source.startswith("local (api_base")
    assert t.price("tfidf-lsa").source.startswith("local (tfidf-lsa")
    unknown = t.price("my-own-model-xyz")
    assert unknown.cost(10_000, 1_000) == 0 and "not in litellm's price map" in unknown.source
    assert t.price(None).source == "none"


def test_user_price_tables_yaml_and_csv_override(tmp_path):
    y = tmp_path / "prices.yaml"
    y.write_text("gpt-4o-mini: {input: 1.0, output: 2.0, cached_input: 0.5}\nlocal-llama: {input: 0.1}\n")
    t = PriceTable.from_file(y)
    p = t.price("gpt-4o-mini")
    assert (p.input, p.output, p.cached_input, p.source) == (1e-6, 2e-6, 5e-7, "user table")
    assert p.cost(1_000_000, 0, 0) == pytest.approx(1.0)
    # a user price wins even for a model on a local endpoint; cached defaults to the input price
    assert t.price("local-llama", api_base="http://x").cached_input == pytest.approx(1e-7)
    c = tmp_path / "prices.csv"
    c.write_text("model,input,output,cached_input\nopenai/x,3,6,\n")
    assert PriceTable.from_file(c).price("openai/x").cost(0, 1_000_000) == pytest.approx(6.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpt-4o-mini: {input: cheap}\n")
    with pytest.raises(PriceTableError, match="bad.yaml: gpt-4o-mini: input = 'cheap'; expected USD per million"):
        PriceTable.from_file(bad)
    c.write_text("model,input\n,3\n")
    with pytest.raises(PriceTableError, match="line 2: column 'model' is empty"):
        PriceTable.from_file(c)


def test_amortize_spreads_a_conversations_build_over_its_questions():
    pred = pd.DataFrame({"conversation_id": ["a", "a", "b"], "prompt_tokens": [10, 20, 30],
                         "completion_tokens": [1, 1, 1], "cached_tokens": [0, 0, 0]})
    build = pd.DataFrame([{"conversation": "a", "extract_prompt_tokens": 400, "extract_completion_tokens": 40,
                           "extract_cached_tokens": 100, "embed_tokens": 80},
                          {"conversation": "a", "extract_prompt_tokens": 100, "embed_tokens": 20},
                          {"conversation": "b", "embed_tokens": 9}])
    out = amortize(pred, build, {"a": 4, "b": 3})
    assert list(out.extract_prompt_tokens) == [125.0, 125.0, 0.0]  # (400 + 100) / 4 questions of "a"
    assert list(out.embed_tokens) == [25.0, 25.0, 3.0]
    cols = cost_columns(out)
    assert cols["build_tokens_qa"] == pytest.approx((125 * 2 + 10 * 2 + 25 * 2 + 3) / 3)
    assert cols["model_tokens_qa"] == pytest.approx(cols["build_tokens_qa"] + 63 / 3)
    priced, sources = add_dollars(out, Models(answer="gpt-4o-mini", embed="tfidf-lsa"),
                                  PriceTable({"gpt-4o-mini": Price(1.0, 2.0, 0.5, "user table")}))
    assert list(priced.answer_usd) == [12.0, 22.0, 32.0] and (priced.embed_usd == 0).all()
    assert sources["embed"].startswith("local") and sources["answer"] == "user table"


def _responder(body):
    tools = {t["function"]["name"] for t in body.get("tools", [])}
    if "add_memory" in tools:
        return Reply(tool_calls=[{"name": "add_memory", "arguments": {
            "memory": "Alice took a pottery class", "kind": "episode", "event_time": "2023-05-07",
            "participants": ["Alice"], "source_ids": ["D1:1"]}}], prompt_tokens=1000, completion_tokens=50,
            cached_tokens=200)
    if "grade answers" in body["messages"][0]["content"]:
        return Reply(text="CORRECT", prompt_tokens=80, completion_tokens=2)
    return Reply(text="pottery", prompt_tokens=300, completion_tokens=5, cached_tokens=100)


def test_run_reports_build_and_judge_cost_per_question(synthetic_path, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("openai/reader: {input: 1.0, output: 2.0, cached_input: 0.25}\n"
                      "openai/extractor: {input: 4.0, output: 8.0, cached_input: 1.0}\n")
    with ScriptedServer(responder=_responder) as srv:
        cfg = ExperimentConfig.from_dict({
            "name": "cost", "dataset": {"path": str(synthetic_path), "conversations": ["syn-1"]},
            "extraction": {"name": "llm", "model": "openai/extractor"},
            "answer": {"name": "original", "model": "openai/reader"}, "judge": {"model": "openai/judge"},
            "models": {"api_base": srv.api_base, "max_retries": 0}, "cost": {"prices": str(prices)}})
        run = run_experiment(cfg, results=tmp_path, progress=False)
    jobs = sum(1 for r in srv.requests if r.get("tools") and any(
        t["function"]["name"] == "add_memory" for t in r["tools"]))
    assert jobs == 2  # syn-1 has two sessions with turns
    build = [json.loads(x) for x in open(run.run_dir / "traces" / "build_cost.jsonl")]
    assert sum(b["extract_prompt_tokens"] for b in build) == 2000 and sum(b["extract_calls"] for b in build) == 2
    assert sum(b["embed_tokens"] for b in build) > 0  # written memories, reconcile queries, old-memory lookups
    s = run.summary.loc["overall 1-5"]
    n = 5  # questions of syn-1: the build is spread over them
    assert s["extract_tokens_qa"] == pytest.approx(2 * 1050 / n)
    assert s["extract_cached_tokens_qa"] == pytest.approx(2 * 200 / n)
    assert s["judge_tokens_qa"] == 82 and s["answer_tokens_qa"] == 305
    assert s["model_tokens_qa"] == pytest.approx(305 + 82 + 2 * 1050 / n + s["embedding_tokens_qa"])
    # dollars: the user table prices the reader and the extractor (with the cache discount); the judge
    # and the embedder are on the local endpoint / unknown: 0, and run.json says so
    answer_usd = (200 * 1.0 + 100 * 0.25 + 5 * 2.0) / 1e6
    extract_usd = 2 * (800 * 4.0 + 200 * 1.0 + 50 * 8.0) / 1e6 / n
    assert s["answer_usd_qa"] == pytest.approx(answer_usd) and s["build_usd_qa"] == pytest.approx(extract_usd)
    assert s["judge_usd_qa"] == 0 and s["total_usd_qa"] == pytest.approx(answer_usd + extract_usd)
    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["cost"]["prices"]["judge"].startswith("local (api_base")
    assert info["cost"]["prices"]["answer"] == "user table" and info["cost"]["build"]["extract_calls"] == 2


def test_offline_run_counts_build_embeddings_at_zero_dollars(synthetic_path, tmp_path):
    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(synthetic_path)})
    run = run_experiment(cfg, results=tmp_path, progress=False)
    s = run.summary.loc["overall 1-5"]
    assert s["extract_tokens_qa"] == 0 and s["embedding_tokens_qa"] > 0 and s["total_usd_qa"] == 0
    assert s["model_tokens_qa"] == pytest.approx(s["embedding_tokens_qa"])
    sr = run_experiment(ExperimentConfig.from_yaml("session-recall").with_overrides(
        {"dataset.path": str(synthetic_path)}), results=tmp_path, progress=False)
    rows = [json.loads(x) for x in open(sr.run_dir / "traces" / "build_cost.jsonl")]
    assert {r["conversation"]: r["embed_texts"] for r in rows} == {"syn-1": 5, "syn-2": 2}  # every turn indexed
    assert sr.summary.loc["overall 1-5", "embedding_tokens_qa"] > 0


def test_cached_extraction_keeps_its_build_cost_and_a_missing_record_is_unknown_not_zero(synthetic_path, tmp_path):
    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(synthetic_path)})
    first = run_experiment(cfg, results=tmp_path, progress=False)
    again = run_experiment(cfg, results=tmp_path, progress=False)
    assert again.info["extraction"]["from_cache"]
    e1, e2 = (r.summary.loc["overall 1-5", "embedding_tokens_qa"] for r in (first, again))
    assert e1 > 0 and e2 == pytest.approx(e1)  # the cache's build record, not a second (zero) build
    _forget_build_costs(Path(first.info["extraction"]["cache_dir"]))  # a cache made before they were recorded
    stale = run_experiment(cfg, results=tmp_path, progress=False)
    s = stale.summary.loc["overall 1-5"]
    assert pd.isna(s["embedding_tokens_qa"]) and pd.isna(s["model_tokens_qa"]) and pd.isna(s["total_usd_qa"])
    assert "syn-1" in stale.info["cost"]["build_unknown"]


def _forget_build_costs(cdir: Path) -> None:
    """Drop every build-cost record of an extraction cache (as an older memlab left none)."""
    from memlab.extract.pipeline import BUILD_COST
    from memlab.memory import SQLiteMemoryService

    (cdir / "build_cost.jsonl").unlink(missing_ok=True)
    svc = SQLiteMemoryService(cdir / "store.db")
    try:
        for scope in ("syn-1", "syn-2"):
            state = svc.extraction_state(scope)
            if state:
                svc.save_extraction(scope, {k: v for k, v in state.items() if k != BUILD_COST}, [])
    finally:
        svc.close()


def test_build_costs_are_saved_with_the_cache_entry_they_describe(synthetic_path, tmp_path):
    """Issue 35: two identical runs started together in a fresh results root: the second found the conversations
    done (their cursors saved) before the first had logged their cost beside the store, and its build columns were
    NaN, "written before build costs were logged". The cost is saved in the cursor's transaction now."""
    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(synthetic_path)})
    first = run_experiment(cfg, results=tmp_path, progress=False)
    (Path(first.info["extraction"]["cache_dir"]) / "build_cost.jsonl").unlink(missing_ok=True)  # not appended yet
    second = run_experiment(cfg, results=tmp_path, progress=False)
    assert second.info["extraction"]["from_cache"] and "build_unknown" not in second.info["cost"]
    for col in ("embedding_tokens_qa", "build_tokens_qa"):  # before: NaN with a wrong stated cause
        want = first.summary.loc["overall 1-5", col]
        assert want > 0 and second.summary.loc["overall 1-5", col] == pytest.approx(want)
