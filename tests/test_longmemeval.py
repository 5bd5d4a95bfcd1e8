"""LongMemEval through the LoCoMo data interface: loader, validation, scoring profile, retrieval metrics, runs."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from memlab.data import (
    LONGMEMEVAL_LABELS,
    LongMemEvalFormatError,
    detect_format,
    fetch_longmemeval,
    load_dataset,
    load_longmemeval,
)
from memlab.data.json_stream import iter_items


def _s(*turns: tuple[str, str, bool]) -> list[dict]:
    out = []
    for role, content, has in turns:
        t = {"role": role, "content": content}
        if has:
            t["has_answer"] = True
        out.append(t)
    return out


FILLER = _s(("user", "Can you help me plan a weekly grocery list?", False),
            ("assistant", "Sure: vegetables, rice, eggs and some fruit for the week.", False))


def _item(qid, qtype, question, answer, sessions, answer_sids, qdate="2023/06/30 (Fri) 10:00"):
    sids = [f"{qid}_s{i}" for i in range(1, len(sessions) + 1)]
    dates = [f"2023/05/{10 + i:02d} ({d}) 09:{i:02d}" for i, d in
             zip(range(1, len(sessions) + 1), ["Thu", "Fri", "Sat", "Sun", "Mon"])]
    return {"question_id": qid, "question_type": qtype, "question": question, "answer": answer,
            "question_date": qdate, "haystack_session_ids": sids, "haystack_dates": dates,
            "haystack_sessions": sessions, "answer_session_ids": [sids[i - 1] for i in answer_sids]}


def lme_items() -> list[dict]:
    """Seven questions: every type, an abstention one, multi-session evidence, a knowledge update, dates."""
    return [
        _item("q-ssu", "single-session-user", "What breed is my dog?", "golden retriever",
              [FILLER, _s(("user", "My dog is a golden retriever named Biscuit.", True),
                          ("assistant", "Golden retrievers are lovely companions.", False))], [2]),
        _item("q-ssa", "single-session-assistant", "Which pasta dish did you recommend to me?", "cacio e pepe",
              [_s(("user", "Suggest a quick pasta dinner.", False),
                  ("assistant", "I recommend cacio e pepe with pecorino and black pepper.", True)), FILLER], [1]),
        _item("q-ssp", "single-session-preference", "Can you suggest a weekend activity for me?",
              "The user would prefer hiking suggestions, since they love mountain trails.",
              [_s(("user", "I love hiking on mountain trails every weekend.", True),
                  ("assistant", "Mountain trails are a great way to unwind.", False)), FILLER], [1]),
        _item("q-ms", "multi-session", "How many instruments do I play?", 2,
              [_s(("user", "I started playing the violin last year.", True), ("assistant", "Wonderful!", False)),
               FILLER,
               _s(("user", "I also play the piano at church.", True), ("assistant", "Two instruments!", False))],
              [1, 3]),
        _item("q-ku", "knowledge-update", "Which city do I live in now?", "Denver",
              [_s(("user", "I live in Boston near the harbor.", False), ("assistant", "Nice city.", False)),
               _s(("user", "I just moved to Denver for my new job.", True), ("assistant", "Congrats!", False))],
              [2]),
        _item("q-tr", "temporal-reasoning", "How many days before my sister's wedding did I buy the dress?",
              "10 days",
              [_s(("user", "I bought a blue dress today for my sister's wedding.", True),
                  ("assistant", "Sounds lovely.", False)),
               _s(("user", "My sister's wedding was today, it was beautiful.", True),
                  ("assistant", "Congratulations to her!", False))], [1, 2]),
        _item("q-ssu_abs", "single-session-user", "What is my cat's name?",
              "You did not mention a cat; you mentioned your dog Biscuit.",
              [_s(("user", "My dog Biscuit loves the park.", False), ("assistant", "Parks are fun.", False)),
               FILLER], []),
    ]


@pytest.fixture
def lme_path(tmp_path) -> Path:
    p = tmp_path / "lme.json"
    p.write_text(json.dumps(lme_items()), encoding="utf-8")
    return p


def write_items(tmp_path: Path, items: list[dict], name: str = "bad.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(items), encoding="utf-8")
    return p


def test_records_follow_the_locomo_interface(lme_path):
    data = load_longmemeval(lme_path)
    assert len(data) == 7 and [c.sample_id for c in data][0] == "q-ssu"
    c = data["q-ms"]
    assert c.speakers == ("user", "assistant") and [s.index for s in c.sessions] == [1, 2, 3]
    q = c.questions[0]
    assert q.qid == "q-ms/q0" and q.answer == "2" and q.evidence_ids == ("S1:1", "S3:1")  # two sessions
    assert q.category == 4 and q.category_label == "multi-session" and q.answer_sessions == (1, 3)
    assert c.turn("S3:1").text == "I also play the piano at church." and c.turn("S3:1").speaker == "user"
    assert c.sessions[0].date_time.isoformat() == "2023-05-11T09:01:00"
    assert q.question_date.isoformat() == "2023-06-30T10:00:00"
    ab = data["q-ssu_abs"].questions[0]
    assert ab.abstention and ab.category == 5 and ab.question_type == "single-session-user" and ab.evidence_ids == ()
    assert sorted({x.category for x in data.questions}) == [1, 2, 3, 4, 5, 6, 7]
    assert {x.category_label for x in data.questions} == set(LONGMEMEVAL_LABELS.values())
    assert data.type_counts() == {"single-session-user": 2, "single-session-assistant": 1,
                                  "single-session-preference": 1, "multi-session": 1, "knowledge-update": 1,
                                  "temporal-reasoning": 1, "abstention": 1}
    assert data.report.questions_without_evidence == [] and data.report.sessions_shifted == []
    ku = data["q-ku"]
    assert ku.questions[0].evidence_ids == ("S2:1",) and "Boston" in ku.turn("S1:1").text  # the old value stays


def _break(mutate):
    items = lme_items()
    mutate(items)
    return items


@pytest.mark.parametrize("mutate, needle", [
    (lambda it: it[1].update(question_type="single-hop"),
     "question q-ssa (#1): key 'question_type': expected one of ['single-session-user'"),
    (lambda it: it[3]["haystack_dates"].pop(),
     "question q-ms (#3): key 'haystack_sessions': expected as many sessions as haystack_session_ids (3) "
     "and haystack_dates (2); got str '3 sessions'"),
    (lambda it: it[4]["haystack_sessions"][1][1].update(role="system"),
     "question q-ku (#4): session 'q-ku_s2' (#2): turn 2: key 'role': expected 'user' or 'assistant'; "
     "got str 'system'"),
    (lambda it: it[5].update(answer_session_ids=["q-tr_s9"]),
     "question q-tr (#5): key 'answer_session_ids': expected ids of sessions in this question's haystack; "
     "got str 'q-tr_s9'"),
    (lambda it: it[0]["haystack_dates"].__setitem__(0, "May 11, 2023"),
     "question q-ssu (#0): session 'q-ssu_s1' (#1): key 'haystack_dates': expected a date like "
     "'2023/05/20 (Sat) 02:21'; got str 'May 11, 2023'"),
    (lambda it: it[0]["haystack_sessions"][1][0].update(has_answer="yes"),
     "session 'q-ssu_s2' (#2): turn 1: key 'has_answer': expected true or false"),
    (lambda it: it.append(copy.deepcopy(it[0])),
     "question q-ssu (#7): key 'question_id': expected unique ids (also #0)"),
    (lambda it: it[2].pop("question_date"), "question q-ssp (#2): key 'question_date': expected every LongMemEval"),
])
def test_malformed_items_are_named(tmp_path, mutate, needle):
    p = write_items(tmp_path, _break(mutate))
    with pytest.raises(LongMemEvalFormatError) as e:
        load_longmemeval(p)
    assert str(p) in str(e.value) and needle in str(e.value), str(e.value)


def test_report_collects_data_quality_facts(tmp_path):
    items = lme_items()
    items[0]["haystack_sessions"][1][0]["has_answer"] = False  # an answerable question without evidence
    items[3]["haystack_dates"][2] = items[3]["haystack_dates"][0]  # session 3 starts with session 1 (2 turns)
    data = load_longmemeval(write_items(tmp_path, items))
    assert data.report.questions_without_evidence == ["q-ssu"]
    assert data.report.sessions_shifted == [("q-ms", 3, 2.0)]  # after session 1's last turn (+1 s), before 2
    ms = data["q-ms"].sessions
    assert ms[2].date_time_raw == ms[0].date_time_raw and (ms[2].date_time - ms[0].date_time).total_seconds() == 2
    assert "1 answerable questions without has_answer turns" in data.report.summary()


def test_sessions_sharing_a_date_are_all_extracted(tmp_path):
    """Turn timestamps are session date + 1 s per turn and extraction reads after its cursor: without
    moving sessions apart, the sessions that share the first one's date were silently never stored."""
    from memlab.run import ExperimentConfig, run_experiment

    items = lme_items()
    for i in (1, 2):
        items[3]["haystack_dates"][i] = items[3]["haystack_dates"][0]
    p = write_items(tmp_path, items, "same-dates.json")
    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(p),
                                                                 "dataset.conversations": ["q-ms"]})
    with pytest.warns(UserWarning):
        run = run_experiment(cfg, results=tmp_path / "res", progress=False)
    mems = [json.loads(x) for x in open(run.run_dir / "traces" / "memories.jsonl")]
    assert sorted(s for m in mems for s in m["source_ids"]) == ["S1:1", "S1:2", "S2:1", "S2:2", "S3:1", "S3:2"]


