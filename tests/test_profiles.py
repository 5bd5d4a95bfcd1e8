"""Scoring profiles on hand-worked examples taken from each harness's definition, the judge score
rules, the category guard, and errata (file errors, scoring, the summary's counts)."""

from __future__ import annotations

import math
from collections import Counter

import pandas as pd
import pytest

from memlab.eval.errata import ErrataError, apply_errata, load_errata
from memlab.eval.profiles import (
    LOCOMO10_CATEGORY_COUNTS,
    PROFILES,
    ProfileError,
    check_categories,
    get_profile,
    score_predictions,
)
from memlab.eval.summary import score_frame

LOC, MEM0, TRPC = get_profile("locomo"), get_profile("mem0"), get_profile("trpc-agent-go")
ABSTAIN = "Not mentioned in the conversation."

# (why, prediction, gold, category, locomo F1, mem0 F1, trpc F1), each worked by hand from the definitions
F1_CASES = [
    # stemming: only the official metric Porter-stems (running/runs -> run)
    ("stemming", "running", "runs", 4, 1.0, 0.0, 0.0),
    # stop words: only tRPC drops she/is/in; locomo drops a/an/the/and only; P = 1/4, R = 1 -> 0.4
    ("stop words", "She is in Paris", "Paris", 4, 0.4, 0.4, 1.0),
    # multiset vs set: "very" twice; multiset P = 2/3, R = 1 -> 0.8; mem0's sets are equal -> 1
    ("set vs multiset", "very very good", "very good", 4, 0.8, 1.0, 0.8),
    # commas: locomo deletes them (parisrome is one token); mem0 and tRPC make them spaces
    ("commas joined", "Paris,Rome", "Paris Rome", 4, 0.0, 1.0, 1.0),
    # category 1 in locomo: mean over gold comma parts of the best part F1 = (1 + 0)/2; others: P=1, R=1/2
    ("multi-answer", "Paris", "Paris, Rome", 1, 0.5, 2 / 3, 2 / 3),
    # apostrophe: locomo strips it (rexs -> stem rex); tRPC splits "rex s" (P = 1/2); mem0 keeps "rex's"
    ("apostrophe", "Rex's", "Rex", 4, 1.0, 0.0, 2 / 3),
    # articles: locomo and tRPC drop "the"; mem0 keeps it: P = 1/2, R = 1 -> 2/3
    ("article", "the necklace", "necklace", 4, 1.0, 2 / 3, 1.0),
    # category 3: locomo cuts the gold at ';'; mem0 keeps "2023;" as a token (P = 1/2, R = 1/4);
    # tRPC drops ';' and the stop words "or" and "may" (the modal, so also the month): 2023 vs 2023 june
    ("temporal ;", "May 2023", "May 2023; or June", 3, 1.0, 1 / 3, 2 / 3),
]


@pytest.mark.parametrize("why, pred, gold, cat, loc, mem0, trpc", F1_CASES, ids=[c[0] for c in F1_CASES])
def test_f1_by_profile_on_hand_worked_examples(why, pred, gold, cat, loc, mem0, trpc):
    got = (LOC.f1(pred, gold, cat), MEM0.f1(pred, gold, cat), TRPC.f1(pred, gold, cat))
    assert got == pytest.approx((loc, mem0, trpc))


def test_category_5_rules_differ():
    assert LOC.f1(ABSTAIN, None, 5) == 1.0 and LOC.f1("Rex", None, 5) == 0.0
    assert not MEM0.scored(5) and MEM0.judge_gold(None, 5) is None  # mem0 skips category 5 entirely
    # tRPC scores against its fixed refusal: not, mentioned, conversation vs information, not, available
    assert TRPC.f1(ABSTAIN, None, 5) == pytest.approx(1 / 3)
    assert TRPC.f1("The information is not available.", None, 5) == 1.0
    assert TRPC.judge_gold(None, 5) == "The information is not available."


def test_empty_answers():
    assert TRPC.f1("", "", 4) == 1.0 and TRPC.f1("the", "a", 4) == 1.0  # both empty after stop words
    assert TRPC.f1("", "Rex", 4) == 0.0 and MEM0.f1("", "Rex", 4) == 0.0 and LOC.f1("", "Rex", 4) == 0.0


def test_bleu1_by_profile():
    # one matching word against a longer gold: BP = exp(1 - r/c)
    assert LOC.bleu1("necklace", "a shell necklace", 4) == pytest.approx(math.exp(1 - 2))  # "a" removed: r = 2
    assert TRPC.bleu1("necklace", "a shell necklace", 4) == pytest.approx(math.exp(1 - 2))
    assert MEM0.bleu1("necklace", "a shell necklace", 4) == pytest.approx(math.exp(1 - 3))  # nothing removed
    assert MEM0.bleu1("a shell necklace", "A shell necklace", 4) == pytest.approx(1.0)
    assert MEM0.bleu1("dog", "a shell necklace", 4) == 0.0
    # clipping: "rex rex" against "rex" matches once; c >= r so BP = 1
    assert TRPC.bleu1("rex rex", "rex", 4) == pytest.approx(0.5)
    # mem0 splits sentences before word tokens, so "paris." is "paris" + "."
    assert MEM0.bleu1("We met in paris. It rained.", "paris", 4) == pytest.approx(1 / 8)


