"""The attribution rules on hand-built traces with known answers (one or more cases per label), the
precedence between them, and one real run checked against facts computed independently of the rule."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from memlab.attribution import (
    LABELS,
    EvidenceTurn,
    QuestionEvidence,
    answer_kind,
    attribute,
    attribution_table,
    coverage,
    date_contradiction,
    failed,
    label_question,
    speaker_contradiction,
)
from memlab.eval.ceiling import answer_bearing, answer_ceiling, asked_of, memory_line
from memlab.eval.gold_checks import (
    content_tokens,
    conversation_bigrams,
    deglue,
    glued_gold,
    parse_date,
)
from memlab.eval.gold_issues import duration_contradiction, unfounded_suggestion

ROW = {"category": 4, "evidence": ["D1:2"], "evidence_raw": ["D1:2"], "answer": "Rex", "prediction": "a cat",
       "f1": 0.0, "em": 0.0, "question": "What is Bob's dog called?"}
MULTI = {**ROW, "category": 1, "evidence": ["D1:2", "D3:4"], "evidence_raw": ["D1:2", "D3:4"],
         "answer": "Rex and Milo"}
MEM_OK = {"id": "m1", "text": "Bob adopted a dog named Rex", "source_ids": ["D1:2"]}
MEM_LOST = {"id": "m1", "text": "Bob adopted a pet", "source_ids": ["D1:2"]}
MEM_MILO = {"id": "m3", "text": "Bob's second dog is Milo", "source_ids": ["D3:4"]}
TURNS = "Bob: I adopted a dog named Rex last week."
ABSTAIN = "Not mentioned in the conversation."
SKIPPED = {"text": "Bob adopted a dog named Rex", "result": "skipped", "memory_id": "m9", "source_ids": ["D1:2"],
           "reconcile": {"tier": "skip", "rewritten": True, "score": 0.93, "jaccard": 0.4}}
MERGED = {"text": "Bob adopted a dog named Rex", "result": "updated", "memory_id": "m1", "source_ids": ["D1:2"],
          "reconcile": {"tier": "update", "rewritten": True, "score": 0.7, "jaccard": 0.3}}


SUMMARY = {"id": "m5", "text": "Bob got a new pet", "source_ids": ["D1:2"]}


def ev(row=ROW, mems=(MEM_OK,), context=("m1",), turns=TURNS, context_lines=None, evidence_turns=(), **kw):
    return QuestionEvidence(row=row, memories=list(mems), context_ids=set(context), turn_text=turns,
                            context=context_lines, turns=list(evidence_turns), **kw)


CASES = [
    # label-issue: errata, no valid evidence, dangling ids
    ("errata invalid", ev({**ROW, "errata": "invalid"}), "label-issue"),
    ("no valid evidence", ev({**ROW, "evidence": [], "evidence_raw": ["D9:9"]}), "label-issue"),
    ("a dangling id", ev({**ROW, "evidence_raw": ["D1:2", "D:1:3"]}), "label-issue"),
    # judge-error: failed call, or J = 0 on an exact match
    ("judge failed", ev({**ROW, "judge_error": "ModelCallError: 500"}, judged=True), "judge-error"),
    ("judge vs exact match", ev({**ROW, "prediction": "Rex", "f1": 1.0, "em": 1.0, "j": 0.0}, judged=True),
     "judge-error"),
    # abstain-error (adversarial)
    ("adversarial answered", ev({**ROW, "category": 5, "answer": None, "prediction": "Rex"}), "abstain-error"),
    # reconcile-loss: skipped (and nothing stored), skipped proposal carried the answer, merged into a loser
    ("skipped, nothing stored", ev(mems=(), context=(), proposals=[{**SKIPPED, "text": "Bob got a pet"}]),
     "reconcile-loss"),
    ("skipped, carried answer", ev(mems=(MEM_LOST,), proposals=[SKIPPED]), "reconcile-loss"),
    ("merged into a loser", ev(mems=(MEM_LOST,), proposals=[MERGED], memory_text={"m1": MEM_LOST["text"]}),
     "reconcile-loss"),
    # write-miss
    ("nothing stored", ev(mems=(), context=()), "write-miss"),
    ("memory lost the answer", ev(mems=(MEM_LOST,)), "write-miss"),
    ("skipped proposal lacked the answer", ev(mems=(MEM_LOST,), proposals=[{**SKIPPED, "text": "Bob got a pet"}]),
     "write-miss"),
    ("merged into a memory that kept it", ev(mems=(MEM_LOST,), proposals=[MERGED],
                                              memory_text={"m1": "Rex is Bob's dog"}), "write-miss"),
    ("abstained, nothing stored", ev({**ROW, "prediction": ABSTAIN}, mems=(), context=()), "write-miss"),
    # retrieval-miss
    ("stored, not given", ev(context=("m2",)), "retrieval-miss"),
    ("abstained, not given", ev({**ROW, "prediction": ABSTAIN}, context=("m2",)), "retrieval-miss"),
    # partial-retrieval: one hop reached, the other not
    ("one of two hops", ev(MULTI, mems=(MEM_OK, MEM_MILO), context=("m1",)), "partial-retrieval"),
    ("abstained on one of two hops", ev({**MULTI, "prediction": ABSTAIN}, mems=(MEM_OK, MEM_MILO),
                                        context=("m3",)), "partial-retrieval"),
    # abstain-error (non-adversarial): everything reached, still abstained
    ("abstained, all reached", ev({**ROW, "prediction": ABSTAIN}), "abstain-error"),
    # reading-miss
    ("all reached, wrong", ev(context=("m1", "m2")), "reading-miss"),
    ("both hops reached, wrong", ev(MULTI, mems=(MEM_OK, MEM_MILO), context=("m1", "m3")), "reading-miss"),
    # a hop that was never written does not make the retrieval partial
    ("unwritten hop", ev(MULTI, mems=(MEM_OK,), context=("m1",), turns=TURNS + " Milo"), "reading-miss"),
    # judged by content (issue 21): ...
    # a malformed evidence entry the loader recovered is fine (conv-26/q37 'D8:6; D9:17'): a retrieval miss
    ("recovered evidence id", ev({**MULTI, "evidence_raw": ["D1:2; D3:4"], "answer": "Rex, Milo"},
                                 mems=(MEM_OK, MEM_MILO), context=("m2",)), "retrieval-miss"),
    # the answer reached the reader through another turn than the listed one: the reader's miss
    ("answer through another turn", ev(context=("m7",), context_lines=["Bob: Rex is my new dog"]), "reading-miss"),
    # a summary that dropped the answer does not reach its turn
    ("summary without the answer", ev(mems=(MEM_OK, SUMMARY), context=("m5",), context_lines=[SUMMARY["text"]]),
     "retrieval-miss"),
    # the missed hop was redundant: its words were in the context through another memory
    ("redundant missed hop", ev(MULTI, mems=(MEM_OK, MEM_MILO), context=("m1", "m8"),
                                context_lines=[MEM_OK["text"], "Milo the second dog sleeps a lot"]), "reading-miss"),
    # an inferred answer is supported by any sufficient part of its evidence; a count needs every instance
    ("inferred, one of two reached", ev({**MULTI, "category": 3, "answer": "Likely yes"}, mems=(MEM_OK, MEM_MILO),
                                        context=("m1",)), "reading-miss"),
    ("count, one of two reached", ev({**MULTI, "answer": "two dogs"}, mems=(MEM_OK, MEM_MILO), context=("m1",),
                                     turns="Bob: I adopted a dog named Rex. Bob: my second dog is Milo"),
     "partial-retrieval"),
    # every evidence id reached, the gold's words are nowhere and nothing says it is inferred: bad gold
    ("gold not supported", ev({**ROW, "answer": "Fido"}, turns="Bob: I adopted a dog named Rex."), "label-issue"),
    # a gold that is only a relative time
    ("relative gold", ev({**ROW, "category": 4, "answer": "Last year", "prediction": "2022"}), "label-issue"),
]


@pytest.mark.parametrize("name, case, label", CASES, ids=[c[0] for c in CASES])
def test_every_rule_on_hand_built_traces(name, case, label):
    got, reason = label_question(case)
    assert (got, bool(reason)) == (label, True), reason


def test_every_label_has_a_case_and_the_rule_order_is_the_documented_one():
    assert {c[2] for c in CASES} == set(LABELS)
    import memlab.attribution as a

    doc = a.__doc__
    positions = [doc.index(f"``{label}`` —") for label in LABELS]
    assert positions == sorted(positions)  # the module doc lists the rules in LABELS order


def test_precedence_between_labels():
    # an errata-invalid adversarial answer is a label issue first
    assert label_question(ev({**ROW, "category": 5, "errata": "invalid", "prediction": "Rex"}))[0] == "label-issue"
    # a judge failure outranks a write-miss
    assert label_question(ev({**ROW, "judge_error": "x"}, mems=(), context=(), judged=True))[0] == "judge-error"
    # without a judge in the run, a judge_error field is ignored
    assert label_question(ev({**ROW, "judge_error": "x"}, mems=(), context=()))[0] == "write-miss"
    # reconcile-loss outranks write-miss only when the evidence memories lost the answer
    assert label_question(ev(proposals=[SKIPPED]))[0] == "reading-miss"


MAY8 = datetime(2023, 5, 8, 13, 56)


def test_gold_date_checked_against_its_evidence_turn():
    said = [EvidenceTurn("D1:2", "Bob", "I adopted a dog yesterday!", MAY8)]
    assert date_contradiction("7 May 2023", said) is None
    why = date_contradiction("7 May 2022", said)
    assert "contradicts" in why and "'yesterday' -> 7 May 2023" in why
    assert date_contradiction("2021", [EvidenceTurn("D1:2", "Bob", "We went camping last year.", MAY8)])
    assert date_contradiction("2022", [EvidenceTurn("D1:2", "Bob", "We went camping last year.", MAY8)]) is None
    # LoCoMo's anchored form agrees with the session date, whatever else the turn mentions (conv-26/q8)
    school = EvidenceTurn("D3:1", "Caroline", "I wanted to tell you about my school event last week. It made me "
                          "reflect since I started transitioning three years ago.", datetime(2023, 6, 9))
    assert date_contradiction("The week before 9 June 2023", [school]) is None
    # a turn with time words of its own ("since 2016") implies no date: silent
    assert date_contradiction("2016", [EvidenceTurn("D1:2", "Bob", "I have painted since 2016.", MAY8)]) is None
    # no date in the gold, or one turn of several agrees: silent
    assert date_contradiction("Rex", said) is None
    assert date_contradiction("7 May 2023", [EvidenceTurn("D9:1", "Bob", "Hi!", datetime(2024, 1, 1)), *said]) is None
    row = {**ROW, "category": 2, "answer": "7 May 2022", "question": "When did Bob adopt Rex?"}
    label, reason = label_question(ev(row, evidence_turns=said))
    assert label == "label-issue" and "contradicts" in reason


def test_evidence_spoken_by_the_other_person():
    alice = [EvidenceTurn("D1:2", "Alice", "I adopted a dog named Rex.", MAY8)]
    who = ("Alice", "Bob")
    assert "asks about Bob" in speaker_contradiction("What is Bob's dog called?", alice, who)
    assert speaker_contradiction("What is Alice's dog called?", alice, who) is None
    # the other person talking *about* the one asked ("your", the name) is evidence about them
    about = [EvidenceTurn("D1:2", "Alice", "Is your dog Rex? Bob, he is cute.", MAY8)]
    assert speaker_contradiction("What is Bob's dog called?", about, who) is None
    # both named (a short form counts: Deb for Deborah), or nobody: silent
    deb = [EvidenceTurn("D1:2", "Deborah", "The Eisenhower Matrix sorts tasks.", MAY8)]
    assert speaker_contradiction("What does Deb suggest Jolene try?", deb, ("Deborah", "Jolene")) is None
    assert speaker_contradiction("What dog was adopted?", alice, who) is None
    row = {**ROW, "question": "What is Bob's dog called?"}
    assert label_question(ev(row, evidence_turns=alice, speakers=who))[0] == "label-issue"
    # adversarial questions swap the person on purpose: still abstain-error
    adv = {**row, "category": 5, "answer": None, "prediction": "Rex"}
    assert label_question(ev(adv, evidence_turns=alice, speakers=who))[0] == "abstain-error"


def test_answer_kinds():
    assert answer_kind("three times", 1) == "count" and answer_kind("4", 4) == "count"
    assert answer_kind("7 May 2023", 2) == "date" and answer_kind("August", 2) == "date"
    assert answer_kind("Likely yes", 1) == "inferred" and answer_kind("Minnesota", 3) == "inferred"
    assert answer_kind("Rex", 4) == "literal"


def test_reading_miss_only_when_the_context_could_do_better():
    # every id reached but only through a memory that holds part of a two-word answer: the ceiling decides
    part = {"id": "m1", "text": "Bob adopted a dog named Rex", "source_ids": ["D1:2"]}
    row = {**ROW, "answer": "Rex Smith", "prediction": "a dog", "f1": 0.0}
    label, reason = label_question(ev(row, mems=(part,), turns="Bob: my dog is Rex Smith"))
    assert label == "reading-miss" and "a span scores 0.67, the answer 0.00" in reason


def test_a_missed_hop_counts_only_when_it_could_add_what_the_answer_needs():
    # issue 21, pattern C: the rules said partial-retrieval for any missed listed id (conv-50/q63, conv-47/q62)
    row = {**MULTI, "answer": "Rex, Milo, Luna", "prediction": "a cat"}
    d1, d3 = datetime(2023, 5, 1), datetime(2023, 6, 2)
    turns = [EvidenceTurn("D1:2", "Bob", "I adopted a dog named Rex", d1),
             EvidenceTurn("D3:4", "Bob", "my second dog is Milo", d3)]
    # Milo reached the reader through another memory (m8); Luna is nowhere, so the context is not answer-bearing
    lines = [MEM_OK["text"], "Milo the second dog sleeps a lot"]
    label, reason = label_question(ev(row, mems=(MEM_OK, MEM_MILO), context=("m1", "m8"), context_lines=lines,
                                      evidence_turns=turns))
    assert label == "reading-miss" and "missed D3:4 carry nothing the context lacks" in reason, reason
    # the missed turn carries a gold word the context lacks: a retrieval part
    label, _ = label_question(ev(row, mems=(MEM_OK, MEM_MILO), context=("m1",), context_lines=[MEM_OK["text"]],
                                 evidence_turns=turns))
    assert label == "partial-retrieval"
    # a missed turn with none of the gold's words: redundant beside a reached turn of its session, not otherwise
    wordless = {"id": "m3", "text": "Bob: they get along", "source_ids": ["D3:4"]}
    for d, want in ((d1, "reading-miss"), (d3, "partial-retrieval")):
        ts = [turns[0], EvidenceTurn("D3:4", "Bob", "they get along", d)]
        label, reason = label_question(ev({**row, "answer": "Rex Smith"}, mems=(MEM_OK, wordless), context=("m1",),
                                          context_lines=[MEM_OK["text"]], evidence_turns=ts))
        assert label == want, reason
    # a count needs every instance, whatever the missed turn says
    label, _ = label_question(ev({**row, "answer": "two"}, mems=(MEM_OK, wordless), context=("m1",),
                                 context_lines=[MEM_OK["text"]],
                                 evidence_turns=[turns[0], EvidenceTurn("D3:4", "Bob", "they get along", d1)]))
    assert label == "partial-retrieval"


def test_a_leading_yes_or_no_is_inferred_even_when_a_turn_says_it():
    # conv-48/q64 "Does Deborah like cats?" gold "Yes": the missed turn D22:27 opens with "Yes, I really love
    # cats" (a reply to something else); the reached D15:25 ("that's why I have cats") supports the inference
    row = {**MULTI, "category": 4, "answer": "Yes", "prediction": "Luna Max"}
    d1, d3 = datetime(2023, 7, 9), datetime(2023, 8, 26)
    turns = [EvidenceTurn("D1:2", "Deborah", "I don't like dogs, that's why I have cats", d1),
             EvidenceTurn("D3:4", "Deborah", "Yes, I really love cats", d3)]
    mems = ({"id": "m1", "text": "Deborah: I don't like dogs, that's why I have cats", "source_ids": ["D1:2"]},
            {"id": "m3", "text": "Deborah: Yes, I really love cats", "source_ids": ["D3:4"]})
    said = "Deborah: I don't like dogs, that's why I have cats. Deborah: Yes, I really love cats"
    label, reason = label_question(ev(row, mems=mems, context=("m1",), turns=said, context_lines=[mems[0]["text"]],
                                      evidence_turns=turns))
    assert label == "reading-miss" and "inferred" in reason, reason


def test_a_gold_whose_punctuation_glues_two_words():
    # conv-41/q24: gold 'April.2023' normalises to the one token 'april2023'; the prediction 'April 2023' scored 0
    row = {**ROW, "category": 2, "answer": "April.2023", "prediction": "April 2023", "f1": 0.0}
    label, reason = label_question(ev(row, turns="John: I started boot camp last month."))
    assert label == "label-issue" and "'april2023'" in reason, reason
    # a wrong prediction is the reader's, whatever the gold's punctuation; a decimal is no glue
    assert glued_gold("April.2023", "boot camp", 2) is None
    assert glued_gold("3.5 miles", "3 5 miles", 2) is None

def test_a_duration_is_computed_from_dates():
    # conv-47/q62 'nearly three months' was a literal answer, so with both dated turns reached it fell to label-issue
    for a in ("nearly three months", "about 2 years", "a couple of weeks", "three months"):
        assert answer_kind(a, 2) == "date", a
    assert answer_kind("three times", 1) == "count" and answer_kind("Rex", 2) == "literal"


def test_partial_retrieval_reason_quotes_the_full_ranking():
    label, reason = label_question(ev(MULTI, mems=(MEM_OK, MEM_MILO), context=("m1",),
                                      ranks={"D1:2": 2, "D3:4": 41}, depth=100))
    assert label == "partial-retrieval" and "D3:4 at rank 41" in reason and "reached D1:2" in reason
    label, reason = label_question(ev(context=(), ranks={"D1:2": None}, depth=100))
    assert label == "retrieval-miss" and "D1:2 absent (beyond rank 100)" in reason


def test_failure_definition_and_coverage():
    assert failed({"category": 4, "f1": 0.49})
    assert not failed({"category": 4, "f1": 0.5})
    assert failed({"category": 5, "f1": 0.0, "prediction": "Rex"})
    assert not failed({"category": 5, "f1": 1.0, "prediction": "Not mentioned"})
    assert not failed({"category": 4, "f1": 1.0, "j": 0.0})  # no judge in the run: J is not read
    assert failed({"category": 4, "f1": 1.0, "j": 0.0}, judged=True)
    assert failed({"category": 4, "f1": 1.0, "j": float("nan"), "judge_error": "boom"}, judged=True)
    assert not failed({"category": 4, "f1": float("nan")})  # not scored (errata / excluded category)
    assert coverage("the dog Rex", "Rex is a dog") == 1.0 and coverage("Rex", "a cat") == 0.0


def _old_style_facts(tr, qid):
    """Independent of the rule: evidence-sourced memory ids and the reader's context for one question."""
    ev = set(tr.questions.set_index("qid").loc[qid, "evidence"])
    sourced = {m["id"]: set(m["source_ids"]) & ev for m in tr.memories.to_dict("records")
               if m["conversation"] == qid.split("/")[0] and set(m["source_ids"]) & ev}
    return ev, sourced, set(tr.contexts[qid])


