"""LongMemEval parity: the official script's verdict rule as the ``longmemeval-official`` profile, checked reply for
reply against an independent re-implementation of that rule on the replies a run recorded.

The official ``src/evaluation/evaluate_qa.py`` strips the judge's reply and counts it correct when its lowercased
text contains "yes"; memlab's default ``longmemeval`` profile wants the reply to be yes or no and nothing else
(anything else is a judge error). `official_decision` below is written from that definition (a case-insensitive
search for the three letters), not from memlab's code.
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest

from tests.test_longmemeval import lme_items

#: One reply per question of `lme_items` (by question text): agreeing, hedged, negated, shouting, embedded.
REPLIES = {
    "What breed is my dog?": "Yes.",
    "Which pasta dish did you recommend to me?": "yes, because the response names cacio e pepe",
    "Can you suggest a weekend activity for me?": "The answer is no, not yes",
    "How many instruments do I play?": "YES",
    "Which city do I live in now?": "no",
    "How many days before my sister's wedding did I buy the dress?": "Eyes on the dates: no.",
    "What is my cat's name?": "Maybe.",
}


def official_decision(reply: str) -> bool:
    """LongMemEval's published decision, re-derived: correct iff "yes" occurs anywhere in the reply, any case."""
    return re.search("yes", reply, flags=re.IGNORECASE) is not None


def strict_decision(reply: str) -> bool | None:
    """memlab's strict reading: True / False for a bare yes / no (quotes, stars, a full stop allowed); None else."""
    word = reply.strip().strip("\"'`*.!").strip().lower()
    return {"yes": True, "no": False}.get(word)


@pytest.mark.parametrize("reply", [*REPLIES.values(), "yes", " no ", "No, definitely not.", "**Yes**", "yesterday"])
def test_rules_decide_each_reply_as_their_definitions_do(reply):
    from memlab.eval.profiles import get_profile, rule_verdict
    from memlab.eval.verdicts import official_yes

    assert official_yes(reply) == official_decision(reply)
    official, strict = get_profile("longmemeval-official"), get_profile("longmemeval")
    assert official.judge_score(reply) == float(official_decision(reply))  # never unreadable
    assert rule_verdict("longmemeval", "official", [reply]) == float(official_decision(reply))
    want = strict_decision(reply)
    if want is None:
        with pytest.raises(ValueError, match="not one verdict"):
            strict.judge_score(reply)
        assert math.isnan(rule_verdict("longmemeval", "strict", [reply]))
    else:
        assert strict.judge_score(reply) == float(want) == rule_verdict("longmemeval-official", "strict", [reply])


def test_a_rule_verdict_needs_every_repeat():
    from memlab.eval.profiles import rule_verdict

    assert rule_verdict("longmemeval", "official", ["yes", "no"], repeats=2) == 0.5
    assert math.isnan(rule_verdict("longmemeval", "official", ["yes"], repeats=2))  # a repeat's call failed
    assert math.isnan(rule_verdict("longmemeval", "official", [], repeats=1))


