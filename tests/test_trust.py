"""Issue 35: what a run folder's config may do with the user's keys and files is derived from the declarations
(`memlab.params.Trust` beside each component parameter, ``TRUST_FILE`` beside config fields): a crafted folder's
endpoint, prompt file or errata file is refused on ``--resume`` and ``rescore`` unless the user started the run
with it, and a key is never a config value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pytest
import yaml

from memlab.answer import ABSTAIN, ANSWERERS, Answer, Answerer
from memlab.cli import main
from memlab.index.keyword import KEYWORD_SCORERS, TfidfScorer
from memlab.params import Trust
from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.testing import ScriptedServer
from tests.scripted_model import responder

SECRET = "root:x:0:0:the users secret first line"


@ANSWERERS.register("trust-probe")
class ProbeArm(Answerer):
    """A component added after this issue: its endpoint setting is covered because it is declared one."""

    name = "trust-probe"
    needs_memory = False

    def __init__(self, api_base: Annotated[str | None, Trust.endpoint] = None):
        self.api_base = api_base

    def answer(self, question, ctx):
        return Answer(prediction=ABSTAIN, rule="probe")


@KEYWORD_SCORERS.register("trust-probe-scorer")
class TokenScorer(TfidfScorer):
    """A scorer whose key is not called ``api_key``: the mark, not the name, makes it a secret."""

    def __init__(self, token: Annotated[str | None, Trust.secret] = None):
        self.token = token


def syn(path: Path, **over) -> ExperimentConfig:
    cfg = ExperimentConfig.from_dict({"name": "t", "dataset": {"path": str(path)},
                                      "extraction": {"name": "turns"}})
    return cfg.with_overrides(over) if over else cfg


def craft(run_dir: Path, edit) -> None:
    """Edit a finished run's config.yaml as a folder from elsewhere could come, every question left to answer."""
    d = yaml.safe_load((run_dir / "config.yaml").read_text())
    edit(d)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(d))
    (run_dir / "predictions.jsonl").write_text("")


@pytest.fixture
def secret_file(tmp_path) -> Path:
    p = tmp_path / "elsewhere" / "passwd.cnf"
    p.parent.mkdir()
    p.write_text(SECRET + "\n")
    return p


