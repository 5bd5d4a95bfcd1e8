"""Issue 9: components are one file each (registries), passed by object, and runs round-trip."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pandas as pd
import pytest

from memlab.answer import ANSWERERS, Answer, Answerer
from memlab.extract.extractors import EXTRACTORS, Extractor
from memlab.index import open_service
from memlab.memory import SearchOptions, UserKey
from memlab.registry import Registry, UnknownComponentError
from memlab.run import ConfigError, ExperimentConfig, load_run, run_experiment
from memlab.run.records import PredictionRecord

ROOT = Path(__file__).resolve().parents[1]


def syn_cfg(path: Path, **over) -> ExperimentConfig:
    cfg = ExperimentConfig.from_dict({"name": "syn", "dataset": {"path": str(path)},
                                      "extraction": {"name": "turns+observations"}})
    return cfg.with_overrides(over) if over else cfg


def test_registry_rules():
    reg: Registry[object] = Registry("widget")

    @reg.register("a")
    class A:
        pass

    assert reg.get("a") is A and "a" in reg and reg.names() == ("a",)
    with pytest.raises(UnknownComponentError, match="widget: unknown 'b'; registered: a"):
        reg.get("b")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(type("B", (), {}))


def test_config_names_come_from_the_registries():
    """A name is valid exactly while a class is registered under it. The registrations are scoped, so nothing
    leaks into other tests and the outcome does not depend on which tests ran before in this worker."""

    class Lone(Extractor):
        name = "scoped-extractor"

        def extract(self, request):
            raise AssertionError("never run")

    class LoneArm(Answerer):
        name = "scoped-arm"

        def answer(self, question, ctx):
            raise AssertionError("never run")

    both = {"extraction": {"name": "scoped-extractor"}, "answer": {"name": "scoped-arm"}}
    with EXTRACTORS.scoped(), ANSWERERS.scoped():
        with pytest.raises(ConfigError, match="extraction.name = 'scoped-extractor'"):
            ExperimentConfig.from_dict({"extraction": both["extraction"]})
        with pytest.raises(ConfigError, match="answer.name = 'scoped-arm'"):
            ExperimentConfig.from_dict({"answer": both["answer"]})
        EXTRACTORS.register("scoped-extractor")(Lone)
        ANSWERERS.register("scoped-arm")(LoneArm)
        cfg = ExperimentConfig.from_dict(both)
        assert (cfg.extraction.name, cfg.answer.name) == ("scoped-extractor", "scoped-arm")
    with pytest.raises(ConfigError, match="extraction.name = 'scoped-extractor'"):
        ExperimentConfig.from_dict({"extraction": both["extraction"]})  # gone with the scope


def test_one_file_extractor_and_answerer_run_end_to_end(synthetic_path, tmp_path):
    import tests.example_components.sentence_extractor  # noqa: F401
    import tests.example_components.top_memory_answerer  # noqa: F401

    cfg = syn_cfg(synthetic_path, **{"extraction.name": "example-first-sentence",
                                     "answer.name": "example-top-memory"})
    run = run_experiment(cfg, results=tmp_path, progress=False)
    mems = [json.loads(x) for x in open(run.run_dir / "traces" / "memories.jsonl")]
    assert {m["text"] for m in mems} >= {"Alice: I went to a pottery class yesterday.", "Bob: Nice!"}
    rex = run.predictions.set_index("qid").loc["syn-1/q3"]  # "What is Bob's dog called?"
    assert rex.prediction.startswith("Bob: ") and rex.rule == "memory at rank 1"
    assert run.info["extraction"]["extractor"] == "example-first-sentence(1)"  # its one setting, sentences


def test_user_objects_are_passed_beir_style(synthetic_path, tmp_path):
    """A notebook-defined (unregistered) extractor and answerer are used as given; the cache key
    names the user's class, so it never reuses the configured extractor's cache."""

    class Shout(Extractor):
        name = "shout"
        reconciles = False
        reads_old_memories = False

        def extract(self, request):
            from memlab.extract import ExtractionResult, MemoryOp

            return ExtractionResult(ops=[MemoryOp(action="add", text=m.text.upper(), kind="fact",
                                                  source_ids=(m.id,)) for m in request.delta])

    class Constant(Answerer):
        name = "constant"

        def answer(self, question, ctx):
            return Answer(prediction="Rex", rule="constant")

    configured = run_experiment(syn_cfg(synthetic_path), results=tmp_path, progress=False)
    run = run_experiment(syn_cfg(synthetic_path), results=tmp_path, progress=False, extractor=Shout(),
                         answerer=Constant())
    assert set(run.predictions.prediction) == {"Rex"}
    assert run.info["extraction"]["cache_key"] != configured.info["extraction"]["cache_key"]
    assert "Shout" in run.info["extraction"]["extractor"] and run.info["components"]["custom"]["answerer"]
    texts = [json.loads(x)["text"] for x in open(run.run_dir / "traces" / "memories.jsonl")]
    assert "I WENT TO A POTTERY CLASS YESTERDAY." in texts


def test_merged_provenance_reaches_the_index():
    """Adding existing content with new source ids merges them in the store AND in search hits."""
    svc = open_service("memory")
    k = UserKey("a", "u")
    svc.add(k, "Alice adopted a cat named Tom", source_ids=["D1:1"])
    assert svc.search(k, SearchOptions(query="cat Tom")).hits[0].entry.source_ids == ("D1:1",)
    svc.add(k, "Alice adopted a cat named Tom", source_ids=["D4:2"])
    hit = svc.search(k, SearchOptions(query="cat Tom")).hits[0]
    assert hit.entry.source_ids == ("D1:1", "D4:2") == svc.list(k)[0].source_ids


def test_saved_run_round_trips_types(synthetic_path, tmp_path):
    run = run_experiment(syn_cfg(synthetic_path), results=tmp_path, progress=False)
    again = load_run(run.run_dir)
    assert isinstance(again.predictions.evidence.iloc[0], list)
    assert again.predictions.evidence.tolist() == run.predictions.evidence.tolist()
    assert again.predictions.retrieved_ids.tolist() == run.predictions.retrieved_ids.tolist()
    assert all(isinstance(i, str) for i in again.summary.index)
    assert list(again.summary.index) == list(run.summary.index) == ["1", "2", "3", "4", "5", "overall 1-4",
                                                                     "overall 1-5"]
    pd.testing.assert_frame_equal(again.summary, run.summary, check_dtype=False)


def test_error_row_has_every_field(synthetic_path, tmp_path):
    class Broken(Answerer):
        name = "broken"
        needs_memory = False

        def answer(self, question, ctx):
            raise RuntimeError("boom")

    run = run_experiment(syn_cfg(synthetic_path), results=tmp_path, progress=False, answerer=Broken())
    rows = [json.loads(x) for x in open(run.run_dir / "predictions.jsonl")]
    fields = set(PredictionRecord.__dataclass_fields__)
    assert rows and all(set(r) == fields for r in rows)
    assert all(r["error"] == "RuntimeError: boom" for r in rows)
    s = run.summary.loc["overall 1-5"]
    assert s["n"] == 7 and s["n_scored"] == 0 and s["errors"] == 7 and pd.isna(s["f1"])
    assert run.info["status"] == "complete-with-errors"


@pytest.mark.slow
def test_non_editable_install_runs_shipped_configs(tmp_path, synthetic_path):
    """A regular (non-editable) install carries the configs and prompts: build the wheel, install it
    into a fresh venv that sees this environment's dependencies, run the shipped offline config."""
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheel_dir), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(wheel_dir.glob("memlab-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    # the venv sees this environment's third-party packages, but memlab only from the wheel
    (Path(site) / "deps.pth").write_text("\n".join(deps) + "\n")
    import zipfile

    zipfile.ZipFile(wheel).extractall(site)
    script = ("import memlab, pathlib; from memlab.run import ExperimentConfig, run_experiment;"
              "assert 'site-packages' in memlab.__file__ and 'main' not in pathlib.Path(memlab.__file__).parts[-3:];"
              f"c = ExperimentConfig.from_yaml('offline').with_overrides({{'dataset.path': {str(synthetic_path)!r}}});"
              f"r = run_experiment(c, results={str(tmp_path / 'res')!r}, progress=False);"
              "print(memlab.__file__, round(float(r.summary.loc['overall 1-5', 'f1']), 3))")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MEMLAB_LOCOMO": str(synthetic_path)}
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert str(env_dir) in out.stdout


def test_embedding_calls_go_through_the_model_client():
    """litellm embeddings get the chat calls' retries and accounting (a 500 is retried, tokens counted)."""
    from memlab.index.embedders import LiteLLMEmbedder
    from memlab.testing import Reply, ScriptedServer

    with ScriptedServer() as srv:
        # enough 500s that the OpenAI SDK's own retries (litellm keeps its default of 2 for embeddings)
        # give up and the model client's retry is needed
        srv.embed_faults.extend([Reply(status=500, text="warming up")] * 3)
        emb = LiteLLMEmbedder("openai/embed", api_base=srv.api_base, api_key="x", num_retries=2)
        vecs = emb.embed(["alpha beta", "gamma"])
        assert vecs.shape == (2, 16) and not srv.embed_faults
        assert emb.client.calls == 2 and emb.client.failures == 0 and emb.usage_tokens == 3
    with ScriptedServer() as srv:
        srv.embed_faults.extend([Reply(status=500, text="down")] * 20)
        emb = LiteLLMEmbedder("openai/embed", api_base=srv.api_base, api_key="x", num_retries=1)
        with pytest.raises(RuntimeError, match="embedding call failed"):
            emb.embed(["alpha"])
        assert emb.client.calls == 2 and emb.client.failures == 1
