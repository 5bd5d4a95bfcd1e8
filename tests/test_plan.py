"""``memlab run --plan``: what a run will ask of each model role, before it asks, next to what it then asked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memlab.llm import prompt_tokens_estimate
from memlab.run import ExperimentConfig, run_experiment
from memlab.run.plan import plan_config, plan_vs_actual
from memlab.testing import Reply, ScriptedServer
from tests.scripted_model import responder


def judging(body: dict) -> Reply:
    content = body["messages"][0]["content"]
    return Reply(text="CORRECT") if content.startswith("You grade answers") else responder(body)


def model_cfg(path, api_base: str | None, **over) -> ExperimentConfig:
    d = {"name": "plan", "dataset": {"path": str(path)},
         "extraction": {"name": "llm", "model": "openai/scripted"},
         "answer": {"name": "original", "model": "openai/scripted"}, "judge": {"model": "openai/scripted"},
         "models": {"api_base": api_base, "max_retries": 0}}
    return ExperimentConfig.from_dict(d).with_overrides(over) if over else ExperimentConfig.from_dict(d)


def test_the_plan_counts_the_calls_a_run_then_makes_and_its_prompts(synthetic_path, tmp_path):
    with ScriptedServer(responder=judging) as srv:
        cfg = model_cfg(synthetic_path, srv.api_base)
        plan = plan_config(cfg)
        assert srv.requests == []  # planning asks nothing
        run = run_experiment(cfg, results=tmp_path, progress=False)
        sent = list(srv.requests)
    roles = plan.roles
    from memlab.data import load_locomo

    data = load_locomo(synthetic_path)
    assert roles["extractor"].calls == sum(len(c.sessions) for c in data) == plan.sessions
    assert roles["reader"].calls == roles["judge"].calls == len(data.questions) == plan.questions
    assert roles["reader"].completion_tokens_max == roles["reader"].calls * 256
    # the extraction prompts are the ones sent (the plan renders them with the extractor's own code); the old
    # memories it adds are an estimate, so the plan is at least what was sent without them
    ext_sent = [b for b in sent if b.get("tools") and "add_memory" in {t["function"]["name"] for t in b["tools"]}]
    exact = sum(prompt_tokens_estimate(b["messages"], b["tools"]) for b in ext_sent)
    assert len(ext_sent) == roles["extractor"].calls and roles["extractor"].prompt_tokens >= exact * 0.9
    # run.json keeps the plan; plan vs actual per role
    assert run.info["plan"]["roles"]["reader"]["calls"] == roles["reader"].calls
    rows = {r["role"]: r for r in plan_vs_actual(run.info)}
    assert rows["extractor"]["calls"] == rows["extractor"]["calls_planned"]
    assert rows["reader"]["calls"] == rows["reader"]["calls_planned"] == len(data.questions)
    assert rows["judge"]["calls"] == rows["judge"]["calls_planned"]


def test_the_plan_prices_a_hosted_model_and_says_unknown_price_plainly(synthetic_path):
    hosted = plan_config(model_cfg(synthetic_path, None, **{"extraction.model": "gpt-4o-mini",
                                                            "answer.model": "gpt-4o-mini",
                                                            "judge.model": "no-such-model-xyz"}))
    assert hosted.roles["reader"].price == "litellm" and hosted.roles["reader"].usd > 0
    assert hosted.roles["judge"].usd is None and "unknown" in hosted.roles["judge"].price
    assert any("unknown price" in n for n in hosted.notes)
    remote = plan_config(model_cfg(synthetic_path, "https://api.example.com/v1",
                                   **{"answer.model": "gpt-4o-mini", "extraction.model": "gpt-4o-mini",
                                      "judge.model": "gpt-4o-mini"}))
    assert remote.roles["reader"].price == "litellm"  # a hosted API at its own address is not free


def test_optimized_and_long_context_plans_bound_their_calls(synthetic_path):
    opt = plan_config(model_cfg(synthetic_path, None, **{"answer.name": "optimized", "answer.params.max_rounds": 3,
                                                         "answer.model": "gpt-4o-mini"}))
    n = opt.questions
    assert opt.roles["reader"].calls == 3 * n
    lc = plan_config(model_cfg(synthetic_path, None, **{"answer.name": "long-context", "answer.model": "gpt-4o-mini"}))
    assert "extractor" not in lc.roles and lc.roles["reader"].calls == n
    from memlab.answer.llm_arms import render_transcript
    from memlab.data import load_locomo
    from memlab.llm import count_tokens

    whole = sum(count_tokens(render_transcript(c)) * len(c.questions) for c in load_locomo(synthetic_path))
    assert whole < lc.roles["reader"].prompt_tokens < whole + 400 * n  # the whole transcript in every prompt


def test_plan_cli_asks_nothing_and_writes_no_run(synthetic_path, tmp_path, capsys):
    from memlab.cli import main

    with ScriptedServer(responder=judging) as srv:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(json.dumps(model_cfg(synthetic_path, srv.api_base).to_dict()))
        assert main(["run", str(cfg), "--plan", "--no-probe", "--results", str(tmp_path / "r")]) == 0
        assert srv.requests == [] and not (tmp_path / "r").exists()
        out = capsys.readouterr().out
        assert "extractor" in out and "completion_tokens_max" in out
        probed = subprocess.run([sys.executable, "-m", "memlab", "run", str(cfg), "--plan"], capture_output=True,
                                text=True, timeout=120)
        assert probed.returncode == 0, probed.stderr
        assert len(srv.requests) == 2 and "generated tokens/s (throughput probe, 2 requests)" in probed.stdout


def test_two_probes_share_no_prompt_a_server_could_serve_from_its_cache():
    """llama.cpp keeps a prompt's KV cache: a second probe sending the same prompt measured ~18,000 prompt tokens/s
    against the ~170 of the first. Every probe prompt starts with its own nonce."""
    from memlab.llm import ModelClient
    from memlab.run.plan import probe_throughput

    with ScriptedServer(responder=judging) as srv:
        client = ModelClient("openai/scripted", api_base=srv.api_base, api_key="x", max_retries=0)
        probe_throughput(client)
        probe_throughput(client)
        prompts = [r["messages"][0]["content"] for r in srv.requests]
    assert len(prompts) == 4 and len(set(prompts)) == 4
    assert len({p.split()[0] for p in prompts}) == 2  # one nonce per probe, first in the prompt
    assert all(a[:4] != b[:4] for a, b in [(prompts[0], prompts[2]), (prompts[1], prompts[3])])


@pytest.mark.parametrize("role", ["extractor", "reader", "judge"])
def test_plan_roles_follow_the_config(synthetic_path, role):
    over = {"extractor": {"extraction.name": "turns"}, "reader": {"answer.name": "extractive"},
            "judge": {"judge.model": None}}[role]
    plan = plan_config(model_cfg(synthetic_path, None, **{"extraction.model": "gpt-4o-mini",
                                                          "answer.model": "gpt-4o-mini", "judge.model": "gpt-4o-mini",
                                                          **over}))
    assert role not in plan.roles and plan.roles


def test_per_category_takes_n_of_each_category_first_or_seeded_in_file_order(locomo):
    from memlab.run.config import ConfigError
    from memlab.run.selection import select_questions

    def pick(**d):
        cfg = ExperimentConfig.from_dict({"dataset": {"conversations": ["conv-26"], **d}})
        return [q for _, q in select_questions(cfg, locomo)]

    first = pick(per_category=3)
    counts = {c: sum(q.category == c for q in first) for c in range(1, 6)}
    assert counts == {1: 3, 2: 3, 3: 3, 4: 3, 5: 3}
    conv = locomo["conv-26"]
    assert [q.qid for q in first if q.category == 4] == [q.qid for q in conv.questions if q.category == 4][:3]
    drawn = pick(per_category=3, sample_seed=7)
    assert drawn == pick(per_category=3, sample_seed=7) and drawn != first  # repeatable, not the first N
    assert [q.index for q in drawn] == sorted(q.index for q in drawn)  # kept in file order
    assert {q.qid for q in pick(per_category=3, sample_seed=7, categories=[4])} == \
        {q.qid for q in drawn if q.category == 4}  # a category's draw does not depend on the others
    with pytest.raises(ConfigError, match="sample_seed = 7 without dataset.per_category"):
        ExperimentConfig.from_dict({"dataset": {"sample_seed": 7}})
    with pytest.raises(ConfigError, match="dataset.per_category = 0"):
        ExperimentConfig.from_dict({"dataset": {"per_category": 0}})