def test_format_is_told_by_fields(lme_path, synthetic_path, tmp_path):
    assert detect_format(lme_path) == "longmemeval" and detect_format(synthetic_path) == "locomo"
    assert type(load_dataset(lme_path)).__name__ == "LongMemEval"
    assert type(load_dataset(synthetic_path)).__name__ == "LoCoMo"
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"id": 1, "text": "hello"}]))
    with pytest.raises(ValueError, match="neither a LoCoMo file"):
        detect_format(other)


def test_items_stream_across_chunk_boundaries(lme_path):
    whole = json.loads(lme_path.read_text())
    assert list(iter_items(lme_path, chunk_size=7)) == whole  # an item never needs the whole file
    bad = lme_path.with_name("trunc.json")
    bad.write_text(lme_path.read_text()[:-40])
    with pytest.raises(LongMemEvalFormatError, match="not valid JSON"):
        list(iter_items(bad, chunk_size=64, error=LongMemEvalFormatError))


def test_fetch_verifies_the_pinned_digest_and_names_what_to_do(tmp_path, lme_path, capsys):
    """Every variant has a pinned sha256 (and the release revision in its URL); a download that does not match
    it is refused, nothing written, the message naming both digests and the ways on; ``--unpinned`` downloads and
    prints the digest it computed, saying it differs from the pinned one."""
    import re

    from memlab.cli import main
    from memlab.data import LONGMEMEVAL_FILES, ChecksumMismatchError
    from memlab.data.fetch import LONGMEMEVAL_BASE, LONGMEMEVAL_REVISION
    from tests.test_data import _Server

    assert LONGMEMEVAL_REVISION in LONGMEMEVAL_BASE
    for name, digest, size in LONGMEMEVAL_FILES.values():
        assert re.fullmatch(r"[0-9a-f]{64}", digest) and size > 10_000_000, name
    payload = lme_path.read_bytes()
    srv = _Server(payload)
    base = srv.url.rsplit("/", 1)[0] + "/"
    try:
        dest = tmp_path / "s.json"
        with pytest.raises(ChecksumMismatchError) as e:
            fetch_longmemeval("longmemeval-s", dest=dest, base_url=base)
        assert LONGMEMEVAL_FILES["longmemeval-s"][1] in str(e.value) and "--unpinned" in str(e.value)
        assert not dest.exists()
        assert main(["data", "fetch", "longmemeval-s", "--unpinned", "--url", base, "--dest", str(dest)]) == 0
        out = capsys.readouterr().out
        assert f"sha256 {__import__('hashlib').sha256(payload).hexdigest()}" in out and "differs from the pinned" in out
    finally:
        srv.close()
    with pytest.raises(ValueError, match="expected one of longmemeval-s"):
        fetch_longmemeval("longmemeval-xl")


