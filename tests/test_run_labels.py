"""Run labels (`memlab.run.labels`): short, unique, at most two config keys, and a legend with the full difference.

The runs here are run folders holding only their ``config.yaml`` (what the labels read), made from the shipped
configs with the overrides a user would give, so the sets are the ones reports compare."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from memlab.run import ExperimentConfig
from memlab.run.labels import LABEL_KEYS, LABEL_MAX, legend_lines, run_labels, run_legend


def folder(root: Path, dirname: str, config: str, **overrides) -> SimpleNamespace:
    """A run folder with the config a run of ``config`` with ``overrides`` writes, as a run object."""
    cfg = ExperimentConfig.from_yaml(config)
    cfg = cfg.with_overrides(overrides) if overrides else cfg
    d = root / dirname
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    return SimpleNamespace(run_dir=d, config=cfg)


def check_bounds(labels: list[str]) -> None:
    assert len(set(labels)) == len(labels), labels
    assert all(len(lab) <= LABEL_MAX + len(" #99") for lab in labels), labels
    assert all(lab.count("=") <= LABEL_KEYS for lab in labels), labels


def test_a_top_k_grid_is_named_by_k(tmp_path):
    runs = [folder(tmp_path, f"topk-top_k{k}", "topk-ablation", **{"retrieval.top_k": k, "name": f"topk-top_k{k}"})
            for k in (5, 10, 20, 40)]
    labels = run_labels(runs)
    assert labels == ["topk k=5", "topk k=10", "topk k=20", "topk k=40"]
    legend = run_legend(runs)
    assert legend.differs.tolist() == [f"retrieval.top_k={k}" for k in (5, 10, 20, 40)]
    assert legend.folder.tolist() == [str(r.run_dir) for r in runs]


def test_systems_that_differ_in_many_keys_are_named_by_their_config(tmp_path):
    """offline, retrieval-best and mem0-offline differ in a dozen keys: the names tell them apart; the legend
    keeps every key (with main's labels these were the ~250-character ones)."""
    runs = [folder(tmp_path, c, c) for c in ("offline", "retrieval-best", "mem0-offline")]
    labels = run_labels(runs)
    assert labels == ["offline", "retrieval-best", "mem0-offline"]
    legend = run_legend(runs)
    best = dict(kv.split("=", 1) for kv in legend.differs[1].split("; "))
    assert best["index.sparse.name"] == "splade" and best["retrieval.fusion"] == "zscore" and len(best) >= 8
    assert "system.name=mem0" in legend.differs[2]
    lines = legend_lines(legend)
    assert lines[1].startswith(f"retrieval-best: {runs[1].run_dir} (") and "index.sparse.name=splade" in lines[1]


def test_two_arms_of_one_name_with_many_differences_show_at_most_two_keys(tmp_path):
    runs = [folder(tmp_path, "a", "offline", **{"retrieval.top_k": 20}),
            folder(tmp_path, "b", "retrieval-best", **{"name": "offline", "retrieval.top_k": 10})]
    labels = run_labels(runs)
    check_bounds(labels)
    assert labels[0].startswith("offline ") and labels[1].startswith("offline ")
    assert labels[0].split(" ", 1)[1] != labels[1].split(" ", 1)[1]
    assert len(run_legend(runs).differs[1].split("; ")) > LABEL_KEYS  # the legend has what the label leaves out


def test_the_key_that_varies_is_chosen_over_one_that_only_one_run_changes(tmp_path):
    runs = [folder(tmp_path, f"k{k}", "offline", **{"retrieval.top_k": k}) for k in (5, 10, 20)]
    runs.append(folder(tmp_path, "k20b", "offline", **{"retrieval.top_k": 20, "retrieval.participant_boost": False}))
    labels = run_labels(runs)
    check_bounds(labels)
    assert labels[:3] == ["offline k=5", "offline k=10", "offline k=20"]
    assert labels[3] == "offline k=20, participant_boost=False"
    assert "retrieval.participant_boost=True" in run_legend(runs).differs[0]


def test_identical_configs_differing_only_in_seed_or_data(tmp_path):
    seeds = [folder(tmp_path, f"s{s}", "offline", **{"run.seed": s}) for s in (0, 1, 2)]
    assert run_labels(seeds) == ["offline seed=0", "offline seed=1", "offline seed=2"]
    other = tmp_path / "other-data.json"
    data = [folder(tmp_path, "d1", "offline", **{"dataset.path": "/data/locomo10.json"}),
            folder(tmp_path, "d2", "offline", **{"dataset.path": str(other)})]
    assert run_labels(data) == ["offline data=locomo10.json", "offline data=other-data.json"]
    assert run_legend(data).differs.tolist() == ["dataset.path=/data/locomo10.json", f"dataset.path={other}"]


def test_reruns_of_one_config_get_a_short_number_and_the_legend_their_folders(tmp_path):
    runs = [folder(tmp_path, f"offline-2026120{i}-093000-rerun-with-a-long-folder-name", "offline")
            for i in (1, 2)]
    runs.append(folder(tmp_path, "k20", "offline", **{"retrieval.top_k": 20}))
    labels = run_labels(runs)
    assert labels == ["offline k=10 #1", "offline k=10 #2", "offline k=20"]
    legend = run_legend(runs)
    assert legend.folder.tolist()[:2] == [str(r.run_dir) for r in runs[:2]]
    twins = run_legend(runs[:2])
    assert twins.run.tolist() == ["offline #1", "offline #2"] and twins.differs.tolist() == ["identical config"] * 2


def test_long_values_are_cut_and_still_unique(tmp_path):
    long_a = "answer with the exact words of the memory, quoting it in full"
    runs = [folder(tmp_path, "p1", "offline", **{"answer.name": "extractive", "extraction.name": "turns",
                                                  "retrieval.top_k": 7, "dataset.path": f"/x/{long_a}-1.json"}),
            folder(tmp_path, "p2", "offline", **{"answer.name": "extractive", "extraction.name": "turns",
                                                  "retrieval.top_k": 7, "dataset.path": f"/x/{long_a}-2.json"})]
    labels = run_labels(runs)
    check_bounds(labels)
    assert all(len(lab) <= LABEL_MAX + 3 for lab in labels) and "…" in labels[0]
    assert run_legend(runs).differs[0] == f"dataset.path=/x/{long_a}-1.json"  # whole in the legend


@pytest.mark.parametrize("n", [2, 6])
def test_many_keys_varying_at_once_stay_within_two_keys_and_unique(tmp_path, n):
    runs = [folder(tmp_path, f"r{i}", "offline", **{"retrieval.top_k": 5 + i, "run.seed": i % 2,
                                                    "retrieval.participant_boost": bool(i % 3)}) for i in range(n)]
    runs.append(folder(tmp_path, "twin", "offline", **{"retrieval.top_k": 5, "run.seed": 0,
                                                       "retrieval.participant_boost": True}))
    labels = run_labels(runs)
    check_bounds(labels)
    assert all(lab.startswith("offline") for lab in labels)