def test_attribution_on_a_real_run(locomo_path, locomo, warm_results):
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.trace import load, trace_size_mb

    cfg = ExperimentConfig.from_dict({"name": "att", "dataset": {"path": str(locomo_path),
                                                                 "conversations": ["conv-26"], "question_limit": 60},
                                      "extraction": {"name": "observations"}})
    run = run_experiment(cfg, results=warm_results, progress=False)
    tr = load(run.run_dir)
    assert trace_size_mb(run.run_dir) < 5
    att = attribute(tr, locomo)
    # failures counted here from the scores, not by the function under test
    preds = run.predictions
    abstained = preds.prediction.fillna("").str.lower().str.contains("not mentioned|no information available")
    expected = set(preds.loc[((preds.category != 5) & (preds.f1 < 0.5)) | ((preds.category == 5) & ~abstained),
                             "qid"])
    assert set(att.qid) == expected and att.qid.is_unique and set(att.label) <= set(LABELS)
    assert attribution_table(att).loc["total", "failed"] == len(expected)
    lines = {m["id"]: memory_line(m["text"], m["event_time"]) for m in tr.memories.to_dict("records")}
    srcs = {m["id"]: list(m["source_ids"]) for m in tr.memories.to_dict("records")}
    for r in att.to_dict("records"):
        ev, sourced, ctx = _old_style_facts(tr, r["qid"])
        reached = {s for m, ss in sourced.items() if m in ctx for s in ss}
        written = {s for ss in sourced.values() for s in ss}
        if r["category"] == 5:
            continue
        context, sources = [lines[i] for i in tr.contexts[r["qid"]]], [srcs[i] for i in tr.contexts[r["qid"]]]
        asked = asked_of(locomo[r["conversation_id"]], r["question"], sorted(ev))
        bearing = answer_bearing(r["answer"], r["category"], context, sources, asked) == 1.0
        assert r["bearing"] == bearing
        assert r["ceiling"] == pytest.approx(answer_ceiling(r["answer"], r["category"], context, sources, asked))
        if r["label"] in ("retrieval-miss", "partial-retrieval"):  # only when the answer's words were not there
            assert sourced and not bearing
        if r["label"] == "reading-miss":  # the context could do better, or it had every evidence turn
            assert bearing or r["ceiling"] > r["f1"] or (written and reached == written)
    # the trace records every evidence memory's rank in each query's full ranking
    retr = [json.loads(x) for x in open(run.run_dir / "traces" / "retrieval.jsonl")]
    k = cfg.retrieval.top_k
    for r in retr:
        ev, sourced, ctx = _old_style_facts(tr, r["qid"])
        assert {m["id"] for m in r["evidence_memories"]} == set(sourced)
        for qt in r["queries"]:
            hit_ids = [h["id"] for h in qt["hits"]]
            exact = not qt["dropped_by_dedupe"] and not qt["fallback_added"]
            for mid, rank in qt["memory_ranks"].items():
                if mid in hit_ids:  # a reader's hit sits at its rank, or lower when dedupe removed some above
                    assert rank is not None and rank >= hit_ids.index(mid) + 1
                    assert rank == hit_ids.index(mid) + 1 or not exact
                elif exact:  # nothing deduped: the reader saw exactly the top k of the full ranking
                    assert rank is None or rank > min(k, len(hit_ids))
    # the ceiling and bearing are computed here (a run's own may predate supported lines), and agree with the run's
    p = tr.questions.set_index("qid")
    for r in att[att.category != 5].to_dict("records"):
        assert r["ceiling"] == pytest.approx(p.loc[r["qid"], "answer_ceiling"]), r["qid"]
    qid = att.qid.iloc[0]
    text = tr.show(qid)
    assert "1. extractor layer" in text and "2. retrieval layer" in text and "3. answer layer" in text
    assert "evidence in the full ranking (depth 100)" in text
    assert "tier disabled" not in text and "score None" not in text and "usage" not in text
    with pytest.raises(KeyError):
        tr.question("nope/q0")


