"""Issue 38: ``retrieval.context_tokens`` fills the reader's context up to a token budget on any system and arm, and
``memlab compare --token-matched`` compares runs made at one budget."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from memlab.answer.base import within_budget
from memlab.cli import main
from memlab.eval.comparison import ComparisonError
from memlab.llm import count_tokens
from memlab.memory.entry import MemoryEntry, UserKey
from memlab.memory.search_types import SearchHit, SearchOptions, SearchResult
from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.run.compare import compare
from memlab.run.labels import run_labels
from tests.test_systems import Paraphraser

KEY = UserKey("app", "alice")


def _hit(i: int, text: str) -> SearchHit:
    return SearchHit(entry=MemoryEntry(id=f"m{i}", key=KEY, text=text), score=1.0 / (i + 1), rank=i + 1)


def test_hits_are_kept_in_rank_order_while_they_fit():
    texts = ["Alice went to a pottery class yesterday.", "Bob adopted a dog named Rex.", "ok", "Carol moved."]
    res = SearchResult("q", SearchOptions(), [_hit(i, t) for i, t in enumerate(texts)])
    sizes = [count_tokens(t + "\n") for t in texts]
    got, used = within_budget(res, sizes[0] + sizes[1])
    assert [h.id for h in got.hits] == ["m0", "m1"] and used == sizes[0] + sizes[1]
    got, used = within_budget(res, sizes[0] + sizes[1] - 1)  # m1 does not fit: the context ends there, m2 is not
    assert [h.id for h in got.hits] == ["m0"] and used == sizes[0]  # taken instead (rank order)
    got, used = within_budget(res, sizes[0] - 1)
    assert got.hits == [] and used == 0
    assert len(res.hits) == 4  # the search's result is not changed


@pytest.mark.parametrize("value, msg", [(0, "expected an integer >= 1"), ("many", "expected an integer"),
                                        (1.5, "expected an integer")])
def test_a_bad_budget_is_a_config_error(value, msg):
    with pytest.raises(ConfigError, match=rf"retrieval\.context_tokens = .*; {msg}"):
        ExperimentConfig.from_dict({"retrieval": {"context_tokens": value}})


def _run(path, root, budget=None, top_k=10, **kw):
    retrieval = {"top_k": top_k} if budget is None else {"top_k": top_k, "context_tokens": budget}
    cfg = ExperimentConfig.from_dict({"name": f"b{budget}", "dataset": {"path": str(path)},
                                      "extraction": {"name": "turns"}, "retrieval": retrieval})
    return run_experiment(cfg, results=root, progress=False, **kw)


@pytest.mark.parametrize("system", [None, "paraphraser"])
def test_every_question_reads_at_most_the_budget(synthetic_path, tmp_path, system):
    """memlab's pipeline and a black-box system alike: each question's memories fit the budget, and the retrieval
    trace records it; k stays an upper bound."""
    budget = 40
    def own() -> dict:
        return {} if system is None else {"system": Paraphraser()}

    run = _run(synthetic_path, tmp_path / "r", budget, top_k=100, **own())
    wide = _run(synthetic_path, tmp_path / "w", None, top_k=100, **own())
    texts = {m["id"]: m["text"] for d in (run, wide)
             for m in map(json.loads, (d.run_dir / "traces" / "memories.jsonl").read_text().splitlines())}
    hits = {}
    for d in (run, wide):
        for line in (d.run_dir / "traces" / "retrieval.jsonl").read_text().splitlines():
            t = json.loads(line)
            (q,) = t["queries"]
            hits.setdefault(t["qid"], []).append((q["options"], [h["id"] for h in q["hits"]]))
    assert hits
    for (opts, ids), (wide_opts, wide_ids) in hits.values():
        assert opts["context_tokens"] == budget and "context_tokens" not in wide_opts
        used = sum(count_tokens(texts[i] + "\n") for i in ids)
        assert used == opts["context_tokens_used"] <= budget
        assert ids == wide_ids[:len(ids)]  # a prefix of the ranking k = 100 gives
        if len(ids) < len(wide_ids):  # cut where the next memory would pass the budget
            assert used + count_tokens(texts[wide_ids[len(ids)]] + "\n") > budget
    assert any(len(i) < len(w) for (_, i), (_, w) in hits.values()) and any(i for (_, i), _ in hits.values())
    p, w = run.predictions.set_index("qid"), wide.predictions.set_index("qid")
    assert (p.context_tokens <= w.context_tokens).all() and (p.context_tokens < w.context_tokens).any()
    assert run.info["config"]["retrieval"]["context_tokens"] == budget


def test_compare_token_matched(synthetic_path, tmp_path, capsys):
    a = _run(synthetic_path, tmp_path, 40, top_k=100)
    b = _run(synthetic_path, tmp_path, 40, top_k=100, system=Paraphraser())
    plain = _run(synthetic_path, tmp_path, None)
    cmp = compare(a, b, token_matched=40)
    assert "context_tokens" in set(cmp.table.metric) and any("token-matched" in n for n in cmp.notes)
    # the run is named by its label and its folder
    with pytest.raises(ComparisonError, match=rf"not made at that budget: \S+ \({re.escape(str(plain.run_dir))}: "
                                              r"retrieval\.context_tokens = None, top_k = 10\).*--set "
                                              r"retrieval\.context_tokens=40 --set retrieval\.top_k=100"):
        compare(a, plain, token_matched=40)
    with pytest.raises(ComparisonError, match="not made at that budget"):
        compare(a, b, token_matched=30)
    assert main(["compare", str(a.run_dir), str(b.run_dir), "--token-matched", "40"]) == 0
    out = capsys.readouterr().out
    assert "context_tokens" in out and "token-matched: every run read at most 40 context tokens" in out
    assert main(["compare", str(a.run_dir), str(plain.run_dir), "--token-matched", "40"]) == 2
    assert "not made at that budget" in capsys.readouterr().err
    script = load_script("token_matched")
    assert script.main([str(a.run_dir), str(b.run_dir), "--reference", str(plain.run_dir)]) == 0
    out = capsys.readouterr().out
    la, lb, lplain = run_labels([a, b, plain])  # the script names runs as every comparison does
    assert "### Systems at a 40-token context budget" in out and f"| {lplain} | 10 | - |" in out
    assert f"| {lb} | context_tokens |" in out and "token-matched: every run read at most 40" in out
    assert f"| {la} | " in out and str(a.run_dir) in out  # the legend: label, folder, what differs
    assert script.main([str(a.run_dir), str(plain.run_dir)]) == 2  # two budgets: refused


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" /
                                                  f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
