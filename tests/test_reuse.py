"""``reuse=True``: a second identical run returns the first one's folder; any difference in config, data or code,
and any run that did not finish cleanly in one session, runs again (`memlab.run.reuse`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from memlab.cli import main
from memlab.index.embedders import TfidfLSAEmbedder
from memlab.run import ConfigError, ExperimentConfig, run_ablation, run_experiment
from memlab.run.outputs import verify_outputs
from memlab.run.results import RunFileError
from memlab.run.reuse import reusable_run, why_not
from memlab.run.steps import prepare
from tests.test_faults_run import FlakyAnswerer, syn


def folders(root: Path) -> list[Path]:
    return sorted(d for d in root.iterdir() if d.is_dir() and d.name != ".cache")


def edit_run_json(run_dir: Path, edit) -> None:
    p = run_dir / "run.json"
    info = json.loads(p.read_text())
    edit(info)
    p.write_text(json.dumps(info))


def test_an_identical_second_call_reuses_the_newest_complete_run(synthetic_path, tmp_path, capsys):
    cfg = syn(synthetic_path)
    first = run_experiment(cfg, results=tmp_path, progress=False, reuse=True)
    assert "reusing" not in capsys.readouterr().out  # nothing to reuse yet: it ran
    again = run_experiment(syn(synthetic_path), results=tmp_path, progress=False, reuse=True)
    assert again.run_dir == first.run_dir and folders(tmp_path) == [first.run_dir]
    assert f"memlab: reusing {first.run_dir}" in capsys.readouterr().out
    assert again.info["reused"] is True and "reused" not in json.loads((first.run_dir / "run.json").read_text())
    pd.testing.assert_frame_equal(again.predictions, first.predictions, check_dtype=False)
    pd.testing.assert_frame_equal(again.summary, first.summary, check_dtype=False)
    fresh = run_experiment(cfg, results=tmp_path, progress=False)  # reuse is off by default: a fresh run
    assert fresh.run_dir != first.run_dir and len(folders(tmp_path)) == 2
    assert run_experiment(cfg, results=tmp_path, progress=False, reuse=True).run_dir == fresh.run_dir  # the newest
    assert f"memlab: reusing {fresh.run_dir}" in capsys.readouterr().out
    other = run_experiment(syn(synthetic_path, **{"retrieval.top_k": 3}), results=tmp_path, progress=False,
                           reuse=True)  # another config: it runs, saying why the newest run was not reused
    assert other.run_dir not in (first.run_dir, fresh.run_dir) and other.config.retrieval.top_k == 3
    assert "reusing" not in capsys.readouterr().out  # runs of other configs under the name are passed over quietly


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """A complete run of ``syn`` on the synthetic sample: (data file, run folder)."""
    from tests.conftest import synthetic_samples

    root = tmp_path_factory.mktemp("reuse")
    path = root / "synthetic_locomo.json"
    path.write_text(json.dumps(synthetic_samples()), encoding="utf-8")
    return path, run_experiment(syn(path), results=root / "results", progress=False).run_dir


def verdict(run_dir: Path, cfg: ExperimentConfig, tmp_path: Path, edit=None) -> tuple[object, str | None]:
    """What reuse finds for ``cfg`` in a results root holding a copy of ``run_dir`` (its run.json edited)."""
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    if edit is not None:
        edit_run_json(copy, edit)
    return reusable_run(tmp_path, prepare(cfg, {}, None))


def test_the_copy_of_a_complete_run_is_found(finished, tmp_path):
    path, run_dir = finished
    run, why = verdict(run_dir, syn(path), tmp_path)
    assert run is not None and run.run_dir == tmp_path / run_dir.name and why is None


@pytest.mark.parametrize("over", [{"retrieval.top_k": 3}, {"dataset.question_limit": 2}, {"run.seed": 7},
                                  {"extraction.reconcile.skip_jaccard": 0.5}, {"answer.params.abstain_margin": 0.5}],
                         ids=lambda o: next(iter(o)))
def test_any_config_difference_is_not_reused(over, finished, tmp_path):
    path, run_dir = finished
    assert verdict(run_dir, syn(path, **over), tmp_path) == (None, None)
    assert why_not(tmp_path / run_dir.name, prepare(syn(path, **over), {}, None)) == \
        f"config differs: {next(iter(over))}"


@pytest.mark.parametrize("edit,reason", [
    (lambda i: i.update(status="interrupted"), "status 'interrupted'"),
    (lambda i: i.update(status="failed"), "status 'failed'"),
    (lambda i: i.update(status="running"), "status 'running'"),
    (lambda i: i.update(status="complete-with-errors", errors=1), "status 'complete-with-errors'"),
    (lambda i: i.update(sessions=[{**i["sessions"][0], "status": "interrupted"}, i["sessions"][0]]),
     "finished over 2 sessions"),  # interrupted, then resumed
    (lambda i: i["components"]["custom"].update(answerer=True), "own component objects"),
    (lambda i: i.update(dataset_sha256="0" * 64), "dataset changed"),
    (lambda i: i["environment"].update(memlab_source_sha256="0" * 64), "memlab_source_sha256"),  # other code
    (lambda i: i["environment"].pop("memlab_source_sha256"), "memlab_source_sha256"),  # code not recorded
    (lambda i: i["environment"]["packages"].update(numpy="0.0"), "packages"),
], ids=["interrupted", "failed", "running", "errors", "resumed", "own-objects", "other-data", "other-code",
        "unknown-code", "other-packages"])
def test_a_run_that_did_not_finish_cleanly_or_differs_is_not_reused(edit, reason, finished, tmp_path):
    path, run_dir = finished
    run, why = verdict(run_dir, syn(path), tmp_path, edit)
    assert run is None and reason in why


def test_a_run_missing_its_tables_is_not_reused(finished, tmp_path):
    path, run_dir = finished
    shutil.copytree(run_dir, tmp_path / run_dir.name)
    (tmp_path / run_dir.name / "predictions.parquet").unlink()
    run, why = reusable_run(tmp_path, prepare(syn(path), {}, None))
    assert run is None and "cannot be read back" in why


def test_a_changed_data_file_runs_again(write_locomo, tmp_path, capsys):
    path = write_locomo()
    first = run_experiment(syn(path), results=tmp_path, progress=False)
    write_locomo(lambda s: s[0]["qa"][3].update(answer="Rexy"))  # same path, same questions, another gold answer
    other = run_experiment(syn(path), results=tmp_path, progress=False, reuse=True)
    assert other.run_dir != first.run_dir and "dataset changed" in capsys.readouterr().out
    assert other.predictions.set_index("qid").loc["syn-1/q3", "answer"] == "Rexy"


def test_an_errored_run_is_not_reused(finished, tmp_path):
    path, _ = finished
    errored = run_experiment(syn(path), results=tmp_path, progress=False, answerer=FlakyAnswerer({"syn-1/q1"}))
    assert errored.info["status"] == "complete-with-errors"
    run, why = reusable_run(tmp_path, prepare(syn(path), {}, None))
    assert run is None and "complete-with-errors" in why


def test_reuse_refuses_resume_and_own_objects(synthetic_path, tmp_path):
    first = run_experiment(syn(synthetic_path), results=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="resume"):
        run_experiment(None, resume=first.run_dir, progress=False, reuse=True)
    with pytest.raises(ConfigError, match="own component objects"):
        run_experiment(syn(synthetic_path), results=tmp_path, progress=False, reuse=True,
                       answerer=FlakyAnswerer(set()))
    with pytest.raises(ConfigError, match="own component objects"):  # every object run_experiment takes
        run_experiment(syn(synthetic_path), results=tmp_path, progress=False, reuse=True,
                       embedder=TfidfLSAEmbedder())


def test_grid_and_cli_reuse(synthetic_path, tmp_path, capsys):
    grid = syn(synthetic_path)
    grid.grid = {"retrieval.top_k": [3, 5]}
    runs = run_ablation(grid, results=tmp_path, progress=False, reuse=True)
    assert [r.run_dir for r in run_ablation(grid, results=tmp_path, progress=False, reuse=True)] == \
        [r.run_dir for r in runs]
    assert len(folders(tmp_path)) == 2
    cfg_file = tmp_path / "f.yaml"
    cfg_file.write_text(syn(synthetic_path).to_yaml())
    root = tmp_path / "cli"
    assert main(["run", str(cfg_file), "--results", str(root), "--reuse"]) == 0
    assert main(["run", str(cfg_file), "--results", str(root), "--reuse"]) == 0
    assert len(folders(root)) == 1 and "memlab: reusing" in capsys.readouterr().out
    assert main(["run", str(cfg_file), "--results", str(root)]) == 0  # without the flag: a fresh run
    assert len(folders(root)) == 2
    assert ExperimentConfig.from_yaml(cfg_file).name == "f"


def test_an_edited_file_the_config_names_is_not_reused(synthetic_path, tmp_path, capsys):
    errata = tmp_path / "errata.csv"
    errata.write_text("qid,answer\nsyn-1/q3,Rex\n")
    cfg = syn(synthetic_path, **{"scoring.errata": str(errata)})
    first = run_experiment(cfg, results=tmp_path, progress=False)
    assert reusable_run(tmp_path, prepare(cfg, {}, None))[0].run_dir == first.run_dir
    errata.write_text("qid,answer\nsyn-1/q3,invalid\n")  # same path, same config: other scores
    run, why = reusable_run(tmp_path, prepare(cfg, {}, None))
    assert run is None and "scoring.errata" in why


def test_a_run_of_another_name_and_the_same_recipe_is_copied_under_this_name(synthetic_path, tmp_path, capsys):
    """A name decides no result: a top-k sweep's k = 10 cell reuses the ``offline`` run, under its own name."""
    first = run_experiment(syn(synthetic_path), results=tmp_path, progress=False)
    renamed = syn(synthetic_path, name="g")
    copied = run_experiment(renamed, results=tmp_path, progress=False, reuse=True)
    assert copied.run_dir != first.run_dir and copied.run_dir.name.startswith("g-") and copied.config.name == "g"
    assert f"memlab: reusing {first.run_dir} as {copied.run_dir}" in capsys.readouterr().out
    info = json.loads((copied.run_dir / "run.json").read_text())
    assert info["copied_from"] == first.run_dir.name and info["run_id"] == copied.run_dir.name
    assert info["config"] == {**json.loads((first.run_dir / "run.json").read_text())["config"], "name": "g"}
    pd.testing.assert_frame_equal(copied.predictions, first.predictions, check_dtype=False)
    pd.testing.assert_frame_equal(copied.summary, first.summary, check_dtype=False)
    assert sorted(p.name for p in (copied.run_dir / "traces").iterdir()) == \
        sorted(p.name for p in (first.run_dir / "traces").iterdir())
    again = run_experiment(renamed, results=tmp_path, progress=False, reuse=True)  # now reused under its own name
    assert again.run_dir == copied.run_dir and len(folders(tmp_path)) == 2
    assert f"memlab: reusing {copied.run_dir} (complete" in capsys.readouterr().out
    other = run_experiment(syn(synthetic_path, name="h", **{"retrieval.top_k": 3}), results=tmp_path,
                           progress=False, reuse=True)  # another name and another recipe: it runs
    assert "copied_from" not in other.info and "reusing" not in capsys.readouterr().out
    assert len(folders(tmp_path)) == 3