def test_evidence_ranks_per_query_to_a_depth():
    from memlab.answer.base import AnswerContext, evidence_ranks, retrieve
    from memlab.index import open_service
    from memlab.memory import SearchOptions
    from memlab.memory.entry import UserKey

    svc = open_service("memory")
    key = UserKey("app", "u")
    texts = {"D1:1": "Bob adopted a dog named Rex", "D2:1": "Bob moved to Oslo from Sweden",
             "D3:1": "Alice paints blue vases", "D4:1": "Alice runs a pottery class on Mondays"}
    ids = {d: svc.add(key, t, source_ids=[d]).id for d, t in texts.items()}
    ctx = AnswerContext(service=svc, key=key, conversation=None,
                        search=SearchOptions(max_results=1, dedupe=False, kind_fallback=False))
    _, q_dog = retrieve(ctx, "dog Rex")
    _, q_oslo = retrieve(ctx, "Oslo Sweden")
    out = evidence_ranks(ctx, [q_dog, q_oslo], {"D1:1", "D2:1", "D9:9"}, context_ids={ids["D1:1"]}, depth=2)
    assert {m["id"]: m["in_context"] for m in out["evidence_memories"]} == {ids["D1:1"]: True, ids["D2:1"]: False}
    dog, oslo = out["queries"]
    assert dog["evidence_ranks"]["D1:1"] == 1 and oslo["evidence_ranks"]["D2:1"] == 1  # each query's own ranking
    assert dog["memory_ranks"][ids["D1:1"]] == q_dog.hits[0]["rank"] == 1
    assert "D9:9" not in dog["evidence_ranks"]  # never written: no memory, so no rank (shown as "not written")
    from memlab.trace import format_ranks

    text = format_ranks(["D1:1", "D2:1", "D9:9"], {"D1:1": 1, "D2:1": None})
    assert text == "D1:1 at rank 1, D2:1 absent, D9:9 not written"
    # the tail beyond the depth is absent; the full ranking is deeper than the reader's k = 1
    deep = evidence_ranks(ctx, [q_dog], {"D1:1", "D2:1", "D3:1", "D4:1"}, set(), depth=4)["queries"][0]
    assert sorted(r for r in deep["evidence_ranks"].values() if r is not None)[:2] == [1, 2]
    shallow = evidence_ranks(ctx, [q_dog], {"D1:1", "D2:1", "D3:1", "D4:1"}, set(), depth=1)["queries"][0]
    assert list(shallow["evidence_ranks"].values()).count(None) == 3