def test_cli_data_info_recognises_longmemeval(lme_path, capsys):
    from memlab.cli import main

    assert main(["data", "info", str(lme_path)]) == 0
    out = capsys.readouterr().out
    assert "format longmemeval" in out and "questions 7" in out
    assert "temporal-reasoning" in out and "abstention" in out


# ---------------------------------------------------------------------------- scoring profile
def test_profile_prompts_per_type_and_strict_verdicts():
    from memlab.eval.profiles import get_profile, parse_yes_no

    prof = get_profile("longmemeval")
    assert prof.labels[6] == "knowledge-update" and prof.labels[5] == "abstention"
    assert prof.judge_prompt_for(7) == "longmemeval-temporal-reasoning"
    assert prof.judge_prompt_for(6) == "longmemeval-knowledge-update"
    assert prof.judge_prompt_for(3) == "longmemeval-preference"
    assert prof.judge_prompt_for(5) == "longmemeval-abstention"
    assert prof.judge_prompt_for(1) == prof.judge_prompt_for(4) == "longmemeval-default"
    text = prof.judge_messages("Q?", "18 days", "19 days", prof.judge_prompt_for(7))[0]["content"]
    assert "off by one" in text and "Reference answer: 18 days" in text and "19 days" in text
    ku = prof.judge_messages("Q", "Denver", "x", prof.judge_prompt_for(6))[0]["content"]
    assert "superseded value" in ku and "(the updated value): Denver" in ku
    assert "Rubric:" in prof.judge_messages("Q", "likes hiking", "x", prof.judge_prompt_for(3))[0]["content"]
    assert "unanswerable" in prof.judge_messages("Q", "not said", "x", prof.judge_prompt_for(5))[0]["content"]
    assert parse_yes_no("Yes") and parse_yes_no(" yes.\n") and not parse_yes_no("**No**")
    for bad in ("yes, but no", "The answer is yes", "", "y", "no no"):
        with pytest.raises(ValueError, match="not one verdict"):
            parse_yes_no(bad)
    assert prof.f1("Denver", "Denver", 6) == 1.0 and prof.f1("I don't know; no information available", "x", 5) == 1.0
    assert math.isclose(prof.f1("blue, red", "blue, red", 1), 1.0)  # no multi-hop comma split here


