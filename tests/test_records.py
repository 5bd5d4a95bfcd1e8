"""The run's records are typed both ways: run.json, the memories trace and the retrieval trace's hits are written
and read through one dataclass each (`memlab.run.records`, `memlab.memory.search_types.HitRecord`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memlab.memory.search_types import HIT_COLUMNS, HitRecord
from memlab.run import ExperimentConfig, run_experiment
from memlab.run.records import ExtractionTraceRecord, MemoryRecord, RecordSchemaError, RunInfo
from memlab.run.results import RunFileError, read_run_json


@pytest.fixture
def run(synthetic_path, tmp_path):
    cfg = ExperimentConfig.from_dict({"name": "rec", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns"}})
    return run_experiment(cfg, results=tmp_path / "r", progress=False)


def test_run_json_is_written_and_read_through_run_info(run):
    raw = json.loads((run.run_dir / "run.json").read_text())
    fields = {f.name for f in dataclasses.fields(RunInfo)} - {"extra"}
    assert set(raw) <= fields and raw["schema"] == 1  # every written key is a declared field
    assert read_run_json(run.run_dir / "run.json") == raw
    info = RunInfo.from_dict(raw)
    assert info.status == "complete" and info.errors == 0 and info.extra == {}


def test_run_info_keeps_fields_it_does_not_know_and_refuses_a_bad_status(tmp_path):
    d = {"run_id": "x", "status": "complete", "a_later_field": [1, 2]}
    info = RunInfo.from_dict(d)
    assert info.extra == {"a_later_field": [1, 2]} and info.to_dict()["a_later_field"] == [1, 2]
    with pytest.raises(RecordSchemaError, match="status 'done'"):
        RunInfo.from_dict({"run_id": "x", "status": "done"})
    p = tmp_path / "run.json"
    p.write_text(json.dumps({"status": "complete"}))
    with pytest.raises(RunFileError, match=f"{p}: missing field.*run_id"):
        read_run_json(p)


def test_memories_and_hits_round_trip_through_their_records(run):
    from memlab.trace import load

    lines = [json.loads(x) for x in (run.run_dir / "traces" / "memories.jsonl").read_text().splitlines()]
    assert lines and all(MemoryRecord.from_dict(x).to_dict() == x for x in lines)
    ops = [json.loads(x) for x in (run.run_dir / "traces" / "extraction.jsonl").read_text().splitlines()]
    assert ops and all(ExtractionTraceRecord.from_dict(x).to_dict() == x for x in ops)
    failed = {"conversation": "c", "job_status": "failed", "reason": "timeout"}  # a failed job: only its fields
    assert ExtractionTraceRecord.from_dict(failed).to_dict() == failed
    tr = load(run.run_dir)
    assert len(tr.memories) == len(lines) and len(tr.extraction) == len(ops)
    assert list(tr.retrieval.columns) == ["qid", "query_index", "query", *HIT_COLUMNS]
    first = json.loads((run.run_dir / "traces" / "retrieval.jsonl").read_text().splitlines()[0])
    hit = first["queries"][0]["hits"][0]
    assert HitRecord.from_dict(hit).to_dict() == hit


def test_a_hit_with_an_unknown_field_is_an_error_naming_the_file(run):
    from memlab.trace import load

    path = run.run_dir / "traces" / "retrieval.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0]["queries"][0]["hits"][0]["dense_rnak"] = 3  # a misspelt field was a silent extra column before
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=f"{path}.*dense_rnak"):
        load(run.run_dir)


def test_an_extraction_trace_line_with_an_unknown_field_is_an_error_naming_the_file(run):
    from memlab.trace import load

    path = run.run_dir / "traces" / "extraction.jsonl"
    path.write_text(path.read_text().replace('"job_status"', '"jobstatus"', 1))
    with pytest.raises(RecordSchemaError, match=f"{path}:1"):
        load(run.run_dir)


def test_strict_fields_are_one_rule_each_stage_raising_its_own_error():
    """A hit (memory stage: ValueError) and a trace record (run stage: RecordSchemaError) are read by one strict rule
    (`memlab.plain.from_fields`): an unknown or missing field names where it was read and the class's fields."""
    with pytest.raises(ValueError, match=r"^f\.jsonl:3: unknown field\(s\) \[.rnak.\] for HitRecord; its fields: rank"):
        HitRecord.from_dict({"rnak": 1}, where="f.jsonl:3")
    with pytest.raises(ValueError, match=r"^h: HitRecord: .*missing 4 required"):
        HitRecord.from_dict({}, where="h")
    with pytest.raises(RecordSchemaError, match=r"^t:2: unknown field\(s\) \['x'\] for MemoryRecord; its fields: "):
        MemoryRecord.from_dict({"x": 1}, where="t:2")
    with pytest.raises(RecordSchemaError, match=r"^t:2: MemoryRecord: .*missing 4 required"):
        MemoryRecord.from_dict({}, where="t:2")
