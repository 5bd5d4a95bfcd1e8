"""The spend cap (``run.max_calls``, ``run.max_usd``; issue 38): a run stops cleanly before the request that could
pass it, says why, scores nothing, and a resume with a raised cap finishes it with the uncapped run's predictions."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from memlab.cli import SPEND_CAP_EXIT, main
from memlab.eval.cost import Price
from memlab.llm import SpendCap, SpendCapReached
from memlab.run import ConfigError, ExperimentConfig, run_experiment
from memlab.run.plan import plan_vs_actual
from memlab.testing import Reply, ScriptedServer
from memlab.testing.models import scripted_model as responder


def judging(body: dict) -> Reply:
    content = body["messages"][0]["content"]
    return Reply(text="CORRECT") if content.startswith("You grade answers") else responder(body)


def model_cfg(path: Path, api_base: str, **over) -> ExperimentConfig:
    """Every role on the scripted model: the extractor (a call per session), the reader and the judge."""
    d = {"name": "cap", "dataset": {"path": str(path)},
         "extraction": {"name": "llm", "model": "openai/scripted"},
         "answer": {"name": "original", "model": "openai/scripted"}, "judge": {"model": "openai/scripted"},
         "models": {"api_base": api_base, "max_retries": 0}}
    cfg = ExperimentConfig.from_dict(d)
    return cfg.with_overrides(over) if over else cfg


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def only_run(root: Path) -> Path:
    (d,) = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return d


@pytest.fixture
def uncapped(synthetic_path, tmp_path):
    """The reference: the same config run without a cap (its own results root: its own response cache)."""
    with ScriptedServer(responder=judging) as srv:
        run = run_experiment(model_cfg(synthetic_path, srv.api_base), results=tmp_path / "ref", progress=False)
        return run, len(srv.requests)


@pytest.mark.parametrize("cap", [2, 9])  # 2: inside the extraction of the first conversation; 9: while answering
def test_max_calls_stops_before_the_call_and_a_raised_cap_finishes_it(synthetic_path, tmp_path, uncapped, cap):
    ref, ref_calls = uncapped
    assert ref.info["spend"]["calls"] == ref_calls == 17 and cap < ref_calls
    with ScriptedServer(responder=judging) as srv:
        cfg = model_cfg(synthetic_path, srv.api_base, **{"run.max_calls": cap})
        with pytest.raises(SpendCapReached, match=f"run.max_calls={cap} reached"):
            run_experiment(cfg, results=tmp_path / "capped", progress=False)
        assert len(srv.requests) == cap  # the refused call was never sent
        run_dir = only_run(tmp_path / "capped")
        info = run_json(run_dir)
        assert info["status"] == "stopped" and f"run.max_calls={cap} reached ({cap} calls made)" in info["stopped"]
        assert info["spend"]["calls"] == cap and info["resume"] == f"memlab run --resume {run_dir}"
        assert not (run_dir / "predictions.parquet").exists() and not (run_dir / "summary.parquet").exists()
        # the same cap again: nothing more is sent, it stops at once
        with pytest.raises(SpendCapReached):
            run_experiment(None, resume=run_dir, progress=False)
        assert len(srv.requests) == cap and run_json(run_dir)["spend"]["calls"] == cap
        # raised (no --force-config needed for the cap): it goes on from where it stopped
        done = run_experiment(None, resume=run_dir, overrides=["run.max_calls=100"], progress=False)
        sent = len(srv.requests)
    assert done.info["status"] == "complete" and "stopped" not in done.info
    assert sent == ref_calls and done.info["spend"]["calls"] == ref_calls  # nothing asked twice, counted across
    a = ref.predictions.set_index("qid").sort_index()
    b = done.predictions.set_index("qid").sort_index()
    assert list(a.index) == list(b.index)
    assert a["prediction"].tolist() == b["prediction"].tolist() and a["j"].tolist() == b["j"].tolist()
    assert [s["status"] for s in done.info["sessions"]] == ["stopped", "stopped", "complete"]
    # plan vs actual counts every session: the stopped ones' calls and the last one's add up to the plan
    rows = {r["role"]: r for r in plan_vs_actual(done.info)}
    assert all(r["calls"] == r["calls_planned"] for r in rows.values()) and len(rows) == 3
    assert sum(r["calls"] for r in rows.values()) == ref_calls


def test_report_shows_plan_vs_actual_in_the_terminal_and_the_html(uncapped, tmp_path, capsys):
    run, _ = uncapped
    assert main(["report", str(run.run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"{run.run_dir}: plan vs actual" in out and "reader calls 7 / 7" in out and "judge calls 7 / 7" in out
    page = tmp_path / "r.html"
    assert main(["report", str(run.run_dir), "--html", str(page)]) == 0
    text = page.read_text()
    assert '<h2 id="plan">Plan vs actual' in text and "calls_planned" in text


def test_max_usd_with_a_price_table_stops_under_the_cap_and_resumes(synthetic_path, tmp_path, uncapped):
    ref, ref_calls = uncapped
    prices = tmp_path / "prices.yaml"
    prices.write_text("openai/scripted: {input: 100, output: 400}\n")  # USD per million tokens
    with ScriptedServer(responder=judging) as srv:
        # a reply cap that lets the first call's worst case fit under the cap below
        priced = model_cfg(synthetic_path, srv.api_base, **{"cost.prices": str(prices),
                                                            "models.extractor.max_tokens": 300})
        full = run_experiment(priced, results=tmp_path / "priced", progress=False)
        usd = full.info["spend"]["usd"]
        assert usd > 0 and full.info["spend"]["calls"] == ref_calls
        n0 = len(srv.requests)
        cap = usd * 0.9  # under what the run costs: it must stop before its last call at the latest
        with pytest.raises(SpendCapReached, match="run.max_usd=.* reached: spent"):
            run_experiment(priced.with_overrides({"run.max_usd": cap}), results=tmp_path / "capped", progress=False)
        run_dir = only_run(tmp_path / "capped")
        info = run_json(run_dir)
        assert info["status"] == "stopped" and "could cost up to $" in info["stopped"]
        assert 0 < info["spend"]["usd"] <= cap and info["spend"]["calls"] == len(srv.requests) - n0 < ref_calls
        done = run_experiment(None, resume=run_dir, overrides={"run.max_usd": usd * 10}, progress=False)
    assert done.info["status"] == "complete" and done.info["spend"]["usd"] == pytest.approx(usd)
    assert done.predictions.set_index("qid").sort_index()["prediction"].tolist() == \
        ref.predictions.set_index("qid").sort_index()["prediction"].tolist()


def test_cli_stopped_run_exits_with_its_own_status_and_one_line(synthetic_path, tmp_path, capsys):
    with ScriptedServer(responder=judging) as srv:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(model_cfg(synthetic_path, srv.api_base).to_yaml())
        assert main(["run", str(cfg), "--results", str(tmp_path / "r"), "--set", "run.max_calls=5"]) == SPEND_CAP_EXIT
        err = capsys.readouterr().err
        run_dir = only_run(tmp_path / "r")
        assert "memlab: stopped: spend cap: run.max_calls=5 reached" in err
        assert f"memlab run --resume {run_dir} --set run.max_calls=..." in err
        assert main(["run", "--resume", str(run_dir), "--set", "run.max_calls=50"]) == 0
        assert "[complete]" in capsys.readouterr().out
        # other keys still need --force-config on a resume
        assert main(["run", "--resume", str(run_dir), "--set", "answer.top_k=3"]) == 2
        assert "need none" in capsys.readouterr().err


@pytest.mark.parametrize("key, value, says", [
    ("run.max_calls", 0, "run.max_calls = 0; expected an integer >= 1"),
    ("run.max_calls", 2.5, "run.max_calls = 2.5"),
    ("run.max_usd", 0, "run.max_usd = 0"),
    ("run.max_usd", -1.0, "run.max_usd = -1.0; expected a number of US dollars > 0"),
    ("run.max_usd", "ten", "run.max_usd = 'ten'"),
    ("run.max_usd", True, "run.max_usd = True"),
    ("run.max_usd", float("inf"), "run.max_usd = inf"),
])
def test_bad_cap_values_are_refused(synthetic_path, key, value, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        model_cfg(synthetic_path, "http://127.0.0.1:9/v1", **{key: value})


def test_a_cap_with_the_ray_executor_is_refused(synthetic_path):
    with pytest.raises(ConfigError, match="use the local executor"):
        model_cfg(synthetic_path, "http://127.0.0.1:9/v1", **{"run.max_calls": 5, "run.executor": "ray"})


def test_max_usd_with_an_unknown_price_is_refused_before_any_work(synthetic_path, tmp_path):
    cfg = model_cfg(synthetic_path, "https://api.example.invalid/v1", **{
        "judge.model": "no-such-model-xyz", "answer.model": "gpt-4o-mini", "extraction.model": "gpt-4o-mini",
        "run.max_usd": 1.0})
    with pytest.raises(ConfigError, match=r"max_usd = 1: no price is known for judge no-such-model-xyz \(no-such-model"
                                          r"-xyz is not in litellm's price map\); give their prices in a table \(cost"):
        run_experiment(cfg, results=tmp_path / "r", progress=False)
    root = tmp_path / "r"
    assert not root.exists() or not [p for p in root.iterdir() if not p.name.startswith(".")]  # no run folder


def test_requests_in_flight_hold_their_worst_case():
    """Two threads admitted at once cannot together pass the cap: the second sees the first's reservation."""
    cap = SpendCap(max_usd=1.0, price=lambda model, base: Price(input=0.001, output=0.001, source="user table"))
    first = cap.admit("reader", "m", None, prompt_tokens=300, max_tokens=300)  # worst case $0.60
    assert first == pytest.approx(0.6)
    with pytest.raises(SpendCapReached, match=r"\+ \$0\.600000 in flight"):
        cap.admit("reader", "m", None, prompt_tokens=300, max_tokens=300)
    with pytest.raises(SpendCapReached):  # once refused, every later request is refused (the run is stopping)
        cap.admit("reader", "m", None, prompt_tokens=1, max_tokens=1)
    cap.settle(first, "m", None, (300, 20, 0))
    assert cap.calls == 1 and cap.usd == pytest.approx(0.32)