def test_profile_guard_refuses_locomo_counts():
    import pandas as pd

    from memlab.eval.profiles import ProfileError, check_categories, get_profile

    prof = get_profile("longmemeval")
    check_categories(pd.Series([1, 2, 3, 4, 5, 6, 7]), prof.category_counts)  # LongMemEval numbers pass
    with pytest.raises(ProfileError, match="exceed the published"):
        check_categories(pd.Series([4] * 841), prof.category_counts)  # LoCoMo's single-hop count
    with pytest.raises(ProfileError, match="not categories"):
        check_categories(pd.Series([6]), get_profile("locomo").category_counts)


# ---------------------------------------------------------------------------- retrieval metrics
def test_official_retrieval_metrics_hand_worked():
    from memlab.eval.longmemeval_tables import question_retrieval

    # turns ranked S2:1, S1:1, S3:1, S1:2 (the last memory cites two turns; S1:1 counts once, first)
    m = question_retrieval([["S2:1"], ["S1:1"], ["S3:1"], ["S1:2", "S1:1"]], ["S1:1", "S3:1"], [1, 3])
    ideal = 1 + 1 / math.log2(2)  # two relevant: ranks 1 and 2
    got = 0 + 1 / math.log2(2) + 1 / math.log2(3)  # relevant at ranks 2 and 3
    assert math.isclose(m["turn_ndcg_any@5"], got / ideal) and m["turn_recall_all@5"] == 1.0
    # sessions in order of first turn: S2, S1, S3 -> the same pattern at session level
    assert math.isclose(m["session_ndcg_any@5"], got / ideal) and m["session_recall_all@10"] == 1.0
    # an evidence turn beyond rank 50: recall_all@50 is 0, while ndcg still credits the first one
    ranked = [[f"S9:{i}"] for i in range(1, 55)] + [["S1:1"]]
    far = question_retrieval([["S3:1"], *ranked], ["S3:1", "S1:1"], [3, 1])
    assert far["turn_recall_all@50"] == 0.0 and far["turn_recall_all@10"] == 0.0
    assert math.isclose(far["turn_ndcg_any@10"], 1 / ideal)
    assert far["session_recall_all@5"] == 1.0  # S3, S9, S1: both answer sessions among the first three
    none = question_retrieval([["S1:1"]], [], [])
    assert math.isnan(none["turn_recall_all@5"]) and math.isnan(none["session_ndcg_any@10"])