def _run(tmp_path, profile, srv):
    from memlab.run import ExperimentConfig, run_experiment

    data = tmp_path / "lme.json"
    if not data.exists():
        data.write_text(json.dumps(lme_items()), encoding="utf-8")
    cfg = ExperimentConfig.from_yaml("offline").with_overrides(
        {"dataset.path": str(data), "judge.model": "openai/scripted-judge", "models.api_base": srv.api_base,
         "models.max_retries": 1, "scoring.profile": profile, "name": profile})
    with pytest.warns(UserWarning):
        return run_experiment(cfg, results=tmp_path / "res", progress=False)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same questions judged by the same scripted judge, under the strict and the official profile."""
    from memlab.testing import Reply, ScriptedServer

    def judge(body):
        prompt = body["messages"][0]["content"]
        (reply,) = [r for q, r in REPLIES.items() if q in prompt]
        return Reply(text=reply)

    tmp = tmp_path_factory.mktemp("parity")
    with ScriptedServer(responder=judge) as srv:
        return {"strict": _run(tmp, "longmemeval", srv), "official": _run(tmp, "longmemeval-official", srv)}


def test_official_profile_matches_the_official_rule_reply_for_reply(both):
    p = both["official"].predictions.set_index("qid")
    assert len(p) == len(REPLIES)
    for qid, row in p.iterrows():
        (reply,) = row["judge_replies"]  # the recorded reply, as the judge wrote it
        assert row["question"] in REPLIES and reply == REPLIES[row["question"]]
        assert row["j"] == float(official_decision(reply)), (qid, reply)
        assert row["j_official"] == row["j"] and pd.isna(row["judge_error"])  # the official rule reads every reply
        want = strict_decision(reply)
        assert (math.isnan(row["j_strict"]) if want is None else row["j_strict"] == float(want)), (qid, reply)


def test_strict_profile_keeps_unreadable_replies_on_record_and_reports_the_official_j(both):
    p = both["strict"].predictions.set_index("qid")
    for qid, row in p.iterrows():
        (reply,) = row["judge_replies"]
        want = strict_decision(reply)
        if want is None:  # a judge error under the strict rule, J left empty, the reply still recorded
            assert math.isnan(row["j"]) and "not one verdict" in row["judge_error"], (qid, reply)
        else:
            assert row["j"] == float(want)
        assert row["j_official"] == float(official_decision(reply)), (qid, reply)
    off = both["official"].predictions.set_index("qid")
    assert p["j_official"].tolist() == off["j"].tolist()  # both runs agree question by question


def test_both_js_are_reported_where_they_differ(both, capsys):
    from memlab.eval import longmemeval_tables as lme_eval
    from memlab.run.report import format_report, report_table

    official, strict = both["official"], both["strict"]
    want = sum(official_decision(r) for r in REPLIES.values()) / len(REPLIES)
    s = official.summary.loc["overall 1-5"]
    assert s["j"] == pytest.approx(want) and s["j_official"] == pytest.approx(want)
    readable = [strict_decision(r) for r in REPLIES.values() if strict_decision(r) is not None]
    assert s["j_strict"] == pytest.approx(sum(readable) / len(readable))  # unreadable replies drop out
    assert s["j_strict_lo"] <= s["j_strict"] <= s["j_strict_hi"]
    table = report_table([strict.run_dir, official.run_dir], warn=False)
    assert {"j_official", "j_strict"} <= set(table.columns)
    row = table[(table.run == "longmemeval") & (table.group == "overall 1-5")].iloc[0]
    assert row["j_official"] == pytest.approx(want) and row["j"] == pytest.approx(s["j_strict"])
    text = format_report(table)
    assert "J (official rule: reply contains yes)" in text and "J (strict yes/no rule)" in text
    acc = lme_eval.report(strict.run_dir)["accuracy"]
    assert acc.loc["overall", "j_official"] == pytest.approx(want) and "j_strict" not in acc.columns  # = its J


def test_the_official_j_is_not_shown_where_it_equals_j(tmp_path):
    """A judge that only ever says yes or no: both rules agree, no second J column anywhere."""
    from memlab.eval import longmemeval_tables as lme_eval
    from memlab.run.report import report_table
    from memlab.testing import Reply, ScriptedServer

    with ScriptedServer(responder=lambda body: Reply(text="yes")) as srv:
        run = _run(tmp_path, "longmemeval", srv)
    assert run.predictions["j"].tolist() == run.predictions["j_official"].tolist() == [1.0] * len(REPLIES)
    assert "j_official" not in report_table([run.run_dir], warn=False).columns
    assert "j_official" not in lme_eval.report(run.run_dir)["accuracy"].columns


def test_rescoring_a_strict_run_under_the_official_profile_reads_the_same_replies(both):
    from memlab.run.rescore import rescore

    res = rescore(both["strict"].run_dir, "longmemeval-official", write=False)
    got = res.scores.set_index("qid")["j"]
    assert got.to_dict() == both["official"].predictions.set_index("qid")["j"].to_dict()