def test_a_failed_copy_leaves_no_folder_and_runs_afresh(synthetic_path, tmp_path, capsys, monkeypatch):
    import memlab.run.reuse as reuse

    first = run_experiment(syn(synthetic_path), results=tmp_path, progress=False)

    def full_disk(*a, **k):  # as a copy failing on every file would list them all
        raise OSError(28, "No space left on device: " + ", ".join(f"traces/t{i}.jsonl" for i in range(200)))

    monkeypatch.setattr(reuse, "copy_outputs", full_disk)  # the copy (issue 35: only the recorded outputs)
    fresh = run_experiment(syn(synthetic_path, name="g"), results=tmp_path, progress=False, reuse=True)
    out = capsys.readouterr().out
    assert f"memlab: not reusing {first.run_dir}: copying it under 'g' failed" in out
    assert max(len(ln) for ln in out.splitlines()) < 600  # before: the whole list, ~3,000 characters on one line
    assert "copied_from" not in fresh.info and folders(tmp_path) == sorted([first.run_dir, fresh.run_dir])


# ------------------------------------------------------------------ issue 35: a folder from elsewhere in the root
def _crafted_twin(src: Path, root: Path, name: str = "crafted-20260101-000000") -> Path:
    """A copy of a complete run under another name, as a folder from elsewhere could sit in the results root."""
    d = root / name
    shutil.copytree(src, d, symlinks=True)
    return d