# ---------------------------------------------------------------------------- runs end to end
def test_offline_run_end_to_end(lme_path, tmp_path):
    from memlab import attribution
    from memlab.eval import longmemeval_tables as lme_eval
    from memlab.run import ExperimentConfig, run_experiment

    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(lme_path)})
    with pytest.warns(UserWarning, match="not the official LongMemEval metric"):
        run = run_experiment(cfg, results=tmp_path / "res", progress=False)
    info = run.info
    assert info["dataset_format"] == "longmemeval" and len(info["dataset_sha256"]) == 64
    assert run.config.scoring.profile == "longmemeval" and any("scoring.profile set" in n for n in info["notes"])
    s = run.summary
    assert list(s.index) == ["1", "2", "3", "4", "5", "6", "7", "overall 1-4", "overall 1-5"]
    assert s.loc["6", "label"] == "knowledge-update" and s.loc["7", "label"] == "temporal-reasoning"
    assert s.loc["overall 1-5", "n"] == 7 and s.loc["overall 1-4", "n"] == 6  # 1-4: all but abstention
    assert s.loc["overall 1-5", "f1_lo"] <= s.loc["overall 1-5", "f1"] <= s.loc["overall 1-5", "f1_hi"]
    assert s.loc["4", "recall@10"] == 1.0  # multi-session: both evidence turns found
    tables = lme_eval.report(run.run_dir)
    acc, retr = tables["accuracy"], tables["retrieval"]
    assert acc.loc["single-session-user", "n"] == 2 and acc.loc["abstention", "n"] == 1  # abs counted in its type
    assert "f1 (not the official metric)" in acc.columns and "j" not in acc.columns  # no judge: no J
    assert retr.loc["overall", "n"] == 6 and "5" not in retr.index  # abstention skipped
    assert {"turn_recall_all@50", "session_ndcg_any@10", "recall@10"} <= set(retr.columns)
    assert retr.loc["6", "turn_ndcg_any@10"] < 1.0  # the old value (Boston) outranks the update
    att = attribution.attribute(run)
    assert set(att["qid"]) <= {q for q in run.predictions.qid}
    labels = att.set_index("qid")["label"]
    assert labels["q-ssu_abs/q0"] == "abstain-error"  # the abstention question has no evidence by design: no issue
    # this fixture dates the dress and the wedding sessions a day apart, so its "10 days" contradicts them
    assert labels["q-tr/q0"] == "label-issue" and "10 days" in att.set_index("qid").loc["q-tr/q0", "reason"]