def test_judge_scores():
    assert LOC.judge_score("CORRECT") == 1.0 and LOC.judge_score("WRONG, because") == 0.0
    assert LOC.judge_score("The answer is incorrect.") == 0.0
    with pytest.raises(ValueError, match="not one verdict"):
        LOC.judge_score("CORRECT or WRONG, hard to say")
    assert MEM0.judge_score('It matches. {"reason": "same", "label": "CORRECT"}') == 1.0
    assert MEM0.judge_score('{"label": "WRONG"}') == 0.0
    with pytest.raises(ValueError, match="no JSON"):
        MEM0.judge_score("CORRECT")
    # tRPC: a correct verdict scores its confidence, a wrong one 0; confidence is |x| capped at 1
    assert TRPC.judge_score('{"correct": true, "confidence": 0.8, "reason": "ok"}') == pytest.approx(0.8)
    assert TRPC.judge_score('{"correct": false, "confidence": 0.9}') == 0.0
    assert TRPC.judge_score('sure: {"correct": true, "confidence": -1.7}') == 1.0
    assert TRPC.judge_score('{"correct": true}') == 0.0  # no confidence given: 0
    # unreadable is an error (the harness's 0.5 fallback would score "not correct" 0.5)
    for bad in ("I think the answer is correct", '{"correct": "false", "confidence": 0.9}',
                '{"correct": true, "confidence": "high"}', "[true]"):
        with pytest.raises(ValueError):
            TRPC.judge_score(bad)


@pytest.mark.parametrize("reply", [
    "The generated answer is NOT CORRECT.", "not correct", "It isn't correct.", "It isn’t correct",
    "Partially correct", "The answer is mostly correct but misses the year.", "Neither correct nor wrong.",
    "CORRECT or WRONG", "Maybe.", "", '{"label": "NOT CORRECT"}', '```json\n{"label": "partly"}\n```'])
def test_negated_hedged_or_ambiguous_verdicts_are_unreadable_never_a_score(reply):
    """Issue 20: "NOT CORRECT" was scored J = 1.0 (the word CORRECT was found); a negation, a hedge, both
    words, neither, or an unknown JSON label is unreadable (ValueError -> judge_error), never a score."""
    with pytest.raises(ValueError):
        LOC.judge_score(reply)


def test_json_labels_are_read_exactly():
    assert LOC.judge_score('{"label": "CORRECT"}') == 1.0 and LOC.judge_score('{"label": "wrong"}') == 0.0
    assert LOC.judge_score("CORRECT. Not the same words, but the same day.") == 1.0  # the "not" qualifies no verdict
    for bad in ('{"label": "NOT CORRECT"}', '{"label": "INCORRECT?"}', '{"reason": "x"}', '{"label": true}'):
        with pytest.raises(ValueError):
            MEM0.judge_score(bad)


def test_judge_prompts_carry_the_inputs():
    for p in PROFILES.values():
        msgs = p().judge_messages("Q?", "GOLD", "PRED")
        assert [m["role"] for m in msgs] == ["user"]
        assert all(x in msgs[0]["content"] for x in ("Q?", "GOLD", "PRED"))


def test_label_mappings_are_the_published_ones():
    assert [LOC.labels[c] for c in (1, 2, 3, 4)] == ["multi-hop", "temporal", "open-domain", "single-hop"]
    assert [MEM0.labels[c] for c in (1, 2, 3, 4)] == ["single-hop", "temporal", "multi-hop", "open-domain"]
    assert [TRPC.labels[c] for c in (1, 2, 3, 4)] == ["single-hop", "multi-hop", "temporal", "open-domain"]
    with pytest.raises(ProfileError, match="available: locomo, mem0, trpc-agent-go"):
        get_profile("ragas")


def test_category_guard(locomo):
    cats = pd.Series([q.category for c in locomo for q in c.questions])
    assert dict(Counter(cats)) == LOCOMO10_CATEGORY_COUNTS  # the guard's reference is the real file's
    check_categories(cats)  # full dataset: exact counts
    check_categories(cats[:100])  # a subset: counts within the reference
    swapped = cats.map({1: 2, 2: 1, 3: 3, 4: 4, 5: 5})  # renumbered categories on the full set
    with pytest.raises(ProfileError, match="differ from LoCoMo-10"):
        check_categories(swapped)
    with pytest.raises(ProfileError, match="never to labels"):
        check_categories(pd.Series(["multi-hop", "temporal"]))
    with pytest.raises(ProfileError, match=r"\[6\]"):
        check_categories(pd.Series([1, 6]))
    with pytest.raises(ProfileError, match="exceed"):
        check_categories(pd.Series([3] * 97))