@pytest.mark.parametrize("target, recorded", [("secret", False), ("secret", True), ("/dev/null", True)],
                         ids=["link-not-recorded", "link-recorded", "device"])
def test_reuse_copies_only_recorded_regular_files_never_through_a_link(target, recorded, synthetic_path, tmp_path,
                                                                         capsys):
    import hashlib

    secret = tmp_path / "outside" / "passwd"
    secret.parent.mkdir()
    secret.write_text("root:x:0:0:the users secret first line\n")
    root = tmp_path / "r"
    first = run_experiment(syn(synthetic_path), results=root, progress=False)
    twin = _crafted_twin(first.run_dir, root)
    shutil.rmtree(first.run_dir)  # only the crafted folder holds the recipe now
    link = twin / "traces" / "x"
    link.symlink_to(secret if target == "secret" else target)
    if recorded:  # the crafted run.json names the link, with the digest of what it points to
        edit_run_json(twin, lambda i: i["outputs"].update(
            {"traces/x": hashlib.sha256(Path(link).read_bytes()).hexdigest()}))
    run = run_experiment(syn(synthetic_path, name="g"), results=root, progress=False, reuse=True)
    out = capsys.readouterr().out
    copied = [p for p in run.run_dir.rglob("*") if p.is_file()]
    assert not any("the users secret" in p.read_text(errors="replace") for p in copied)  # before: copied whole
    assert not (run.run_dir / "traces" / "x").exists()
    if recorded:  # the crafted folder cannot be read back as a run: not used, the run ran afresh
        assert "copied_from" not in run.info and "reusing" not in out
        with pytest.raises(RunFileError, match="traces/x: (a symbolic link|not a regular file)"):
            verify_outputs(twin, json.loads((twin / "run.json").read_text())["outputs"])
    else:  # the recorded files only (the link was never a run's output)
        assert run.info["copied_from"] == twin.name