def test_scripted_judge_run(lme_path, tmp_path):
    from memlab.eval import longmemeval_tables as lme_eval
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.testing import Reply, ScriptedServer

    def judge(body):
        prompt = body["messages"][0]["content"]
        if "treat the question as unanswerable" in prompt:
            return Reply(text="Maybe.")  # not a verdict: a judge error, never scored
        if "off by one" in prompt:
            return Reply(text="Yes")
        return Reply(text="yes" if "Reference answer: golden retriever" in prompt else "No.")

    with ScriptedServer(responder=judge) as srv:
        cfg = ExperimentConfig.from_yaml("offline").with_overrides(
            {"dataset.path": str(lme_path), "judge.model": "openai/scripted-judge", "models.api_base": srv.api_base,
             "models.max_retries": 1})
        with pytest.warns(UserWarning):
            run = run_experiment(cfg, results=tmp_path / "res", progress=False)
        prompts = [r["messages"][0]["content"] for r in srv.requests]
    assert len(prompts) == 7
    # one prompt per type: temporal, knowledge update, preference, abstention each once, the default three times
    assert [sum(k in p for p in prompts) for k in ("off by one", "superseded", "Rubric:", "unanswerable")] == [1] * 4
    assert sum("single-session-user,\nsingle-session-assistant and multi-session" in p for p in prompts) == 3
    p = run.predictions.set_index("qid")
    assert p.loc["q-ssu/q0", "j"] == 1.0 and p.loc["q-tr/q0", "j"] == 1.0 and p.loc["q-ku/q0", "j"] == 0.0
    assert math.isnan(p.loc["q-ssu_abs/q0", "j"]) and "not one verdict" in p.loc["q-ssu_abs/q0", "judge_error"]
    assert run.info["judge_errors"] == 1
    acc = lme_eval.report(run.run_dir)["accuracy"]
    assert acc.loc["temporal-reasoning", "j"] == 1.0 and acc.loc["knowledge-update", "j"] == 0.0
    assert acc.loc["overall", "j"] == pytest.approx(2 / 6)  # the failed verdict drops out, never scored as 0
    assert acc.loc["overall", "j_lo"] <= 2 / 6 <= acc.loc["overall", "j_hi"]


def test_report_labels_categories_by_type(lme_path, tmp_path):
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.run.report import report_table

    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(lme_path),
                                                                 "dataset.categories": [6, 7]})
    with pytest.warns(UserWarning):
        run = run_experiment(cfg, results=tmp_path / "res", progress=False)
    t = report_table([run.run_dir], warn=False)
    assert {"6 knowledge-update", "7 temporal-reasoning"} <= set(t["category"])  # not LoCoMo's labels


def test_fetch_verifies_a_given_checksum_and_downloads_unpinned_on_request(tmp_path, lme_path):
    import hashlib

    from memlab.data import ChecksumMismatchError
    from tests.test_data import _Server

    payload = lme_path.read_bytes()
    srv = _Server(payload)
    base = srv.url.rsplit("/", 1)[0] + "/"
    try:
        dest = tmp_path / "dl" / "s.json"
        with pytest.raises(ChecksumMismatchError, match="does not match"):
            fetch_longmemeval("longmemeval-s", dest=dest, sha256="0" * 64, base_url=base)
        assert not dest.exists()
        good = hashlib.sha256(payload).hexdigest()
        assert fetch_longmemeval("longmemeval-s", dest=dest, sha256=good, base_url=base) == dest
        assert len(load_dataset(dest)) == 7
        dest.unlink()
        assert fetch_longmemeval("longmemeval-oracle", dest=dest, unpinned=True, base_url=base).read_bytes() == payload
    finally:
        srv.close()