def _frame():
    return pd.DataFrame({"qid": ["c/q0", "c/q1", "c/q2", "c/q3"], "category": [4, 1, 5, 2],
                         "prediction": ["Rex", "Paris", "Rex", "May 2023"],
                         "answer": ["Rex", "Paris, Rome", None, "June 2023"]})


def test_score_predictions_locomo_is_the_official_scorer_and_profiles_exclude():
    base = score_frame(_frame())
    loc = score_predictions(_frame(), "locomo")
    pd.testing.assert_series_equal(loc["f1"], base["f1"])
    assert loc["scored"].all()
    mem0 = score_predictions(_frame(), "mem0")
    assert list(mem0["scored"]) == [True, True, False, True] and math.isnan(mem0["f1"][2])
    assert mem0["f1"][1] == pytest.approx(2 / 3)


def test_errata_file_errors_name_file_line_and_field(tmp_path):
    def w(text):
        p = tmp_path / "errata.csv"
        p.write_text(text)
        return p

    with pytest.raises(ErrataError, match="not found"):
        load_errata(tmp_path / "none.csv")
    with pytest.raises(ErrataError, match=r"line 1: header .*expected exactly 'qid,answer'"):
        load_errata(w("id,gold\nc/q0,x\n"))
    with pytest.raises(ErrataError, match="line 3: 3 field"):
        load_errata(w("qid,answer\nc/q0,x\nc/q1,a,b\n"))
    with pytest.raises(ErrataError, match="line 2: field answer is empty"):
        load_errata(w("qid,answer\nc/q0, \n"))
    with pytest.raises(ErrataError, match="line 2: field qid = 'q0'"):
        load_errata(w("qid,answer\nq0,x\n"))
    with pytest.raises(ErrataError, match="line 3: qid c/q0 listed twice"):
        load_errata(w("qid,answer\nc/q0,x\nc/q0,y\n"))
    e = load_errata(w('qid,answer\nc/q0,INVALID\nc/q1,"Paris, Rome, Oslo"\n'))
    assert e.invalid == {"c/q0"} and e.corrected == {"c/q1": "Paris, Rome, Oslo"}
    with pytest.raises(ErrataError, match=r"not in the dataset, e.g. \['c/q1'\]"):
        e.check_known(["c/q0"])


def test_errata_correct_and_exclude(tmp_path):
    p = tmp_path / "e.csv"
    p.write_text("qid,answer\nc/q0,invalid\nc/q3,May 2023\n")
    e = load_errata(p)
    fixed = apply_errata(_frame(), e)
    assert list(fixed["errata"]) == ["invalid", "", "", "corrected"] and fixed["answer_original"][3] == "June 2023"
    s = score_predictions(_frame(), "locomo", e)
    assert not s["scored"][0] and math.isnan(s["f1"][0]) and s["f1"][3] == 1.0


def test_errata_in_a_run(synthetic_path, tmp_path):
    from memlab.attribution import attribute
    from memlab.data import load_locomo
    from memlab.run import ConfigError, ExperimentConfig, run_experiment

    data = load_locomo(synthetic_path)
    qs = [q for c in data for q in c.questions if q.category in (1, 2, 3, 4)]
    bad, fix = qs[0], qs[1]
    errata = tmp_path / "errata.csv"
    errata.write_text(f"qid,answer\n{bad.qid},invalid\n{fix.qid},\"{fix.answer}, extra words\"\n")
    cfg = ExperimentConfig.from_dict({"name": "errata", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns"}, "scoring": {"errata": str(errata)}})
    plain = run_experiment(cfg.with_overrides({"scoring.errata": None}), results=tmp_path / "a", progress=False)
    run = run_experiment(cfg, results=tmp_path / "b", progress=False)
    import json

    info = json.loads((run.run_dir / "run.json").read_text())
    assert info["scoring"]["errata_corrected"] == 1 and info["scoring"]["errata_excluded"] == 1
    assert run.summary.loc["overall 1-5", "n"] == plain.summary.loc["overall 1-5", "n"]  # every question counted
    assert run.summary.loc["overall 1-5", "n_scored"] == plain.summary.loc["overall 1-5", "n_scored"] - 1
    assert run.summary.loc["overall 1-5", "errata_excluded"] == 1
    p = run.predictions.set_index("qid")
    assert p.loc[fix.qid, "answer"] == f"{fix.answer}, extra words" and p.loc[fix.qid, "errata"] == "corrected"
    att = attribute(run.run_dir, data)
    assert att.set_index("qid").loc[bad.qid, "label"] == "label-issue"
    errata.write_text("qid,answer\nsyn-1/q99,x\n")
    with pytest.raises(Exception, match="not in the dataset"):
        run_experiment(cfg, results=tmp_path / "c", progress=False)
    with pytest.raises(ConfigError, match="scoring.profile = 'ragas'"):
        ExperimentConfig.from_dict({"scoring": {"profile": "ragas"}})
