"""Answer ceiling@k and answer-bearing@k: hand-worked values, an exhaustive check against the official
scorer over every span (and pair of spans for multi-hop), and the per-question record of a real run."""

from __future__ import annotations

import math
import random
import time
from datetime import datetime

import pytest

from memlab.eval.ceiling import (
    Asked,
    about,
    answer_bearing,
    answer_ceiling,
    context_lines,
    gold_parts,
    jointly_asked,
    line_words,
    memory_line,
)
from memlab.eval.gold_checks import content_tokens, conversation_bigrams
from memlab.eval.scoring import score_answer


def test_hand_worked_values():
    lines = ["Bob adopted a dog named Rex last week", "Alice went to Sweden"]
    assert answer_ceiling("Rex", 4, lines) == 1.0
    # the best span is "Rex" alone: F1 2 * 1 / (1 + 2) against the two gold tokens of "Rex Smith"
    assert answer_ceiling("Rex Smith", 4, lines) == pytest.approx(2 / 3)
    # category 3 cuts the gold at ';' first, as the official scorer does
    assert answer_ceiling("Sweden; she said so twice", 3, lines) == 1.0
    # category 1: one span per comma part, the mean over parts (Rex found, Milo not)
    assert answer_ceiling("Rex, Milo", 1, lines) == pytest.approx(0.5)
    assert answer_ceiling("Rex", 4, []) == 0.0
    assert math.isnan(answer_ceiling("Rex", 5, lines)) and math.isnan(answer_bearing("Rex", 5, lines))
    assert answer_ceiling("", 4, lines) == 0.0 and answer_bearing("", 4, lines) == 0.0
    # a span never crosses two memories: "Rex Alice" is not a span of either line
    assert answer_ceiling("Rex Alice", 4, lines) == pytest.approx(2 / 3)
    # bearing: every gold token somewhere in the context (not necessarily one line)
    assert answer_bearing("Rex and Alice", 4, lines) == 1.0
    assert answer_bearing("Rex and Milo", 4, lines) == 0.0


def test_the_date_is_part_of_what_the_reader_sees():
    line = memory_line("Caroline: I went to the support group yesterday", datetime(2023, 5, 8, 13, 56))
    assert line.startswith("8 May 2023 ")
    assert answer_ceiling("8 May 2023", 2, [line]) == 1.0
    assert memory_line("x", "2023-05-08 13:56:00") == "8 May 2023 x"
    assert memory_line("x", None) == memory_line("x", float("nan")) == "x"

    class Entry:
        text, event_time = "hello", datetime(2024, 1, 2)

    assert context_lines([Entry()]) == ["2 January 2024 hello"]


def test_exact_against_the_official_scorer_over_every_span():
    """The ceiling is the best official F1 over every span (per comma part for multi-hop) that holds a content
    word of the gold (part): a span credited for function words alone ("to", "in") scores nothing."""
    rng = random.Random(7)
    vocab = "cat dog went to paris in may 2023 painting sunset lake the a".split()
    for _ in range(1500):
        lines = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(0, 3))]
        cat = rng.choice([1, 2, 3, 4])
        gold = ", ".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 3)))
                         for _ in range(rng.randint(1, 2)))
        spans = [" ".join(ws[i:j]) for ws in (s.split() for s in lines)
                 for i in range(len(ws)) for j in range(i + 1, len(ws) + 1)]
        parts = gold_parts(gold, cat)

        def best(part, spans=spans):
            need = content_tokens(part)
            return max((score_answer(c, part, 4) for c in spans if not need or need & content_tokens(c)), default=0.0)

        want = sum(best(p) for p in parts) / len(parts)
        assert answer_ceiling(gold, cat, lines) == pytest.approx(want), (gold, cat, lines)
    # without the function-word rule this would score 2 / 3: "to" alone against "to paris"
    assert answer_ceiling("to paris", 4, ["went to lake"]) == 0.0
    assert answer_ceiling("Lord of the Rings", 4, ["a cup of tea"]) == 0.0  # "of" alone scored .5 before