@pytest.mark.parametrize("arm", ["original", "long-context"])
def test_model_arms_get_the_question_date(lme_path, tmp_path, arm):
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.testing import ScriptedServer
    from tests.scripted_model import responder

    with ScriptedServer(responder=responder) as srv:
        cfg = ExperimentConfig.from_dict({
            "name": arm, "dataset": {"path": str(lme_path), "conversations": ["q-tr"]},
            "extraction": {"name": "turns"}, "answer": {"name": arm, "model": "openai/scripted-reader"},
            "models": {"api_base": srv.api_base, "max_retries": 1}})
        with pytest.warns(UserWarning):
            run = run_experiment(cfg, results=tmp_path / "res", progress=False)
        user = [m["content"] for r in srv.requests for m in r["messages"] if m["role"] == "user"]
    assert run.info["errors"] == 0 and user
    assert user[0].endswith("(Current date: 2023/06/30 (Fri) 10:00.)") and user[0].startswith("How many days")


def test_run_streams_one_haystack_at_a_time_with_the_staged_results(lme_path, tmp_path, monkeypatch):
    """Each question's key is extracted, indexed, answered and released before the next: the index never holds
    more than one key while answering (the staged run held all seven), and the predictions, retrieval ranks and
    scores are the staged run's; a rerun on the cached extraction reads each key's saved fit back."""
    import warnings

    import pandas as pd

    from memlab.answer.extractive import ExtractiveAnswerer
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.run import engine as engine_mod

    class Probe(ExtractiveAnswerer):
        """The extractive arm, noting how many keys the index holds as each question is answered."""

        seen: list[int] = []

        def answer(self, question, ctx):
            Probe.seen.append(len(ctx.service.searcher.keys()))
            return super().answer(question, ctx)

    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(lme_path)})
    warnings.simplefilter("ignore", UserWarning)
    streamed = run_experiment(cfg, results=tmp_path / "a", progress=False, answerer=Probe())
    assert len(Probe.seen) == 7 and max(Probe.seen) == 1, Probe.seen
    assert streamed.info["extraction"]["max_resident_keys"] == 1 and streamed.info["extraction"]["streamed"]
    rerun = run_experiment(cfg, results=tmp_path / "a", progress=False)  # extraction and index fits cached
    assert rerun.info["extraction"]["from_cache"]
    monkeypatch.setattr(engine_mod, "streams", lambda data: False)  # the staged plan: every key in one wave
    staged = run_experiment(cfg, results=tmp_path / "b", progress=False)
    cols = ["prediction", "retrieved_ids", "f1", "recall@5", "recall@10", "answer_ceiling", "evidence_recall"]
    for other in (rerun, staged):
        pd.testing.assert_frame_equal(streamed.predictions[cols], other.predictions[cols])
        keep = [c for c in streamed.summary.columns if "latency" not in c]
        pd.testing.assert_frame_equal(streamed.summary[keep], other.summary[keep])
    for name in ("memories", "extraction"):
        a = (streamed.run_dir / "traces" / f"{name}.jsonl").read_text().splitlines()
        b = (staged.run_dir / "traces" / f"{name}.jsonl").read_text().splitlines()
        assert len(a) == len(b) > 0


def _parsed_haystacks(ids: set[str], besides: list | None = None) -> int:
    """Parsed conversations of these question ids alive in the process (not the loader's `Haystack` refs), but
    those ``besides``."""
    import gc

    from memlab.data import Conversation

    mine = {id(o) for o in besides or ()}
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Conversation and o.sample_id in ids and id(o) not in mine)


