"""Each recipe of docs/guides/models.md ("Recipes"), run as written against the scripted server imitating
that server's quirks (`memlab.testing.QUIRKS`). No test compiles llama.cpp or downloads weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from memlab.run import ExperimentConfig, run_experiment
from memlab.testing import Reply, ScriptedServer
from tests.scripted_model import responder

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "models.md"


def recipes() -> dict[str, dict]:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("\n## Recipes", 1)[1].split("\n## ", 1)[0]
    out = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.S):
        m = re.match(r"# recipe: (\S+)", block)
        if m:
            out[m.group(1)] = yaml.safe_load(block)
    return out


def judging(body: dict) -> Reply:
    """The scripted model, also answering the judge's prompt (a verdict)."""
    system = body["messages"][0]["content"] if body.get("messages") else ""
    return Reply(text="CORRECT") if system.startswith("You grade answers") else responder(body)


def test_the_guide_has_the_four_recipes_complete_and_their_commands():
    assert set(recipes()) == {"llama-cpp-python", "ollama", "vllm", "openai"}
    for name, doc in recipes().items():  # every role named, and the key variable stated (null: no key)
        assert doc["extraction"]["model"] and doc["answer"]["model"] and doc["judge"]["model"], name
        assert doc["index"]["embedder"] and "api_key_env" in doc["models"], name
    assert recipes()["openai"]["models"]["api_key_env"] == "OPENAI_API_KEY"
    assert recipes()["vllm"]["models"]["api_key_env"] == "VLLM_API_KEY"
    text = GUIDE.read_text(encoding="utf-8")
    for needle in ("--chat_format chatml-function-calling", "OLLAMA_NUM_PARALLEL=1",
                   "--enable-auto-tool-choice --tool-call-parser hermes", "make test-local",
                   "export OPENAI_API_KEY=", "--api-key \"$VLLM_API_KEY\"", "memlab run local"):
        assert needle in text


@pytest.mark.parametrize("server", ["llama-cpp-python", "ollama", "vllm", "openai"])
def test_recipe_runs_against_an_imitation_of_its_server(server, synthetic_path, tmp_path, monkeypatch):
    doc = recipes()[server]
    monkeypatch.setenv("VLLM_API_KEY", "k")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    quirks = {"openai": {"models": [{"id": "gpt-4o-mini"}, {"id": "text-embedding-3-small"}]}}
    with (ScriptedServer(responder=judging, **quirks[server]) if server in quirks
          else ScriptedServer.imitating(server, responder=judging)) as srv:
        if server == "openai":  # the hosted API, imitated: the same config pointed at the scripted server
            doc = {**doc, "models": {**doc["models"], "api_base": srv.api_base}}
        doc = json.loads(json.dumps(doc).replace(doc["models"]["api_base"], srv.api_base))
        doc.update(name=f"recipe-{server}", dataset={"path": str(synthetic_path)})
        cfg = ExperimentConfig.from_dict(doc, where=f"models guide recipe {server}")
        run = run_experiment(cfg, results=tmp_path, progress=False)
        pred = run.predictions
        assert len(pred) == 7 and pred["error"].isna().all(), pred[["error"]].to_dict()
        assert pred["judge_error"].isna().all() and pred["j"].eq(1.0).all()  # the judge role answered
        assert not pred["prediction"].astype(str).str.startswith("functions.").any()
        assert run.info["extraction"]["jobs_failed"] == 0 and run.info["extraction"]["ops_applied"] > 0
        sent = [m for r in srv.requests for m in r["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
        assert sent and all("content" in m for m in sent)  # llama.cpp's template needs it
        roles = "\n".join(run.info["model_roles"])
        if server == "llama-cpp-python":
            assert run.info["models"]["malformed_tool_calls"] > 0 and pred["malformed_tool_calls"].sum() > 0
            assert srv.busy_arrivals == 0 and srv.max_in_flight == 1
            assert "embedder: tfidf-lsa (local, in this process)" in roles and not srv.embed_requests
            assert "extractor: openai/local" in roles and "timeout 300 s" in roles
        else:
            assert run.info["models"]["malformed_tool_calls"] == 0
        if server in ("ollama", "openai"):
            assert srv.embed_requests
        if server == "ollama":
            assert "embedder: openai/nomic-embed-text at " + srv.api_base in roles
        if server == "vllm":
            assert "concurrency 4" in roles and srv.max_in_flight <= 4


def test_the_shipped_local_config_needs_only_the_address(synthetic_path, tmp_path):
    """`memlab run local --set models.api_base=...` against a llama.cpp-like server serving `local`."""
    with ScriptedServer.imitating("llama-cpp-python", responder=judging) as srv:
        cfg = ExperimentConfig.from_yaml("local").with_overrides(
            {"models.api_base": srv.api_base, "dataset.path": str(synthetic_path)})
        run = run_experiment(cfg, results=tmp_path, progress=False)
    assert {r["model"] for r in srv.requests} == {"local"} and not srv.embed_requests
    assert run.predictions["error"].isna().all() and run.predictions["j"].eq(1.0).all()
    assert run.info["extraction"]["ops_applied"] > 0