def test_a_skipped_proposal_shows_its_own_text_and_the_memory_kept_instead():
    from memlab.trace import op_line

    op = {"action": "add", "result": "skipped", "source_ids": ["D1:2"], "text": "Melanie plans camping in June",
          "final_text": "Melanie went swimming",
          "reconcile": {"tier": "skip", "score": 0.68, "jaccard": 0.15, "candidate_id": "m9"}}
    assert op_line(op) == ("   add    -> skipped     reconcile skip score 0.68 Jaccard 0.15 vs m9  [D1:2]  "
                           "'Melanie plans camping in June' (kept instead: 'Melanie went swimming')")
    added = {"action": "add", "result": "added", "source_ids": ["D1:3", "D1:4"], "text": "raw", "final_text": "final",
             "reconcile": {"tier": "disabled", "score": None, "jaccard": None}}
    assert op_line(added) == "   add    -> added        [D1:3,D1:4]  final"  # reconcile decided nothing: no note


def _agreement_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "attribution_agreement.py"
    spec = importlib.util.spec_from_file_location("attribution_agreement", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_handcheck_agreement_script():
    import pandas as pd
    from sklearn.metrics import cohen_kappa_score

    mod = _agreement_script()
    a = pd.Series(["reading-miss", "retrieval-miss", "reading-miss", "abstain-error", "label-issue", "reading-miss"])
    b = pd.Series(["reading-miss", "partial-retrieval", "reading-miss", "abstain-error", "label-issue", "write-miss"])
    assert mod.cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))
    lo, hi = mod.kappa_interval(a, b, n_boot=200)
    assert lo <= mod.cohen_kappa(a, b) <= hi
    # the draw: per category, fixed by the seed, never conv-26, never an excluded qid
    att = pd.DataFrame({"qid": [f"conv-{c}/q{i}" for c in (26, 30) for i in range(40)],
                        "conversation_id": [f"conv-{c}" for c in (26, 30) for _ in range(40)],
                        "category": [1 + i % 5 for _ in range(2) for i in range(40)]})
    d1, d2 = mod.draw(att, per_category=3, seed=5), mod.draw(att, per_category=3, seed=5)
    assert list(d1.qid) == list(d2.qid) and (d1.conversation_id == "conv-30").all()
    assert d1.groupby("category").size().tolist() == [3] * 5
    held = mod.draw(att, per_category=3, seed=6, exclude=set(d1.qid))
    assert not set(held.qid) & set(d1.qid)
    # the shipped hand labels are well-formed and use the rule's label names
    hand = pd.read_csv(mod.HANDCHECK)
    cols = {"qid", "category", "hand_label", "reason", "sample", "prediction"}
    assert cols <= set(hand.columns) and hand.qid.is_unique
    assert set(hand.hand_label) <= set(LABELS) and hand.reason.str.len().min() > 10
    assert not hand.qid.str.startswith("conv-26/").any() and hand.prediction.notna().all()
    # 110 drawn on the old reader's run; 20 the shipped reader no longer fails were dropped; holdout4/5: 8 x 5, blind;
    # blind2 ... blind6: 10 x categories 1-4, labelled blind from the sheet alone (category 3's failed questions
    # outside conv-26 ran out: 9 left for blind5, none for blind6)
    assert hand.groupby("sample").size().to_dict() == {"dev": 49, "holdout": 21, "holdout2": 20, "holdout3": 30,
                                                       "holdout4": 40, "holdout5": 40, "blind2": 40, "blind3": 40,
                                                       "blind4": 40, "blind5": 39, "blind6": 30}
    for name in ("holdout4", "holdout5"):
        assert (hand[hand["sample"] == name].groupby("category").size() == 8).all()
    for name, cat3 in (("blind2", 10), ("blind3", 10), ("blind4", 10), ("blind5", 9), ("blind6", 0)):
        want = {1: 10, 2: 10, 3: cat3, 4: 10} if cat3 else {1: 10, 2: 10, 4: 10}
        assert hand[hand["sample"] == name].groupby("category").size().to_dict() == want


