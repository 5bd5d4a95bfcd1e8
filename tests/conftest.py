"""Shared fixtures: the real LoCoMo file (skipped with a reason where absent) and a small synthetic sample."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo10.json"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# memlab's per-user state (which endpoints each run was started with) goes to a scratch folder, not ~/.local/state
os.environ.setdefault("MEMLAB_STATE", tempfile.mkdtemp(prefix="memlab-state-"))
# the machine cache (model vectors shared by results roots) of this session, never the user's ~/.cache/memlab
os.environ["MEMLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="memlab-machine-cache-")


def real_locomo_path() -> Path | None:
    env = os.environ.get("MEMLAB_LOCOMO")
    for cand in (env, str(SHARED_LOCOMO)):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


@pytest.fixture(scope="session")
def locomo_path() -> Path:
    p = real_locomo_path()
    if p is None:
        pytest.skip("real LoCoMo-10 file absent: set MEMLAB_LOCOMO or place it at ../shared/data/locomo/locomo10.json")
    return p


def pytest_collection_modifyitems(items):
    """A test over the full LoCoMo file is ``slow`` (``-m "not slow"`` skips them; ``make test`` runs all)."""
    for item in items:
        if {"locomo", "locomo_path", "warm_results"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


#: The extraction configs the conv-26 tests and notebooks run (the offline demo's, plain turns, observations).
WARM_EXTRACTORS = ("turns+observations", "turns", "observations")


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory, locomo_path) -> Path:
    """``<root>/.cache`` with conv-26 extracted and indexed once per session for `WARM_EXTRACTORS`
    (default store, index and reconcile), so tests that only need a fresh run folder skip re-extraction."""
    from memlab.run import ExperimentConfig, run_experiment

    root = tmp_path_factory.mktemp("warm-results")
    for extractor in WARM_EXTRACTORS:
        cfg = ExperimentConfig.from_dict({"name": "warm", "extraction": {"name": extractor}, "dataset": {
            "path": str(locomo_path), "conversations": ["conv-26"], "question_limit": 1}})
        run_experiment(cfg, results=root, progress=False)
    return root / ".cache"


@pytest.fixture
def warm_results(tmp_path, warm_cache) -> Path:
    """A fresh results root whose extraction/index cache is a copy of `warm_cache` (the model response cache
    is not copied: each test still sees its own model calls)."""
    root = tmp_path / "results"
    (root / ".cache").mkdir(parents=True)
    shutil.copytree(warm_cache / "extract", root / ".cache" / "extract")
    return root


@pytest.fixture(scope="session")
def locomo(locomo_path):
    from memlab.data import load_locomo

    return load_locomo(locomo_path)


def synthetic_samples() -> list[dict]:
    """Two small conversations in LoCoMo format: every category, a photo turn, one malformed evidence id."""
    conv1 = {
        "sample_id": "syn-1",
        "conversation": {
            "speaker_a": "Alice",
            "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Alice", "dia_id": "D1:1", "text": "I went to a pottery class yesterday."},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Nice! I adopted a dog named Rex last week."},
                {"speaker": "Alice", "dia_id": "D1:3", "text": "Look at my new vase.",
                 "img_url": ["http://example.invalid/x.jpg"], "blip_caption": "a photo of a blue vase",
                 "query": "blue vase"},
            ],
            "session_2_date_time": "10:04 am on 19 June, 2023",
            "session_2": [
                {"speaker": "Bob", "dia_id": "D2:1", "text": "Rex and I hiked Mount Tam on Sunday."},
                {"speaker": "Alice", "dia_id": "D2:2", "text": "I am moving to Sweden next year for work."},
            ],
            "session_3_date_time": "9:00 am on 1 July, 2023",
        },
        "qa": [
            {"question": "What pets and hobbies are mentioned?", "answer": "dog, pottery",
             "evidence": ["D1:1", "D1:2"], "category": 1},
            {"question": "When did Alice go to a pottery class?", "answer": "7 May 2023",
             "evidence": ["D1:1"], "category": 2},
            {"question": "Would Alice like living abroad?", "answer": "Likely yes; she is moving to Sweden",
             "evidence": ["D2:2"], "category": 3},
            {"question": "What is Bob's dog called?", "answer": "Rex", "evidence": ["D1:2"], "category": 4},
            {"question": "What is Alice's dog called?", "evidence": ["D1:2"], "category": 5,
             "adversarial_answer": "Rex"},
        ],
        "observation": {
            "session_1_observation": {
                "Alice": [["Alice took a pottery class.", "D1:1"]],
                "Bob": [["Bob adopted a dog named Rex.", "D1:2"]],
            },
            "session_2_observation": {
                "Bob": [["Bob hiked Mount Tam with Rex.", ["D2:1"]]],
                "Alice": [["Alice is moving to Sweden next year.", "D2:2"]],
            },
        },
        "session_summary": {"session_1_summary": "Alice and Bob talk pottery and dogs.",
                            "session_2_summary": "Hiking and moving."},
    }
    conv2 = {
        "sample_id": "syn-2",
        "conversation": {
            "speaker_a": "Carol",
            "speaker_b": "Dan",
            "session_1_date_time": "8:30 pm on 2 January, 2024",
            "session_1": [
                {"speaker": "Carol", "dia_id": "D1:1", "text": "I started learning violin."},
                {"speaker": "Dan", "dia_id": "D1:2", "text": "I run marathons, the last one in Boston."},
            ],
        },
        "qa": [
            {"question": "What instrument is Carol learning?", "answer": "violin",
             "evidence": ["D1:1"], "category": 4},
            {"question": "Where was Dan's last marathon?", "answer": "Boston",
             "evidence": ["D:1:2", "D9:9"], "category": 4},
        ],
        "observation": {},
        "session_summary": {},
    }
    return [conv1, conv2]


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> Path:
    """`synthetic_samples` written once per module: for modules whose runs share one Ray instance or cache."""
    p = tmp_path_factory.mktemp("data") / "synthetic_locomo.json"
    p.write_text(json.dumps(synthetic_samples()), encoding="utf-8")
    return p


@pytest.fixture
def synthetic_path(tmp_path) -> Path:
    p = tmp_path / "synthetic_locomo.json"
    p.write_text(json.dumps(synthetic_samples()), encoding="utf-8")
    return p


@pytest.fixture
def write_locomo(tmp_path):
    """Write a (possibly broken) variant of the synthetic samples; the callable edits a deep copy."""

    def _write(edit=None, raw_text: str | None = None) -> Path:
        p = tmp_path / "variant.json"
        if raw_text is not None:
            p.write_text(raw_text, encoding="utf-8")
            return p
        samples = copy.deepcopy(synthetic_samples())
        if edit is not None:
            edit(samples)
        p.write_text(json.dumps(samples), encoding="utf-8")
        return p

    return _write