def test_an_edited_table_is_never_served_and_report_names_it(synthetic_path, tmp_path, capsys):
    first = run_experiment(syn(synthetic_path), results=tmp_path, progress=False)
    for name in ("predictions.parquet", "summary.parquet"):
        frame = pd.read_parquet(first.run_dir / name)
        frame["f1"] = 0.999
        frame.to_parquet(first.run_dir / name)
    again = run_experiment(syn(synthetic_path), results=tmp_path, progress=False, reuse=True)
    out = capsys.readouterr().out
    assert again.run_dir != first.run_dir  # before: "reusing ... (complete; same config, data and code)", F1 0.999
    assert "predictions.parquet: changed since the run completed" in out
    assert again.summary.loc["overall 1-5", "f1"] < 0.999
    assert main(["report", str(first.run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{first.run_dir / 'predictions.parquet'}: changed since the run completed" in err


def test_the_newest_run_is_chosen_by_its_recorded_completion_not_its_name(synthetic_path, tmp_path):
    older = run_experiment(syn(synthetic_path), results=tmp_path, progress=False)
    newer = run_experiment(syn(synthetic_path), results=tmp_path, progress=False)
    future = _crafted_twin(older.run_dir, tmp_path, name="f-20991231-235959")  # a name from the future
    assert run_experiment(syn(synthetic_path), results=tmp_path, progress=False, reuse=True).run_dir == \
        newer.run_dir  # before: the crafted folder, by its name
    edit_run_json(future, lambda i: i.update(completed_utc="2099-12-31T23:59:59+00:00"))
    assert run_experiment(syn(synthetic_path), results=tmp_path, progress=False, reuse=True).run_dir == \
        newer.run_dir  # a recorded time in the future is not believed
    assert "in the future" in why_not(future, prepare(syn(synthetic_path), {}, None))