def test_handcheck_samples_skip_questions_labelled_for_earlier_samples(monkeypatch):
    """A new sample drawn on another reader's run never repeats a question the CSV labelled for an earlier
    sample, and its own draw stays the same once its labels are in the CSV."""
    import pandas as pd

    mod = _agreement_script()
    monkeypatch.setattr(mod, "SAMPLES", {"dev": (2, 1), "new": (3, 2)})
    att = pd.DataFrame({"qid": [f"conv-30/q{i}" for i in range(30)], "conversation_id": ["conv-30"] * 30,
                        "category": [1 + i % 5 for i in range(30)]})
    fresh = mod.samples(att)
    # labels of an older run's dev draw: questions this run's dev draw did not pick
    old_dev = att[~att.qid.isin(fresh["dev"].qid)].groupby("category").head(1).qid
    labelled = pd.DataFrame({"qid": list(old_dev), "sample": "dev"})
    new = mod.samples(att, labelled)["new"]
    assert not set(new.qid) & set(old_dev) and not set(new.qid) & set(fresh["dev"].qid)
    assert set(fresh["new"].qid) & set(old_dev)  # without the CSV the draw would repeat them
    written = pd.concat([labelled, pd.DataFrame({"qid": list(new.qid), "sample": "new"})])
    assert list(mod.samples(att, written)["new"].qid) == list(new.qid)


def test_handcheck_compares_only_the_labelled_prediction():
    """A hand label judged one prediction: a run that answers otherwise, or no longer fails, is left out."""
    import pandas as pd

    mod = _agreement_script()
    hand = pd.DataFrame({"qid": ["a", "b", "c", "d"], "category": [1, 2, 3, 4],
                         "hand_label": ["reading-miss", "abstain-error", "retrieval-miss", "reading-miss"],
                         "reason": ["r"] * 4, "prediction": ["the  cat\n", "Not mentioned.", "x", "y"]})
    att = pd.DataFrame({"qid": ["a", "b", "c"], "label": ["reading-miss", "abstain-error", "write-miss"],
                        "reason": ["s"] * 3})
    # a: same up to whitespace; b: the reader now answers; c: same; d: no longer failed
    predictions = pd.Series({"a": "the cat", "b": "a cat", "c": "x", "d": "y"})
    assert mod.stale(hand, predictions) == ["b"]
    assert mod.stale(hand, predictions.drop("c")) == ["b", "c"]  # a question the run lacks is stale too
    both, table, left_out = mod.agreement(att, hand, predictions)
    assert list(both.qid) == ["a", "c"] and list(both.rule_label) == ["reading-miss", "write-miss"]
    assert left_out == {"prediction changed": ["b"], "question no longer failed": ["d"]}
    assert table.loc["total", "total"] == 2


def test_handcheck_markdown_tables():
    import pandas as pd

    mod = _agreement_script()
    both = pd.DataFrame({"qid": list("abcdef"), "category": [1, 2, 5, 1, 2, 5],
                         "sample": ["dev", "dev", "h1", "h1", "h2", "h2"],
                         "hand_label": ["reading-miss", "retrieval-miss", "abstain-error", "reading-miss",
                                        "retrieval-miss", "abstain-error"],
                         "rule_label": ["reading-miss", "reading-miss", "abstain-error", "partial-retrieval",
                                        "retrieval-miss", "abstain-error"]})
    out = mod.markdown(both, {"prediction changed": ["x"], "question no longer failed": []}, n_boot=20)
    lines = out.splitlines()
    assert "| `dev` (in-sample) | 2 | 0.500 |" in out and "| `h1` | 2 | 0.500 |" in out
    pooled = "| **every sample but `dev` (`h1` + `h2`)** | 4 | 0.750 | **"
    assert any(x.startswith(pooled) for x in lines)  # dev left out
    assert "| every sample but `dev`, categories 1–4 (category 5 is always `abstain-error`) | 2 | 0.500 |" in out
    assert "labelled blind" not in out  # no blind sample among h1, h2
    blind = mod.markdown(both.assign(sample=both["sample"].replace({"h2": "holdout5"})), {}, n_boot=20)
    assert "| labelled blind, without the rules or their output (`holdout5`) | 2 | 1.000 |" in blind
    assert "Confusion on every sample but `dev`, 4 questions" in out
    # rows: hand, columns: rules, over the union of both label sets; the diagonal is agreement
    assert "| reading-miss | 0 | 1 | 0 | 0 | 1 |" in out  # hand reading-miss called partial-retrieval once
    assert "| total | 2 | 1 | 0 | 1 | 4 |" in out
    assert out.endswith("Left out of the comparison: prediction changed 1.\n")