def test_resume_refuses_a_crafted_memory_system_endpoint(synthetic_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-users-openai-key")
    run = run_experiment(syn(synthetic_path), results=tmp_path / "r", progress=False)
    with ScriptedServer(responder=responder) as srv:
        craft(run.run_dir, lambda d: d.update(system={"name": "mem0", "params": {
            "infer": True, "model": "probe", "api_base": srv.api_base}}))
        assert main(["run", "--resume", str(run.run_dir)]) == 2
        err = capsys.readouterr().err
        assert f"system.params.api_base = '{srv.api_base}'" in err and "--trust-run-config" in err
        assert srv.requests == []  # before: the user's OPENAI_API_KEY went to the folder's server as a Bearer


def test_resume_refuses_a_crafted_prompt_file_in_the_arms_settings(synthetic_path, tmp_path, secret_file, capsys):
    with ScriptedServer(responder=responder) as srv:  # the user's own model run: its endpoint is remembered
        cfg = syn(synthetic_path, **{"answer.name": "original", "answer.model": "openai/scripted",
                                     "models.api_base": srv.api_base, "models.max_retries": 0,
                                     "dataset.question_limit": 1})
        run = run_experiment(cfg, results=tmp_path / "r", progress=False)
        sent = len(srv.requests)
        craft(run.run_dir, lambda d: d["answer"].update(params={"prompt": str(secret_file)}))
        assert main(["run", "--resume", str(run.run_dir)]) == 2
        err = capsys.readouterr().err
        assert f"answer.params.prompt = '{secret_file}'" in err
        assert len(srv.requests) == sent and SECRET not in json.dumps(srv.requests)  # before: sent whole
        resumed = run_experiment(None, resume=run.run_dir, progress=False, trust_run_config=True)  # confirmed
        assert resumed.info["status"] == "complete" and SECRET in json.dumps(srv.requests[sent:])


def test_a_new_components_declared_endpoint_is_covered_without_a_list(synthetic_path, tmp_path, capsys):
    cfg = syn(synthetic_path, **{"answer.name": "trust-probe"})
    assert cfg.trust_settings() == {"dataset.path": str(synthetic_path)}
    crafted = cfg.with_overrides({"answer.params.api_base": "http://203.0.113.7/v1"})
    assert crafted.trust_settings()["answer.params.api_base"] == "http://203.0.113.7/v1"
    run = run_experiment(cfg, results=tmp_path / "r", progress=False)
    craft(run.run_dir, lambda d: d["answer"].update(params={"api_base": "http://203.0.113.7/v1"}))
    assert main(["run", "--resume", str(run.run_dir)]) == 2
    assert "answer.params.api_base = 'http://203.0.113.7/v1'" in capsys.readouterr().err


@pytest.mark.parametrize("over", [
    {"index.embedder.name": "litellm:text-embedding-3-small", "index.embedder.params": {"api_key": "sk-literal-1234"}},
    {"extraction.name": "llm", "extraction.model": "openai/m",
     "extraction.params": {"api_key": "sk-literal-1234"}},
    {"system.name": "mem0", "system.params": {"api_key": "sk-literal-1234"}},
    {"index.keyword.name": "trust-probe-scorer", "index.keyword.params": {"token": "sk-literal-1234"}},
], ids=["embedder", "extractor", "system", "a-new-components-token"])
def test_a_key_is_refused_as_a_config_value_and_never_shown(over, synthetic_path, tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        syn(synthetic_path, **over)
    assert "sk-literal-1234" not in str(e.value) and "environment variable" in str(e.value)
    args = ["run", "offline", "--set", f"dataset.path={synthetic_path}", "--results", str(tmp_path / "r")]
    for k, v in over.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    assert main(args) == 2  # before: written verbatim into config.yaml, run.json and report.html
    out = capsys.readouterr()
    assert "sk-literal-1234" not in out.err + out.out and not (tmp_path / "r").exists()


def test_a_key_given_to_an_object_is_never_recorded_nor_in_a_cache_id():
    from memlab.extract.extractors import LLMExtractor
    from memlab.run.components import _held

    held = _held(TokenScorer(token="sk-object-key"), {})
    assert held == {} and "sk-object-key" not in TokenScorer(token="sk-object-key").cache_id()
    ex = LLMExtractor(model="openai/m", api_key="sk-object-key")
    assert "api_key" not in _held(ex, {}) and "sk-object-key" not in ex.cache_id()


def _craft_errata(run_dir: Path, errata: Path) -> None:
    """Point a finished run's config at another errata file, its recorded digests made to match (a crafted folder
    comes with its own run.json)."""
    from memlab.run.outputs import record_outputs

    d = yaml.safe_load((run_dir / "config.yaml").read_text())
    d["scoring"]["errata"] = str(errata)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(d))
    info = json.loads((run_dir / "run.json").read_text())
    info["outputs"] = record_outputs(run_dir)
    (run_dir / "run.json").write_text(json.dumps(info))


@pytest.mark.parametrize("command", [["rescore"], ["report", "--profiles", "locomo"]])
def test_a_crafted_errata_path_is_not_read_by_rescore(command, synthetic_path, tmp_path, secret_file, capsys):
    run = run_experiment(syn(synthetic_path), results=tmp_path / "r", progress=False)
    _craft_errata(run.run_dir, secret_file)
    assert main([*command, str(run.run_dir)]) == 2
    out = capsys.readouterr()
    assert f"scoring.errata = '{secret_file}'" in out.err and "--trust-run-config" in out.err
    assert "users secret" not in out.err + out.out  # before: the file's first line, printed


def test_the_users_own_errata_and_one_named_now_need_no_flag(synthetic_path, tmp_path, capsys):
    errata = tmp_path / "errata.csv"
    errata.write_text("qid,answer\nsyn-1/q3,Rex the dog\n")
    run = run_experiment(syn(synthetic_path, **{"scoring.errata": str(errata)}), results=tmp_path / "r",
                         progress=False)
    assert main(["rescore", str(run.run_dir), "--profile", "mem0"]) == 0  # started with it: remembered
    assert "errata: 1 corrected" in capsys.readouterr().out
    plain = run_experiment(syn(synthetic_path), results=tmp_path / "r", progress=False)
    _craft_errata(plain.run_dir, tmp_path / "elsewhere.csv")
    assert main(["rescore", str(plain.run_dir), "--errata", str(errata)]) == 0  # named now: the folder's unused