def test_loader_keeps_questions_not_haystacks(lme_path, tmp_path):
    """One validating pass keeps each question and its haystack's place in the file: no parsed haystack stays
    (the old loader held all seven); counts, the sha256 and every haystack are as a full parse gives them; a
    haystack read after the file changed is refused, never silently different."""
    import pickle

    from memlab.data import Conversation, sha256_file
    from memlab.data.longmemeval import _parse_item, haystack

    haystack.cache_clear()  # the last haystack an earlier test read (the same question ids)
    items = lme_items()
    ids = {it["question_id"] for it in items}
    data = load_longmemeval(lme_path)
    assert _parsed_haystacks(ids) == 0
    assert data.sha256 == sha256_file(lme_path)
    full = [_parse_item(it, i, str(lme_path), type(data.report)(path=str(lme_path))) for i, it in enumerate(items)]
    assert data.counts() == {"conversations": 7, "sessions": sum(len(c.sessions) for c in full),
                             "turns": sum(len(c.turns) for c in full), "questions": 7, "observations": 0}
    for ref, c in zip(data, full, strict=True):
        assert ref.sessions == c.sessions and ref.turns == c.turns and ref.questions == c.questions
        assert _parsed_haystacks(ids, full) == 1  # the last one read, no more
    copied = pickle.loads(pickle.dumps(data["q-ku"]))  # what a Ray task gets: the parsed conversation itself
    assert type(copied) is Conversation and copied.sessions == full[4].sessions
    lme_path.write_text(lme_path.read_text().replace("Denver", "Dallas"))  # same size, other content
    haystack.cache_clear()
    with pytest.raises(LongMemEvalFormatError, match="q-ku .*changed since the file was loaded"):
        data["q-ku"].load()
    bad = tmp_path / "extra.json"
    bad.write_text(json.dumps(items) + " []")
    with pytest.raises(LongMemEvalFormatError, match="extra data after the list"):
        load_longmemeval(bad)


def test_a_streamed_run_holds_one_parsed_haystack_at_a_time(tmp_path):
    """While each question is answered, the process holds that question's parsed haystack and no other (the
    whole file's were loaded before the run started)."""
    import warnings

    from memlab.answer.extractive import ExtractiveAnswerer
    from memlab.data.longmemeval import haystack
    from memlab.data.longmemeval_synthetic import write_synthetic
    from memlab.run import ExperimentConfig, run_experiment

    haystack.cache_clear()  # the last haystack an earlier test read
    path = tmp_path / "lme.json"
    write_synthetic(path, questions=5, sessions=6, turns=4, words=10)
    ids = {it["question_id"] for it in iter_items(path)}

    class Probe(ExtractiveAnswerer):
        seen: list[int] = []

        def answer(self, question, ctx):
            Probe.seen.append(_parsed_haystacks(ids))
            return super().answer(question, ctx)

    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(path)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        run = run_experiment(cfg, results=tmp_path / "r", progress=False, answerer=Probe())
    assert run.info["extraction"]["streamed"] and len(run.predictions) == 5
    assert Probe.seen == [1] * 5, Probe.seen


# ------------------------------------------------------------------ issue 35
@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_gold_answer_that_is_not_a_finite_number_is_refused_naming_the_question(value, tmp_path):
    p = write_items(tmp_path, lme_items())
    p.write_text(p.read_text().replace('"answer": 2', f'"answer": {value}', 1))
    with pytest.raises(LongMemEvalFormatError, match=r"question q-ms \(#3\): key 'answer': expected the gold answer "
                                                     r"\(a string or a finite number\)"):
        load_longmemeval(p)  # before: accepted, the gold "nan"


def test_a_longmemeval_run_is_not_rescored_under_a_locomo_profile(lme_path, tmp_path, capsys):
    from memlab.cli import main
    from memlab.run import ExperimentConfig, run_experiment

    cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(lme_path)})
    with pytest.warns(UserWarning):
        run = run_experiment(cfg, results=tmp_path / "res", progress=False)
    for args in (["rescore", str(run.run_dir), "--profile", "mem0"],
                 ["report", str(run.run_dir), "--profiles", "longmemeval,mem0"]):
        assert main(args) == 2  # before: rc 0, single-session-user relabelled "multi-hop"
        err = capsys.readouterr().err
        assert "scoring profile 'mem0' scores locomo runs; this run is longmemeval (profiles for it: " \
               "longmemeval, longmemeval-official)" in err
    assert main(["rescore", str(run.run_dir), "--profile", "longmemeval"]) == 0