def test_blind_sheet_shows_what_a_labeller_reads_and_nothing_the_rules_compute(synthetic_path, tmp_path):
    """`--blind`: every drawn question with its evidence turns, the context in rank order and each evidence turn's
    retrieval rank; no rule label, reason, ceiling or answer-bearing; a blank labels.csv of the same questions."""
    import pandas as pd

    from memlab.data import load_locomo
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.trace import load

    mod = _agreement_script()
    cfg = ExperimentConfig.from_dict({"name": "blind", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns+observations"}, "retrieval": {"top_k": 2}})
    run = run_experiment(cfg, results=tmp_path / "r", progress=False)
    tr, data = load(run.run_dir), load_locomo(synthetic_path)
    att = attribute(tr, data)
    sample = mod.draw(att, per_category=5, seed=1, categories=(1, 2, 3, 4))
    assert len(sample) and (sample.category != 5).all()
    defs = tmp_path / "defs.md"
    defs.write_text("# Label definitions\n")
    paths = mod.write_blind(tr, att, data, "blind2", sample, tmp_path / "sheet", defs)
    sheet = (tmp_path / "sheet" / "sheet.md").read_text()
    assert sheet.count("# Label definitions") == 1 and sheet.index("# Label definitions") < sheet.index("### ")
    for r in att[att.qid.isin(sample.qid)].to_dict("records"):
        assert f"### {r['qid']} (category {r['category']})" in sheet and r["answer"] in sheet
        assert r["reason"] not in sheet  # nothing the rules say
    for word in ("ceiling", "bearing", "label-issue", "reading-miss", "retrieval-miss"):
        assert word not in sheet.split("---", 1)[1]
    # the context in rank order with its dia ids and dates; evidence turns outside it carry their rank
    qid = sample.qid.iloc[0]
    block = sheet.split(f"### {qid} ")[1].split("### ")[0]
    ranks = [x.split("|")[1].strip() for x in block.splitlines() if x.startswith("| ") and "rank" not in x]
    assert ranks == sorted(ranks, key=lambda x: (x == "preload", int(x) if x.isdigit() else 0))
    assert len(ranks) == len(tr.contexts[qid])
    best = tr.best_ranks(qid)
    ev = tr.questions.set_index("qid").loc[qid, "evidence"]
    for e in ev:
        line = block.split(f"`{e}` [")[1].split("\n")[0]
        if best.get(e) is not None and "not in context" in line:
            assert f"retrieval rank {best[e]}" in line
    labels = pd.read_csv(tmp_path / "sheet" / "labels.csv", keep_default_na=False)
    assert list(labels.columns) == ["qid", "category", "hand_label", "reason"]
    assert set(labels.qid) == set(sample.qid) and (labels.hand_label == "").all()
    assert {p.name for p in paths} >= {"sheet.md", "labels.csv"} | {f"sheet-cat{c}.md" for c in set(sample.category)}


# ---------------------------------------------------------------- issue 36: the rules an outside expert reads
JUL16 = datetime(2023, 7, 16, 16, 21)


def test_a_gold_date_the_naming_sentence_contradicts():
    # conv-43/q6: "last week" said on 16 July 2023 is 9 July, not the gold's June 2023 (a month's slack let it pass);
    # the turn's "in the last month" names nothing the question asks about
    d3 = EvidenceTurn("D3:1", "John", "So much has happened in the last month - on and off the court. Last week I "
                      "scored 40 points, my highest ever.", JUL16)
    q = "In which month's game did John achieve a career-high score in points?"
    why = date_contradiction("June 2023", [d3], q)
    assert why and "'last week' -> the week before 16 July 2023" in why, why
    assert date_contradiction("July 2023", [d3], q) is None
    assert date_contradiction("The week before 16 July 2023", [d3], q) is None
    # an event named by one turn ("last Friday") is not excused by an unnamed "last week" turn of another session
    named = EvidenceTurn("D5:2", "John", "Last Friday we won the final game!", datetime(2023, 8, 20))
    unnamed = EvidenceTurn("D4:1", "John", "Last week was crazy.", datetime(2023, 7, 30))
    q2 = "When did John win the final game?"
    assert date_contradiction("The week before 30 July 2023", [named, unnamed], q2)
    assert date_contradiction("The Friday before 20 August 2023", [named, unnamed], q2) is None
    row = {**ROW, "category": 2, "answer": "June 2023", "question": q}
    assert label_question(ev(row, evidence_turns=[d3]))[0] == "label-issue"


def test_a_gold_duration_its_turns_contradict():
    # conv-47/q31: leaving "the day after tomorrow" (said 9 July), back "on July 20": not 19 days
    jul9 = datetime(2022, 7, 9, 17, 13)
    turns = [EvidenceTurn("D16:9", "James", "I bought air tickets to Toronto, and I'm leaving tomorrow evening.", jul9),
             EvidenceTurn("D16:13", "James", "I plan to return on July 20, I'll bring you a souvenir!", jul9)]
    why = duration_contradiction("19 days", turns)
    assert why and "10 July 2022 to 20 July 2022, 10 days" in why, why
    assert duration_contradiction("10 days", turns) is None and duration_contradiction("about 9 days", turns) is None
    # a duration a turn says, or one without two dated ends, is left alone
    said = [EvidenceTurn("D1:1", "Bob", "I've had them for 19 days now.", jul9)]
    assert duration_contradiction("19 days", said) is None
    assert duration_contradiction("19 days", turns[:1]) is None


SPOKEN = {"Evan": ["Hey Sam! I painted a sunset last week.", "I love my new guitar. [shared a photo: a photo of a man "
                   "standing on a rocky beach looking at a valley]"],
          "Sam": ["Hey Evan! Took my friends on a hike. [shared a photo: a photo of a man standing on a rock "
                  "looking out over a valley]"]}


def test_the_other_persons_turn_that_the_asked_person_never_says():
    # conv-49/q144: Sam's own photo; the question says Evan shared it; "Hey Evan!" greets him, it is not about him
    sam = [EvidenceTurn("D22:1", "Sam", SPOKEN["Sam"][0], MAY8)]
    q, gold = "What did Evan share with Sam after their hiking trip?", "a photo of a man standing on a rock looking out"
    assert "asks about Evan" in speaker_contradiction(q, sam, ("Evan", "Sam"), gold, SPOKEN)
    # Evan saying the gold himself (not a photo caption of his sharing some of its words) makes it his
    said = {**SPOKEN, "Evan": [*SPOKEN["Evan"], "I stood on a rock looking out over a valley, a man alone"]}
    told = [EvidenceTurn("D22:1", "Sam", "Have you seen it? A man standing on a rock looking out over a valley", MAY8)]
    assert speaker_contradiction(q, told, ("Evan", "Sam"), gold, SPOKEN)  # "you", and Evan never says it
    assert speaker_contradiction(q, told, ("Evan", "Sam"), gold, said) is None
    # a question about what one learnt from the other names the other on purpose
    assert speaker_contradiction("What did Evan learn from Sam?", sam, ("Evan", "Sam"), gold, SPOKEN) is None
    row = {**ROW, "question": q, "answer": gold, "prediction": "took friends epic"}
    got = label_question(ev(row, evidence_turns=sam, speakers=("Evan", "Sam"), spoken=SPOKEN))
    assert got[0] == "label-issue", got


def test_an_open_ended_suggestion_found_nowhere():
    # conv-49/q20: a gift idea no turn says, with evidence turns about a hike and a painting class
    turns = [EvidenceTurn("D14:12", "Evan", "Our hike is going to be awesome!", MAY8),
             EvidenceTurn("D8:12", "Evan", "I also started taking painting classes, trying new healthy recipes.", MAY8)]
    q = "What would be an appropriate gift for Evan and Sam to encourage their healthy lifestyles?"
    gold = "a cookbook with healthy recipes or a subscription to a healthy meal delivery service"
    said = {w for x in ("Our hike is going to be awesome!", turns[1].text) for w in content_tokens(x)}
    assert "cookbook" in unfounded_suggestion(gold, q, 3, turns, said)
    assert unfounded_suggestion("Florida", "What state would Nate suggest?", 3, turns, said) is None  # world knowledge
    assert unfounded_suggestion(gold, q, 3, turns, said | content_tokens("cookbook subscription delivery")) is None
    assert unfounded_suggestion(gold, "What gift did Evan buy?", 4, turns, said) is None  # not open-domain
    row = {**ROW, "category": 3, "question": q, "answer": gold, "evidence": ["D14:12", "D8:12"],
           "evidence_raw": ["D14:12", "D8:12"]}
    got = label_question(ev(row, evidence_turns=turns, said=said))
    assert got[0] == "label-issue" and "never says" in got[1], got


def test_glued_gold_words_fail_a_right_prediction():
    # conv-42/q5: LoCoMo wrote the gold's words glued; the prediction passes once the spaces are back
    pairs = conversation_bigrams(["I also enjoy reading, watching movies, and exploring nature.",
                                  "Writing and hanging with friends!"])
    gold = "Writing, watchingmovies, exploringnature, hanging withfriends."
    assert deglue(gold, pairs) == "Writing, watching movies, exploring nature, hanging with friends."
    assert deglue("The weekend after 3June, 2022.") == "The weekend after 3 June, 2022."
    assert deglue("cookbook", pairs) == "cookbook"  # a word the conversation has no pair or words for stays whole
    pred = "writing, reading, watching movies, exploring nature, hanging with friends"
    assert glued_gold(gold, pred, 1, bigrams=pairs) and glued_gold(gold, pred, 1) is None
    row = {**ROW, "category": 1, "answer": gold, "prediction": pred, "f1": 0.25,
           "question": "What are Joanna's hobbies?"}
    got = label_question(ev(row, bigrams=pairs))
    assert got[0] == "label-issue" and "gluing" in got[1], got


def test_reached_through_a_same_session_neighbour():
    # issue 36: the listed turn ranked 19, its neighbour carrying the same fact and date was in the context at rank 8
    turns = [EvidenceTurn("D1:2", "Bob", "I adopted a dog named Rex last week.", MAY8)]
    lines = ["8 May 2023 Alice: a dog named Rex? (replying to Bob: I adopted a dog named Rex last week.)",
             "9 June 2023 Bob: I love my job"]
    row = {**ROW, "question": "What pet did Bob adopt?", "answer": "a dog named Rex", "prediction": "a job"}
    kw = dict(row=row, context=("m7", "m8"), context_lines=lines, evidence_turns=turns, ranks={"D1:2": 19}, depth=100)
    got = label_question(ev(**kw, context_sources=[["D1:3"], ["D2:1"]]))
    assert got[0] == "reading-miss", got
    # the same line from another session is no support and reaches nothing: the evidence was missed
    got = label_question(ev(**kw, context_sources=[["D4:3"], ["D2:1"]]))
    assert got[0] == "retrieval-miss" and "D1:2 at rank 19" in got[1], got
    # not answer-bearing (Milo is nowhere), yet the neighbour reached D1:2: one hop found, the other missed
    two = [*turns, EvidenceTurn("D3:4", "Bob", "My second dog is Milo.", MAY8)]
    got = label_question(ev({**MULTI, "category": 4, "question": "What are Bob's dogs called?", "prediction": "a job"},
                            mems=(MEM_OK, MEM_MILO), context=("m7",), context_lines=lines[:1],
                            context_sources=[["D1:3"]], evidence_turns=two))
    assert got[0] == "partial-retrieval" and got[1].startswith("reached D1:2; missed D3:4"), got


def test_a_neighbour_that_carries_part_of_the_fact_reaches_it_only_in_part():
    # blind2 conv-49/q140: the neighbour says "joy", the missed turn "joy and freedom": nothing gave freedom
    turns = [EvidenceTurn("D21:16", "Evan", "I painted this with a sense of joy and freedom.", MAY8)]
    lines = ["8 May 2023 Evan: This painting is giving me a massive rush of joy! [a bird flying over it]",
             "9 June 2023 Evan: I love my job"]
    row = {**ROW, "question": "How did Evan feel when he painted the piece with the bird?", "evidence": ["D21:16"],
           "evidence_raw": ["D21:16"], "answer": "a sense of joy and freedom", "prediction": ABSTAIN}
    kw = dict(row=row, mems=({"id": "m1", "text": turns[0].text, "source_ids": ["D21:16"]},), context=("m7", "m8"),
              context_lines=lines, evidence_turns=turns, ranks={"D21:16": 11}, depth=100)
    got = label_question(ev(**kw, context_sources=[["D21:15"], ["D2:1"]]))  # the turn beside it in its session
    assert got[0] == "partial-retrieval" and "D21:16 in part" in got[1] and "rank 11" in got[1], got
    # the same neighbour holding the whole fact reaches it: the reader had it
    whole = [lines[0].replace("rush of joy!", "sense of joy and freedom!"), lines[1]]
    got = label_question(ev(**{**kw, "context_lines": whole}, context_sources=[["D21:15"], ["D2:1"]]))
    assert got[0] == "abstain-error", got


def test_a_summary_that_dropped_its_turns_gold_words_does_not_reach_it():
    # holdout5 conv-42/q10: the summary of D3:1 kept "hoping" (a gold word D3:1 never says) and dropped "worry"
    turns = [EvidenceTurn("D2:7", "Joanna", "I'm feeling relief, excitement, some anxiety over finishing it.", MAY8),
             EvidenceTurn("D3:1", "Joanna", "I keep bouncing between relief, excitement and worry!", MAY8)]
    summary = "Joanna sent her screenplay in and is hoping a producer loves it."
    mems = ({"id": "m1", "text": turns[0].text, "source_ids": ["D2:7"]}, {"id": "m2", "text": summary,
                                                                          "source_ids": ["D3:1"]})
    row = {**ROW, "category": 1, "question": "What emotions is Joanna feeling about the screenplay?",
           "evidence": ["D2:7", "D3:1"], "evidence_raw": ["D2:7", "D3:1"], "prediction": "a producer",
           "answer": "Relief, excitement,worry, hope,anxiety."}
    assert deglue(row["answer"]) == "Relief, excitement, worry, hope, anxiety."  # glued by a comma, split for matching
    got = label_question(ev(row, mems=mems, context=("m1", "m2"), evidence_turns=turns, ranks={"D3:1": 2}, depth=100))
    assert got[0] == "partial-retrieval" and got[1].startswith("reached D2:7; missed D3:1"), got


def test_a_line_about_another_time_does_not_support_a_question_that_names_a_date():
    # blind2 conv-50/q43: "Boston" only in a line of 29 October about "a few years back" (and in the photo it
    # replies to, taken "last month"); the turn of 4 October saying "Yesterday I met ... in Boston" was missed
    q = "Which city was Calvin at on October 3, 2023?"
    assert parse_date(q)[0] == datetime(2023, 10, 3) and parse_date("9th December 2023")[0] == datetime(2023, 12, 9)
    late = ("29 October 2023 Calvin: I was there a few years back, it's such a beautiful city. (replying to Dave: "
            "That's Boston, Cal! I took this picture last month.)")
    turns = [EvidenceTurn("D21:1", "Calvin", "Yesterday I met with some incredible artists in Boston.",
                          datetime(2023, 10, 4))]
    row = {**ROW, "category": 2, "question": q, "answer": "Boston", "evidence": ["D21:1"], "evidence_raw": ["D21:1"],
           "prediction": "long drives"}
    kw = dict(row=row, mems=({"id": "m1", "text": turns[0].text, "source_ids": ["D21:1"]},), context=("m7",),
              evidence_turns=turns, ranks={"D21:1": 85}, depth=100, context_sources=[["D27:7"]],
              speakers=("Calvin", "Dave"))
    got = label_question(ev(**kw, context_lines=[late]))
    assert got[0] == "retrieval-miss" and "D21:1 at rank 85" in got[1], got
    # a line about the city on that day (its own date, or "yesterday" said the day after) supports it
    for line in ("3 October 2023 Calvin: I'm in the city of Boston today!",
                 "4 October 2023 Calvin: Yesterday I was in the city of Boston."):
        assert label_question(ev(**kw, context_lines=[line]))[0] == "reading-miss", line


def test_a_missed_item_whose_words_are_only_scattered_over_other_lines_is_needed():
    # holdout4 conv-47/q27: "gaming" in a tournament line and "courses" in a cooking-class line do not state the
    # missed "course that combines gaming and programming"
    turns = [EvidenceTurn("D13:6", "James", "I recently started a course that combines gaming and programming.", MAY8),
             EvidenceTurn("D23:13", "James", "Two days ago I signed up for a cooking class.", MAY8)]
    lines = ["8 May 2023 James signed up for a cooking class.", "8 May 2023 James joined an online gaming tournament.",
             "8 May 2023 James: Only $10 per class! (replying to John: How much do these cooking courses cost?)"]
    row = {**ROW, "category": 1, "question": "What kind of classes has James joined?", "prediction": "omelette",
           "answer": "game design course, cooking classes", "evidence": ["D13:6", "D23:13"],
           "evidence_raw": ["D13:6", "D23:13"]}
    mems = ({"id": "m1", "text": turns[0].text, "source_ids": ["D13:6"]},
            {"id": "m2", "text": lines[0], "source_ids": ["D23:13"]})
    kw = dict(mems=mems, context=("m2",), evidence_turns=turns, context_sources=[["D23:13"], ["D4:2"], ["D23:15"]])
    got = label_question(ev(row, context_lines=lines, **kw))
    assert got[0] == "partial-retrieval" and "missed D13:6" in got[1], got
    # one line holding the missed turn's words of that item together makes it redundant
    got = label_question(ev(row, context_lines=[*lines, "8 May 2023 James: my gaming course is great"],
                            **{**kw, "context_sources": [*kw["context_sources"], ["D14:2"]]}))
    assert got[0] == "reading-miss" and "missed D13:6 carry nothing" in got[1], got


def test_the_other_persons_turn_naming_what_the_asked_person_said_of_themself():
    # blind3 conv-50/q111: Dave says the poster "reminds me of one of my favorite Disney movies", Calvin's reply
    # names it ("Ratatouille is one of my favorites!"): the fact is Dave's, Calvin only names it
    q, gold = "Which Disney movie did Dave mention as one of his favorites?", "Ratatouille"
    dave = "Wow, that's a gorgeous poster! It reminds me of one of my favorite Disney movies. Have you seen it yet?"
    reply = "Thanks! Ratatouille is one of my favorites! Last time we talked, you mentioned your car hobby."
    spoken = {"Dave": [dave], "Calvin": [reply]}
    calvin = [EvidenceTurn("D19:6", "Calvin", reply, MAY8, ("Dave", dave))]
    assert speaker_contradiction(q, calvin, ("Calvin", "Dave"), gold, spoken) is None
    # the same reply after Dave's question to Calvin, or after a passing word of his, is Calvin's own fact
    for before in ("Which Disney movie is your favorite?", "I love the poster. Disney is on my list."):
        turns = [EvidenceTurn("D19:6", "Calvin", reply, MAY8, ("Dave", before))]
        assert "never says it" in speaker_contradiction(q, turns, ("Calvin", "Dave"), gold, spoken), before
    assert speaker_contradiction(q, [EvidenceTurn("D19:6", "Calvin", reply, MAY8)], ("Calvin", "Dave"), gold, spoken)



def test_a_suffix_or_prefix_is_no_glued_word():
    # "boxing" is not "box ing" (blind3 conv-43/q53's gold), "Somewhat" not "Some what", "himself" not "him self",
    # "returned" not "re turned", "Sunday" not "Sun day"; a glued pair still splits ("localzoo", "withfriends")
    pairs = conversation_bigrams(["a box of tools", "it is what it is", "some days", "him and the self", "the zoo",
                                  "re the sun", "ing day", "local park", "with you", "my friends", "turned up"])
    for word in ("boxing", "Somewhat", "himself", "returned", "Sunday"):
        assert deglue(word, pairs) == word, word
    assert deglue("a localzoo, hanging withfriends", pairs) == "a local zoo, hanging with friends"


def test_a_dates_comma_parts_are_not_parts_another_line_carries():
    # blind4 conv-42/q51: gold "25 May, 2022", the only dating turn (D13:9) at rank 73; the context's other lines of
    # 2022 about the gift held "2022", which made the failure partial-retrieval as though one part had reached
    turns = [EvidenceTurn("D13:9", "Nate", "I got Tilly for Joanna today!", datetime(2022, 5, 25))]
    row = {**ROW, "category": 1, "question": "When did Nate get Tilly for Joanna?", "answer": "25 May, 2022",
           "evidence": ["D13:9"], "evidence_raw": ["D13:9"], "prediction": "21 October 2022"}
    line = "21 October 2022 Nate: Tilly has been such a great gift for Joanna."
    kw = dict(row=row, mems=({"id": "m1", "text": turns[0].text, "source_ids": ["D13:9"]},), context=("m7",),
              evidence_turns=turns, ranks={"D13:9": 73}, depth=100, context_sources=[["D24:4"]],
              speakers=("Nate", "Joanna"), context_lines=[line])
    got = label_question(ev(**kw))
    assert got[0] == "retrieval-miss" and "D13:9 at rank 73" in got[1], got
    # a list gold's comma parts still are: one carried through another line is partial-retrieval
    lst = {**row, "question": "What pets did Nate get for Joanna?", "answer": "a turtle, a dog", "prediction": "a cat"}
    said = [EvidenceTurn("D13:9", "Nate", "I got Joanna a turtle and a dog today!", datetime(2022, 5, 25))]
    got = label_question(ev(**{**kw, "row": lst, "evidence_turns": said, "turns": said[0].text,
                               "mems": ({"id": "m1", "text": said[0].text, "source_ids": ["D13:9"]},),
                               "context_lines": ["21 October 2022 Nate: Joanna's new pet is a dog."]}))
    assert got[0] == "partial-retrieval" and "through other turns" in got[1], got


def test_an_inferred_answers_ground_reaches_through_its_same_session_neighbour():
    # issue 36 (the definitions, fourth revision): an inferred answer rests on its evidence turns, reached by the
    # turn, its observation or the turn beside it in the same session; a line from elsewhere that only points the
    # same way is no ground
    turns = [EvidenceTurn("D5:3", "Ann", "I spend every weekend on the trails with my dog.", MAY8)]
    row = {**ROW, "category": 3, "question": "Would Ann enjoy a career as a park ranger?",
           "answer": "Likely yes", "evidence": ["D5:3"], "evidence_raw": ["D5:3"], "prediction": "my dog"}
    kw = dict(row=row, mems=({"id": "m1", "text": turns[0].text, "source_ids": ["D5:3"]},), context=("m7",),
              evidence_turns=turns, turns=turns[0].text, ranks={"D5:3": 30}, depth=100, speakers=("Ann", "Bob"),
              context_lines=["8 May 2023 Bob: Those trails sound lovely, Ann."])
    assert label_question(ev(**kw, context_sources=[["D5:4"]]))[0] == "reading-miss"
    got = label_question(ev(**kw, context_sources=[["D9:4"]]))  # the same line from another session
    assert got[0] == "retrieval-miss" and "D5:3 at rank 30" in got[1], got


def test_a_date_computed_from_two_turns_reaches_one_through_its_neighbour():
    # blind5 conv-49/q70: "How long did Evan and his partner date before getting married?" (gold "four months")
    # from D5:1 (met her "last week", 7 August) and D21:1 ("Long time no see", 26 December); D21:1's neighbour
    # D21:2 ("got married last week") was in the context: one hop reached, the other missed
    turns = [EvidenceTurn("D5:1", "Evan", "Last week I met this awesome Canadian woman.", datetime(2023, 8, 7)),
             EvidenceTurn("D21:1", "Sam", "Hey Evan! Long time no see, how's it going?", datetime(2023, 12, 26))]
    row = {**ROW, "category": 2, "question": "How long did Evan and his partner date before getting married?",
           "answer": "four months", "evidence": ["D5:1", "D21:1"], "evidence_raw": ["D5:1", "D21:1"],
           "prediction": "a minor accident"}
    mems = tuple({"id": f"m{i}", "text": t.text, "source_ids": [t.id]} for i, t in enumerate(turns))
    kw = dict(row=row, mems=mems, context=("m7",), evidence_turns=turns, turns=" ".join(t.text for t in turns),
              ranks={"D5:1": None, "D21:1": 22}, depth=100, speakers=("Evan", "Sam"),
              context_lines=["26 December 2023 Evan: I got married last week!"])
    got = label_question(ev(**kw, context_sources=[["D21:2"]]))
    assert got[0] == "partial-retrieval" and "reached D21:1" in got[1], got
    assert label_question(ev(**kw, context_sources=[["D9:2"]]))[0] == "retrieval-miss"  # not its neighbour


def test_a_gold_of_some_time_ago_is_only_a_relative_time():
    # blind6 conv-30/q11: "When did Jon get his tattoo?" gold "A few years ago" (said on 8 February 2023)
    row = {**ROW, "category": 2, "question": "When did Bob get Rex?", "prediction": "2020"}
    for gold in ("A few years ago", "a couple of weeks ago", "3 years ago", "Last year"):
        got = label_question(ev({**row, "answer": gold}))
        assert got == ("label-issue", f"the gold {gold!r} is a relative time with no date: it depends on when it was "
                                      "said"), got
    assert label_question(ev({**row, "answer": "two weeks"}))[0] != "label-issue"  # a duration, not a time
