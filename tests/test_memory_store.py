from __future__ import annotations

from datetime import datetime, timezone

import pytest

from memlab.index import open_service
from memlab.memory import (
    InMemoryMemoryService,
    MemoryValidationError,
    SearchOptions,
    SearchUnavailableError,
    SQLiteMemoryService,
    UserKey,
)
from memlab.memory.service import op_log_frame
from memlab.memory.shipping import export_index, export_rows, import_index, import_rows

A = UserKey("app", "alice")
B = UserKey("app", "bob")


@pytest.fixture(params=["memory", "sqlite"])
def svc(request, tmp_path):
    s = open_service(request.param, path=tmp_path / "mem.db" if request.param == "sqlite" else None)
    yield s
    s.close()


def test_crud_and_op_log(svc):
    e = svc.add(A, "Alice likes pottery", kind="fact", topics=["hobby"], source_ids=["D1:1"])
    assert svc.get(A, e.id).text == "Alice likes pottery"
    again = svc.add(A, "Alice likes pottery", kind="fact", source_ids=["D4:2"])
    assert again.id == e.id and svc.count(A) == 1
    assert svc.get(A, e.id).source_ids == ("D1:1", "D4:2")  # provenance merged
    up = svc.update(A, e.id, "Alice loves pottery and clay", source_ids=["D5:1"])
    assert up.ok and up.entry.id == e.id and up.entry.topics == ("hobby",)
    assert up.entry.source_ids == ("D1:1", "D4:2", "D5:1")
    missing = svc.update(A, "nope", "x")
    assert missing.status == "not_found" and missing.entry is None
    assert svc.delete(A, "nope") is False  # not an error
    assert svc.delete(A, e.id) is True and svc.count(A) == 0
    results = [(r.op, r.result) for r in svc.op_log(A)]
    assert results == [("add", "added"), ("add", "exists"), ("update", "updated"), ("update", "not_found"),
                       ("delete", "absent"), ("delete", "deleted")]
    assert [r.seq for r in svc.op_log()] == sorted(r.seq for r in svc.op_log())
    frame = op_log_frame(svc)
    assert list(frame["op"]) == ["add", "add", "update", "update", "delete", "delete"]


def test_key_isolation_same_text(svc):
    ea = svc.add(A, "We adopted a dog named Rex", kind="episode")
    eb = svc.add(B, "We adopted a dog named Rex", kind="episode")
    assert ea.id != eb.id
    assert [h.entry.key for h in svc.search(A, "dog named Rex")] == [A]
    assert svc.update(B, ea.id, "hijack").status == "not_found"
    assert svc.delete(B, ea.id) is False
    assert svc.clear(A) == 1
    assert svc.count(A) == 0 and svc.count(B) == 1
    assert [h.entry.key for h in svc.search(B, "Rex")] == [B]
    assert svc.search(A, "Rex").hits == []


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"text": "   "}, "text: expected non-empty"),
        ({"text": "x", "kind": "opinion"}, "kind: expected one of"),
        ({"text": "x", "topics": "hobby"}, "topics: expected a list"),
        ({"text": "x", "event_time": "2023-05-01"}, "event_time: expected a datetime"),
    ],
)
def test_invalid_input_writes_nothing(svc, kwargs, needle):
    with pytest.raises(MemoryValidationError, match=needle):
        svc.add(A, **kwargs)
    assert svc.count(A) == 0


def test_naive_and_aware_datetimes_are_not_mixed(svc):
    svc.add(A, "a", kind="episode", event_time=datetime(2023, 5, 8))
    with pytest.raises(MemoryValidationError, match="naive"):
        svc.add(A, "b", kind="episode", event_time=datetime(2023, 5, 8, tzinfo=timezone.utc))
    assert svc.count(A) == 1
    svc.add(B, "b", kind="episode", event_time=datetime(2023, 5, 8, tzinfo=timezone.utc))  # other key: fine
    svc.add(A, "c", kind="episode", event_time=datetime(2023, 5, 9))
    e = svc.list(A)[0]
    with pytest.raises(MemoryValidationError):
        svc.update(A, e.id, "a2", event_time=datetime(2023, 5, 9, tzinfo=timezone.utc))
    assert svc.get(A, e.id).text == "a"


def test_read_recent_orders_by_update(svc):
    import time

    ids = []
    for t in ("first", "second", "third"):
        ids.append(svc.add(A, t).id)
        time.sleep(0.002)
    svc.update(A, ids[0], "first, edited")
    assert [e.text for e in svc.read_recent(A, 2)] == ["first, edited", "third"]
    assert len(svc.read_recent(A, -1)) == 3


def test_empty_query_is_empty_result(svc):
    svc.add(A, "anything")
    assert svc.search(A, "").hits == []
    assert svc.search(A, SearchOptions(query="   ")).hits == []


def test_service_without_index_says_so():
    s = InMemoryMemoryService()
    s.add(A, "x")
    with pytest.raises(SearchUnavailableError, match="open_service"):
        s.search(A, "x")


def test_sqlite_survives_restart_with_index(tmp_path):
    db = tmp_path / "store.db"
    s = open_service("sqlite", path=db)
    s.add(A, "Alice moved to Sweden for work", kind="episode", event_time=datetime(2023, 6, 1), source_ids=["D2:2"])
    s.add(A, "Alice likes pottery", source_ids=["D1:1"])
    gone = s.add(A, "Alice had a cat", source_ids=["D1:9"])
    s.delete(A, gone.id)
    before = [(h.id, round(h.score, 9)) for h in s.search(A, "Where did Alice move?")]
    s.close()
    assert (tmp_path / "store.db.index").is_file()
    s2 = open_service("sqlite", path=db)
    assert s2.count(A) == 2
    assert [(h.id, round(h.score, 9)) for h in s2.search(A, "Where did Alice move?")] == before
    assert s2.searcher.builds == 0  # the saved index was reused, not rebuilt
    assert [r.op for r in s2.op_log(A)] == ["add", "add", "add", "delete"]
    e = s2.list(A)[0]
    assert e.event_time == datetime(2023, 6, 1) and e.source_ids == ("D2:2",)
    s2.close()