def test_max_calls_holds_under_concurrency(synthetic_path, tmp_path):
    with ScriptedServer(responder=lambda b: Reply(text="Not mentioned.", delay=0.05)) as srv:
        cfg = model_cfg(synthetic_path, srv.api_base, **{"extraction.name": "turns", "judge.model": None,
                                                         "run.concurrency": 4, "models.concurrency": 4,
                                                         "run.max_calls": 3})
        with pytest.raises(SpendCapReached):
            run_experiment(cfg, results=tmp_path, progress=False)
        assert len(srv.requests) == 3 and srv.max_in_flight > 1
    info = run_json(only_run(tmp_path))
    assert info["spend"]["calls"] == 3 and info["status"] == "stopped"
    logged = (only_run(tmp_path) / "predictions.jsonl").read_text().splitlines()
    assert len(logged) <= 3 and all(json.loads(x)["error"] is None for x in logged)  # no question an error


def test_no_thread_leaks_a_cap_into_the_next_run(synthetic_path, tmp_path):
    with ScriptedServer(responder=judging) as srv:
        with pytest.raises(SpendCapReached):
            run_experiment(model_cfg(synthetic_path, srv.api_base, **{"run.max_calls": 1}), results=tmp_path / "a",
                           progress=False)
        from memlab.llm import current_cap

        assert current_cap() is None and threading.active_count() < 50
        run = run_experiment(model_cfg(synthetic_path, srv.api_base), results=tmp_path / "b", progress=False)
    assert run.info["status"] == "complete"



