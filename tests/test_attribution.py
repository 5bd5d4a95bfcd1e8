"""The attribution rule on hand-built traces (one case per label), and on a real run."""

from __future__ import annotations

import pytest

from memlab.attribution import LABELS, attribute, attribution_table, coverage, failed, label_question

ROW = {"category": 4, "evidence": ["D1:2"], "evidence_raw": ["D1:2"], "answer": "Rex", "prediction": "a cat",
       "f1": 0.0}
MEM_OK = {"id": "m1", "text": "Bob adopted a dog named Rex"}
MEM_LOST = {"id": "m1", "text": "Bob adopted a pet"}
TURNS = "Bob: I adopted a dog named Rex last week."


@pytest.mark.parametrize(
    "row, mems, context, label",
    [
        ({**ROW, "evidence": [], "evidence_raw": ["D9:9"]}, [MEM_OK], {"m1"}, "label-issue"),
        ({**ROW, "evidence_raw": ["D1:2", "D:1:3"]}, [MEM_OK], {"m1"}, "label-issue"),
        ({**ROW, "category": 5, "answer": None, "prediction": "Rex"}, [MEM_OK], {"m1"}, "abstain-error"),
        ({**ROW, "prediction": "Not mentioned in the conversation."}, [MEM_OK], {"m1"}, "abstain-error"),
        ({**ROW, "prediction": "Not mentioned in the conversation."}, [], set(), "write-miss"),
        (ROW, [], set(), "write-miss"),
        (ROW, [MEM_LOST], {"m1"}, "write-miss"),  # the extracted text lost "Rex"
        (ROW, [MEM_OK], {"m2"}, "retrieval-miss"),
        ({**ROW, "prediction": "Not mentioned in the conversation."}, [MEM_OK], {"m2"}, "retrieval-miss"),
        (ROW, [MEM_OK], {"m1", "m2"}, "reading-miss"),
    ],
)
def test_every_label_on_hand_built_traces(row, mems, context, label):
    got, reason = label_question(row, mems, context, TURNS)
    assert got == label and reason
    assert got in LABELS


def test_failure_definition_and_coverage():
    assert failed({"category": 4, "f1": 0.49})
    assert not failed({"category": 4, "f1": 0.5})
    assert failed({"category": 5, "f1": 0.0, "prediction": "Rex"})
    assert not failed({"category": 5, "f1": 1.0, "prediction": "Not mentioned"})
    assert coverage("the dog Rex", "Rex is a dog") == 1.0 and coverage("Rex", "a cat") == 0.0


def test_attribution_on_a_real_run(locomo_path, locomo, tmp_path):
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.trace import load, trace_size_mb

    cfg = ExperimentConfig.from_dict({"name": "att", "dataset": {"path": str(locomo_path),
                                                                 "conversations": ["conv-26"], "question_limit": 60},
                                      "extraction": {"extractor": "observations"}})
    run = run_experiment(cfg, results=tmp_path, progress=False)
    tr = load(run.run_dir)
    assert trace_size_mb(run.run_dir) < 5
    att = attribute(tr, locomo)
    n_failed = sum(failed(r) for r in run.predictions.to_dict("records"))
    assert len(att) == n_failed and att.qid.is_unique and set(att.label) <= set(LABELS)
    table = attribution_table(att)
    assert table.loc["total", "failed"] == n_failed
    # a write-miss really has no evidence-sourced memory or lost the answer; a retrieval-miss really was not given
    for r in att[att.label == "retrieval-miss"].to_dict("records"):
        ev = set(tr.questions.set_index("qid").loc[r["qid"], "evidence"])
        ctx = set(tr.contexts[r["qid"]])
        sourced = {m["id"] for m in tr.memories.to_dict("records") if set(m["source_ids"]) & ev}
        assert sourced and not (sourced & ctx)
    view = tr.question(att.qid.iloc[0])
    assert {"question", "extractor", "retrieval", "answer"} <= set(view)
    text = tr.show(att.qid.iloc[0])
    assert "1. extractor layer" in text and "2. retrieval layer" in text and "3. answer layer" in text
    with pytest.raises(KeyError):
        tr.question("nope/q0")