def test_sqlite_index_rebuilt_when_store_changed_behind_it(tmp_path):
    db = tmp_path / "store.db"
    s = open_service("sqlite", path=db)
    s.add(A, "Alice likes pottery")
    s.search(A, "pottery")
    s.close()
    raw = SQLiteMemoryService(db)  # a writer without the index
    raw.add(A, "Alice bought a kiln for pottery")
    raw.close()
    s2 = open_service("sqlite", path=db)
    texts = {h.entry.text for h in s2.search(A, "kiln pottery")}
    assert "Alice bought a kiln for pottery" in texts
    s2.close()


def test_sqlite_schema_version_checked(tmp_path):
    import sqlite3

    db = tmp_path / "s.db"
    SQLiteMemoryService(db).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    from memlab.memory import SchemaVersionError

    with pytest.raises(SchemaVersionError, match="schema version 99"):
        SQLiteMemoryService(db)


def test_unreadable_or_old_index_file_is_rebuilt(tmp_path):
    import pickle

    db = tmp_path / "store.db"
    s = open_service("sqlite", path=db)
    s.add(A, "Alice likes pottery")
    s.close()
    idx = tmp_path / "store.db.index"
    idx.write_bytes(b"not a pickle")
    s2 = open_service("sqlite", path=db)
    assert [h.entry.text for h in s2.search(A, "pottery")] == ["Alice likes pottery"]
    s2.close()
    idx.write_bytes(pickle.dumps({"version": 1, "config": {}, "keys": {}}))  # an older format
    s3 = open_service("sqlite", path=db)
    assert s3.searcher.builds == 0 and [h.entry.text for h in s3.search(A, "pottery")] == ["Alice likes pottery"]
    assert s3.searcher.builds == 1
    s3.close()


def test_a_key_copied_through_export_and_import_searches_the_same(svc):
    """The public copy of one key (what the Ray executor ships): rows with ids and times, then the built index."""
    for t in ("Alice adopted a dog named Rex", "Alice paints landscapes", "Alice moved to Boston in 2022"):
        svc.add(A, t, kind="fact", source_ids=["D1:1"])
    svc.add(B, "Bob plays chess", kind="fact")
    svc.search(A, "dog")  # builds A's index
    other = open_service("memory")
    other.add(A, "a stale memory the copy replaces", kind="fact")
    import_rows(other, A, export_rows(svc, A))
    assert [e.to_dict() for e in other.list(A)] == [e.to_dict() for e in svc.list(A)]
    assert import_index(other, A, export_index(svc, A)) is True  # the exporter's fit, not a new one
    assert [(h.id, h.score) for h in other.search(A, "dog")] == [(h.id, h.score) for h in svc.search(A, "dog")]
    assert other.count(B) == 0 and export_index(other, B) is None  # nothing of another key came along
    other.add(B, "Bob plays chess", kind="fact")
    with pytest.raises(ValueError, match="belongs to"):
        import_rows(other, B, export_rows(svc, A))
    assert [e.text for e in other.list(B)] == ["Bob plays chess"]  # a refused copy leaves the key as it was
    assert import_index(other, A, None) is False


def test_a_scopes_extraction_trace_reads_only_that_scope_in_the_order_written(svc):
    """A streamed run reads one key's trace lines after each key: reading every scope's rows each time made a
    LongMemEval question's peak memory grow with the keys already extracted (issue 26)."""
    import tracemalloc

    big = "w" * 20_000
    for i in range(40):
        svc.save_extraction(f"s{i}", {}, [("job", n, {"n": n, "scope": f"s{i}", "text": big}) for n in range(5)])
    svc.save_extraction("s3", {}, [("late", 0, {"n": 9, "scope": "s3", "text": ""})])
    assert [(r["scope"], r["n"]) for r in svc.extraction_trace(["s7", "s3"])] == \
        [("s3", n) for n in range(5)] + [("s7", n) for n in range(5)] + [("s3", 9)]
    assert len(svc.extraction_trace()) == 201
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        assert len(svc.extraction_trace(["s5"])) == 5
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * 5 * len(big), f"reading one scope of 40 peaked at {peak} bytes"


def test_an_atomic_batch_that_fails_leaves_neither_rows_nor_index_entries(tmp_path):
    """`atomic` undoes every op of a failed batch, and the attached index (told of each write as it happened)
    re-reads the store, so a search never returns a memory that was rolled back."""
    svc = open_service("sqlite", path=tmp_path / "store.db")
    svc.add(A, "Bob likes hiking in the mountains")
    assert svc.search(A, "hiking").hits
    with pytest.raises(RuntimeError, match="mid-batch"), svc.atomic():
        gone = svc.add(A, "Alice adopted a cat named Tom")
        svc.delete(A, svc.list(A)[0].id)
        raise RuntimeError("mid-batch")
    assert [e.text for e in svc.list(A)] == ["Bob likes hiking in the mountains"]
    assert len(svc.op_log(A)) == 1
    assert gone.id not in {h.id for h in svc.search(A, "cat named Tom").hits}
    svc.close()