def test_the_plan_says_whether_a_cold_run_fits_the_cap(synthetic_path):
    from memlab.run.plan import plan_config

    tight = plan_config(model_cfg(synthetic_path, "http://127.0.0.1:9/v1", **{"run.max_calls": 5}))
    assert ("spend cap run.max_calls=5: the plan needs 17 calls (retries add more): a cold run stops before it ends "
            "(resume with a raised cap)") in tight.notes
    hosted = {"extraction.model": "gpt-4o-mini", "answer.model": "gpt-4o-mini", "judge.model": "gpt-4o-mini"}
    roomy = plan_config(model_cfg(synthetic_path, None, **{"run.max_usd": 1000.0, **hosted}))
    assert any(n.startswith("spend cap run.max_usd=1000: the plan's bound is $") and n.endswith("within the cap")
               for n in roomy.notes)


def test_a_complete_run_is_reused_whatever_its_cap(synthetic_path, tmp_path):
    """A run that finished in one session under a cap it never reached has the results an uncapped one has."""
    with ScriptedServer(responder=judging) as srv:
        first = run_experiment(model_cfg(synthetic_path, srv.api_base, **{"run.max_calls": 100}), results=tmp_path,
                               progress=False)
        n = len(srv.requests)
        again = run_experiment(model_cfg(synthetic_path, srv.api_base, **{"run.max_usd": 5.0}), results=tmp_path,
                               progress=False, reuse=True)
        assert again.run_dir == first.run_dir and len(srv.requests) == n