def test_fast_on_a_deep_context():
    rng = random.Random(1)
    words = [f"w{i}" for i in range(300)]
    lines = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(40)]  # k = 40, long memories
    t0 = time.process_time()
    for i in range(50):
        answer_ceiling(" ".join(rng.choice(words) for _ in range(6)), 1 + i % 4, lines)
    assert (time.process_time() - t0) / 50 < 0.05  # CPU seconds per question


def test_every_answered_question_records_its_ceiling(synthetic_path, tmp_path):
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.trace import load

    cfg = ExperimentConfig.from_dict({"name": "ceil", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns+observations"}})
    run = run_experiment(cfg, results=tmp_path, progress=False)
    p = run.predictions.set_index("qid")
    assert p.loc[p.category == 5, "answer_ceiling"].isna().all()
    assert p.loc[p.category != 5, "answer_ceiling"].notna().all()
    assert p.loc["syn-1/q3", "answer_ceiling"] == 1.0 and p.loc["syn-1/q3", "answer_bearing"] == 1.0
    # recomputed independently from the traces: the context memories as dated lines, with their dialog ids
    from memlab.data import load_locomo
    from memlab.eval.ceiling import Asked

    data = load_locomo(synthetic_path)
    tr = load(run.run_dir)
    mems = tr.memories.set_index("id")
    for qid, row in p[p.category != 5].iterrows():
        lines = [memory_line(mems.loc[i, "text"], mems.loc[i, "event_time"]) for i in tr.contexts[qid]]
        sources = [list(mems.loc[i, "source_ids"]) for i in tr.contexts[qid]]
        asked = Asked(row.question, tuple(row.evidence), data[row.conversation_id].speakers)
        for col, f in (("answer_ceiling", answer_ceiling), ("answer_bearing", answer_bearing)):
            assert row[col] == pytest.approx(f(row.answer, row.category, lines, sources, asked)), (qid, col)
    assert "answer ceiling 1.00  answer-bearing yes" in tr.show("syn-1/q3")
    s = run.summary
    for col in ("answer_ceiling", "answer_ceiling_lo", "answer_ceiling_hi", "answer_bearing"):
        assert col in s.columns
    assert math.isnan(s.loc["5", "answer_ceiling"]) and s.loc["4", "answer_ceiling"] == 1.0


def _topk_run(k, f1, ceiling, bearing, recall, ctx):
    from types import SimpleNamespace

    import pandas as pd

    idx = ["1", "2", "3", "4", "5", "overall 1-4", "overall 1-5"]
    d = pd.DataFrame(index=idx)
    d["n"] = [282, 321, 96, 841, 446, 1540, 1986]
    for col, v in (("f1", f1), ("answer_ceiling", ceiling)):
        d[col], d[f"{col}_lo"], d[f"{col}_hi"] = v, v - 0.02, v + 0.04
    d["answer_bearing"], d["context_recall"], d["context_tokens_qa"] = bearing, recall, ctx
    return SimpleNamespace(summary=d, config=SimpleNamespace(retrieval=SimpleNamespace(top_k=k)))


def test_topk_panels_draw_every_measure_per_k_for_overall_and_multihop(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from memlab import plots

    runs = [_topk_run(20, 0.22, 0.8, 0.6, 0.85, 900.0), _topk_run(5, 0.22, 0.6, 0.4, 0.6, 250.0),
            _topk_run(10, 0.22, 0.7, 0.5, 0.74, 460.0)]
    table = plots.topk_measures(runs, groups=["overall 1-4", "1"])
    assert list(zip(table.group, table.k)) == [("overall 1-4", 5), ("overall 1-4", 10), ("overall 1-4", 20),
                                               ("1", 5), ("1", 10), ("1", 20)]
    assert list(table.answer_ceiling[:3]) == [0.6, 0.7, 0.8] and list(table.context_tokens_qa[:3]) == [250, 460, 900]
    fig = plots.topk_panels(runs, groups=["overall 1-4", "1"], save_to=tmp_path)
    left = [a for a in fig.axes if a.get_ylabel() == "score / share"]
    assert [a.get_title() for a in left] == ["overall 1-4 (n=1,540)", "1 multi-hop (n=282)"]
    for ax in left:
        ys = sorted(tuple(round(float(y), 3) for y in line.get_ydata()) for line in ax.get_lines()
                    if len(line.get_xdata()) == 3 and line.get_linestyle() != "None")
        assert ys == [(0.22, 0.22, 0.22), (0.4, 0.5, 0.6), (0.6, 0.7, 0.8), (0.6, 0.74, 0.85)]
        assert ax.get_ylim() == (0.0, 1.0)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("answer ceiling" in s for s in labels) and any("answer-bearing" in s for s in labels)
    assert any("context tokens" in s for s in labels) and any("Recall@k" in s for s in labels)
    assert (tmp_path / "topk_measures.png").is_file()
    # an older run without the ceiling columns still draws F1 and recall, the missing measures as NaN
    old = [_topk_run(5, 0.2, 0.6, 0.4, 0.6, 250.0)]
    old[0].summary = old[0].summary.drop(columns=["answer_ceiling", "answer_ceiling_lo", "answer_ceiling_hi",
                                                  "answer_bearing"])
    assert plots.topk_measures(old).answer_ceiling.isna().all()


def test_errata_corrected_gold_drops_the_ceiling_measured_against_the_old_gold(tmp_path):
    import pandas as pd

    from memlab.eval.errata import apply_errata, load_errata

    p = tmp_path / "errata.csv"
    p.write_text("qid,answer\nc/q1,Milo\n", encoding="utf-8")
    frame = pd.DataFrame({"qid": ["c/q1", "c/q2"], "answer": ["Rex", "Rex"], "answer_ceiling": [1.0, 0.5],
                          "answer_bearing": [1.0, 0.0]})
    out = apply_errata(frame, load_errata(p))
    assert math.isnan(out.loc[0, "answer_ceiling"]) and math.isnan(out.loc[0, "answer_bearing"])
    assert out.loc[1, "answer_ceiling"] == 0.5 and out.loc[1, "answer_bearing"] == 0.0


ASK_JOHN = Asked("Does John live close to a beach or the mountains?", ("D22:15",), ("John", "Maria"))


def test_answer_bearing_means_supported_by_a_line_about_the_question():
    # issue 36: gold "beach" in unrelated holiday pictures is no support; the grounding turn (or its neighbour) is
    holiday = ["16 June 2023 John: That beach pic you shared reminded me of our vacation",
               "25 May 2023 John shared a picture of his family at the beach."]
    src = [["D19:22"], ["D16:11"]]
    assert answer_bearing("beach", 3, holiday) == 1.0  # every gold word somewhere: the old, context-wide measure
    assert answer_bearing("beach", 3, holiday, src, ASK_JOHN) == 0.0
    assert answer_ceiling("beach", 3, holiday, src, ASK_JOHN) == 0.0
    for sid in ("D22:15", "D22:16"):  # the evidence turn, or the turn beside it in its session
        assert answer_bearing("beach", 3, holiday[:1], [[sid]], ASK_JOHN) == 1.0
    # a line sharing the question's words (not the choice it offers) is about it
    assert answer_bearing("beach", 3, ["John: we live close to the beach"], [["D3:1"]], ASK_JOHN) == 1.0
    # a reply's quoted turn is not the line's own words ("lives" said by Maria)
    quoted = ["John: that beach pic! (replying to Maria: time for the people in our lives)"]
    assert about(quoted, [["D19:22"]], ASK_JOHN, "beach") == [False]


def test_a_yes_or_no_is_never_supported_by_a_yes_in_the_context():
    ask = Asked("Does Calvin wish to become more popular?", ("D12:11",), ("Calvin", "Dave"))
    lines = ["Calvin: Yes, the show was great!"]
    assert answer_bearing("Yes; he wants to grow his fanbase", 3, lines, [["D5:1"]], ask) == 0.0


def test_a_question_about_two_people_needs_support_for_each():
    ask = Asked("What type of volunteering have John and Maria both done?", ("D3:5", "D2:1"), ("John", "Maria"))
    maria = ["Maria volunteers at a homeless shelter.", "Maria: volunteering at the homeless shelter is rewarding",
             "John admires Maria's volunteer work at a homeless shelter."]  # names both: nobody's own line
    src = [["D8:21"], ["D27:4"], ["D27:5"]]
    gold = "Volunteering at a homeless shelter"
    one = Asked("What type of volunteering has Maria done?", ("D2:1",), ("John", "Maria"))
    assert answer_bearing(gold, 1, maria, src, one) == 1.0  # asked about one person: her words support it
    assert answer_bearing(gold, 1, maria, src, ask) == 0.0
    john = "John: we went to a homeless shelter to volunteer and give out food"
    assert answer_bearing(gold, 1, [*maria, john], [*src, ["D3:5"]], ask) == 1.0
    assert jointly_asked("What did Evan share with Sam?", ("Evan", "Sam")) == []
    assert jointly_asked("How do Jon and Gina both like to destress?", ("Jon", "Gina")) == ["Jon", "Gina"]


def test_the_ceiling_bounds_a_reader_that_computes_dates():
    # issue 36: a question scored 1.0 against a ceiling of .80 ("May 2023" was the best span of "7 May 2023")
    line = memory_line("Bob: I adopted a dog yesterday!", datetime(2023, 5, 8))
    assert answer_ceiling("7 May 2023", 2, [line]) == 1.0 and score_answer("7 May 2023", "7 May 2023", 2) == 1.0
    week = memory_line("Bob: Last week I scored 40 points.", datetime(2023, 7, 16))
    assert answer_ceiling("The week before 16 July 2023", 2, [week]) == 1.0
    assert answer_ceiling("2022", 2, [memory_line("Bob: we went there last year", datetime(2023, 7, 16))]) == 1.0
    assert answer_ceiling("7 May 2023", 2, ["Bob: I adopted a dog yesterday!"]) == 0.0  # no date, nothing computed


def test_glued_gold_words_are_split_for_matching():
    ask = Asked("What are Joanna's hobbies?", ("D1:10", "D2:25"), ("Joanna", "Nate"),
                conversation_bigrams(["I enjoy reading, watching movies, and exploring nature.",
                                      "Writing and hanging with friends!"]))
    gold = "Writing, watchingmovies, exploringnature, hanging withfriends."
    lines = ["Joanna: I enjoy reading, watching movies, and exploring nature.", "Joanna: writing, hanging with friends"]
    src = [["D1:10"], ["D2:25"]]
    assert answer_bearing(gold, 1, lines, src, ask) == 1.0
    assert answer_bearing(gold, 1, lines, src, Asked(ask.question, ask.evidence, ask.speakers)) == 0.0  # no pairs


def test_the_random_context_control(synthetic_path, tmp_path):
    """benchmarks/bearing_control.py: per question and k the context's supported share beside random contexts of the
    same size drawn from the conversation's memories, and the former every-word-anywhere definition."""
    import importlib.util
    from pathlib import Path

    from memlab.run import ExperimentConfig, run_experiment

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bearing_control.py"
    spec = importlib.util.spec_from_file_location("bearing_control", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = ExperimentConfig.from_dict({"name": "ctl", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns+observations"}, "retrieval": {"top_k": 2}})
    run = run_experiment(cfg, results=tmp_path, progress=False)
    per_q = mod.measure(str(run.run_dir), [1, 2], draws=3)
    p = run.predictions.set_index("qid")
    assert set(per_q.qid) == set(p.index[p.category != 5]) and set(per_q.k) == {1, 2}
    assert (per_q["size"] <= per_q["k"]).all()
    # at the run's k the supported share is the run's own answer_bearing
    at2 = per_q[per_q.k == 2].set_index("qid")
    assert (at2.supported == p.loc[at2.index, "answer_bearing"]).all()
    for m in mod.MEASURES:
        assert per_q[m].between(0, 1).all()
    assert mod.former_bearing("Rex", 4, ["a dog named Rex"]) == 1.0 and mod.former_bearing("Rex", 4, ["a cat"]) == 0.0
    t = mod.table(per_q, n_boot=50)
    assert list(t.group[t.k == 2]) == ["1 multi-hop", "2 temporal", "3 open-domain", "4 single-hop", "overall 1-4"]
    assert (t.supported_lo <= t.supported + 1e-9).all() and (t.supported <= t.supported_hi + 1e-9).all()
    assert mod.markdown(t).count("\n") == len(t) + 2


def test_a_hyphenated_compound_in_a_line_holds_its_words():
    # blind3 conv-44/q26: "work-life balance" says "work" (the official normalisation glues it into "worklife")
    ask = Asked("What is the biggest stressor in Andrew's life besides not being able to hike frequently?",
                ("D18:1",), ("Andrew", "Audrey"))
    line = ["4 October 2023 Andrew used to hike a lot but finds it challenging now with work-life balance."]
    assert answer_bearing("work", 1, line, [["D21:5"]], ask) == 1.0
    assert line_words("work-life balance") >= content_tokens("work life balance")
    # a gold's own compound stays one word to find: "self-care" is not "self" and "care" scattered over a line
    assert answer_bearing("self-care", 1, ["Andrew: I care for myself, and hike"], [["D18:1"]], ask) == 0.0


def test_a_line_of_the_month_after_may_report_a_month_the_question_names():
    # blind3 conv-50/q57: a summary of 17 November ("has taken up photography") reports the October the question
    # names; a day question keeps the date checks' slack (blind2 conv-50/q43: 26 days later is another time)
    ask = Asked("Which hobby did Dave pick up in October 2023?", ("D27:2",), ("Calvin", "Dave"))
    lines = ["17 November 2023 Dave has taken up photography as a new hobby.",
             "20 December 2023 Dave has taken up photography as a new hobby.",
             "20 September 2023 Dave is thinking about a new hobby, photography."]
    assert about(lines, [["D30:1"]] * 3, ask) == [True, False, False]
    assert answer_bearing("photography", 2, lines[:1], [["D30:1"]], ask) == 1.0
    day = Asked("Which hobby did Dave pick up on October 3, 2023?", ("D27:2",), ("Calvin", "Dave"))
    assert about(["29 October 2023 Dave has a new hobby."], [["D30:1"]], day) == [False]


def test_a_lines_date_says_nothing_but_a_date():
    # blind5 conv-44/q60: "How many dogs does Andrew have?" (gold "3") was supported by a line dated 3 May 2023
    ask = Asked("How many dogs does Andrew have?", ("D12:1",), ("Andrew", "Audrey"))
    line = ["3 May 2023 Andrew plans to check out the dog park for his own dogs."]
    assert answer_bearing("3", 1, line, [["D4:28"]], ask) == 0.0
    assert answer_ceiling("3", 1, line, [["D4:28"]], ask) == 0.0
    assert answer_bearing("3", 1, ["3 May 2023 Andrew: I have 3 dogs now."], [["D4:28"]], ask) == 1.0
    # the date is still a date gold's to read
    when = Asked("When did Andrew plan to check out the dog park?", ("D4:28",), ("Andrew", "Audrey"))
    assert answer_ceiling("3 May 2023", 2, line, [["D4:28"]], when) == 1.0
    assert answer_bearing("3 May 2023", 2, line, [["D4:28"]], when) == 1.0
