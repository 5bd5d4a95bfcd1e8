"""The run's records are typed both ways: run.json, the memories trace and the retrieval trace's hits are written
and read through one dataclass each (`memlab.run.records`, `memlab.memory.search_types.HitRecord`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

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
    assert ExtractionTraceRecord.from_dict(failed).to_dict() == {**failed, "schema": 1}  # a line from before versions
    tr = load(run.run_dir)
    assert len(tr.memories) == len(lines) and len(tr.extraction) == len(ops)
    assert list(tr.retrieval.columns) == ["qid", "query_index", "query", *HIT_COLUMNS]
    first = json.loads((run.run_dir / "traces" / "retrieval.jsonl").read_text().splitlines()[0])
    hit = first["queries"][0]["hits"][0]
    assert HitRecord.from_dict(hit).to_dict() == hit
    assert all(x["schema"] == 1 for x in [*lines, *ops, hit])  # every trace record says its version


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


OLD_RUN = Path(__file__).parent / "old_runs" / "offline-20261205-112651.run.json"


def test_a_finished_runs_run_json_from_before_the_typed_tree_still_loads():
    """The run.json of a full offline LoCoMo-10 run of main (ba934b3's day, /work/runs/offline-20261205-112651)."""
    raw = json.loads(OLD_RUN.read_text())
    assert read_run_json(OLD_RUN) == raw  # read, checked and written back unchanged
    info = RunInfo.from_dict(raw, where=str(OLD_RUN))
    assert info.extra == {} and info.executor["kind"] == "local" and info.role_errors["reader"]["of"] == 1986


@pytest.mark.parametrize(("path", "bad", "expected"), [
    (("questions",), "1986", "an integer or null, got str"),
    (("error_rate",), True, "a number or null, got bool"),
    (("timings", "total_s"), "fast", "a number, got str"),
    (("executor", "answer_processes"), 2.5, "an integer, got float"),
    (("role_errors", "reader", "errors"), None, "an integer, got NoneType"),
    (("sessions", 0, "status"), 3, "text, got int"),
    (("model_roles",), {"reader": "x"}, "list[text] or null, got dict"),
    (("scoring",), ["locomo"], "an object (ScoringInfo) or null, got list"),
])
def test_a_wrong_type_in_run_json_is_an_error_naming_the_file_and_field(tmp_path, path, bad, expected):
    d = json.loads(OLD_RUN.read_text())
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = bad
    p = tmp_path / "run.json"
    p.write_text(json.dumps(d))
    name = ".".join(str(k) for k in path).replace(".0.", "[0].")
    with pytest.raises(RunFileError) as e:
        read_run_json(p)
    assert str(e.value).startswith(f"{p}: field {name}: expected {expected}")


@pytest.mark.parametrize(("read", "line", "error"), [
    (lambda d, w: MemoryRecord.from_dict(d, w), {"conversation": "c", "id": "m", "text": "t", "kind": "fact"},
     RecordSchemaError),
    (lambda d, w: ExtractionTraceRecord.from_dict(d, w), {"conversation": "c", "job_status": "ok"}, RecordSchemaError),
    (lambda d, w: HitRecord.from_dict(d, w), {"rank": 1, "id": "m", "source_ids": [], "score": 0.5}, ValueError),
])
def test_a_trace_record_of_another_schema_version_is_an_error_naming_where(read, line, error):
    assert read(line, "t.jsonl:1").schema == 1  # a line written before records were versioned reads as version 1
    assert read({**line, "schema": 1}, "t.jsonl:1").schema == 1
    with pytest.raises(error, match=r"^t\.jsonl:7: schema version 2; this memlab reads version 1"):
        read({**line, "schema": 2}, "t.jsonl:7")
