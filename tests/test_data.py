from __future__ import annotations

import hashlib
import http.server
import threading
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from memlab.data import (
    CATEGORY_LABELS,
    ChecksumMismatchError,
    DataNotFoundError,
    LoCoMoFormatError,
    fetch_locomo,
    load_locomo,
    parse_session_date,
    recover_evidence_ids,
    resolve_locomo_path,
)


def test_synthetic_records(synthetic_path):
    data = load_locomo(synthetic_path)
    assert [c.sample_id for c in data] == ["syn-1", "syn-2"]
    c1 = data["syn-1"]
    assert c1.speakers == ("Alice", "Bob")
    assert [s.index for s in c1.sessions] == [1, 2]
    assert c1.sessions[0].date_time == datetime(2023, 5, 8, 13, 56)
    photo = c1.turn("D1:3")
    assert photo.image_caption == "a photo of a blue vase"
    assert "shared a photo: a photo of a blue vase" in photo.searchable_text
    assert c1.turn("D1:1").searchable_text == c1.turn("D1:1").text
    cats = sorted({q.category for q in c1.questions})
    assert cats == [1, 2, 3, 4, 5]
    adv = c1.questions[4]
    assert adv.answer is None and adv.adversarial_answer == "Rex" and adv.category_label == "adversarial"
    assert [o.dia_ids for o in c1.observations] == [("D1:1",), ("D1:2",), ("D2:1",), ("D2:2",)]
    assert c1.session_summaries[1].startswith("Alice and Bob")
    # the session date without turns is reported, not a session
    assert data.report.dates_without_session == [("syn-1", "session_3_date_time")]


def test_evidence_issues_are_reported_not_fatal(synthetic_path):
    data = load_locomo(synthetic_path)
    q = data["syn-2"].questions[1]
    assert q.evidence == ("D:1:2", "D9:9")
    assert q.evidence_ids == ("D1:2",)  # recovered from the malformed id; the dangling one dropped
    kinds = {(i.raw, i.kind) for i in data.report.evidence_issues}
    assert kinds == {("D:1:2", "malformed"), ("D9:9", "dangling")}


def test_category_labels_overridable(synthetic_path):
    data = load_locomo(synthetic_path, category_labels={1: "single-hop (mem0)"})
    q = data["syn-1"].questions[0]
    assert q.category == 1 and q.category_label == "single-hop (mem0)"
    assert CATEGORY_LABELS[1] == "multi-hop"  # default untouched


def test_recover_evidence_ids():
    assert recover_evidence_ids("D8:6; D9:17") == ("D8:6", "D9:17")
    assert recover_evidence_ids("D:11:26") == ("D11:26",)
    assert recover_evidence_ids("D30:05") == ("D30:5",)
    assert recover_evidence_ids("D") == ()


def test_parse_session_date():
    assert parse_session_date("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56)
    assert parse_session_date("12:09 am on 13 September, 2023") == datetime(2023, 9, 13, 0, 9)
    with pytest.raises(ValueError):
        parse_session_date("May 8 2023")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda s: s[0].pop("conversation"), "key 'conversation'"),
        (lambda s: s[0]["conversation"]["session_1"][1].pop("dia_id"), "dia_id"),
        (lambda s: s[0]["conversation"].__setitem__("session_2_date_time", "sometime in June"),
         "conversation.session_2_date_time"),
        (lambda s: s[1].__setitem__("qa", [{"question": "x?", "category": 9, "answer": "y", "evidence": []}]),
         "qa[0].category"),
        (lambda s: s[1]["qa"][0].pop("answer"), "qa[0].answer"),
        (lambda s: s[0]["conversation"].__setitem__("session_1", "oops"), "conversation.session_1"),
    ],
)
def test_broken_files_raise_one_clear_error(write_locomo, edit, needle):
    p = write_locomo(edit)
    with pytest.raises(LoCoMoFormatError) as ei:
        load_locomo(p)
    msg = str(ei.value)
    assert str(p) in msg and needle in msg and "expected" in msg


def test_not_json_and_not_list(write_locomo):
    with pytest.raises(LoCoMoFormatError, match="not valid JSON"):
        load_locomo(write_locomo(raw_text="{oops"))
    with pytest.raises(LoCoMoFormatError, match="expected a JSON list"):
        load_locomo(write_locomo(raw_text='{"a": 1}'))


def test_sample_names_itself_in_error(write_locomo):
    p = write_locomo(lambda s: s[1]["conversation"]["session_1"][0].pop("dia_id"))
    with pytest.raises(LoCoMoFormatError, match=r"sample syn-2 \(#1\)"):
        load_locomo(p)


def test_resolution_order(tmp_path, monkeypatch, synthetic_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMLAB_LOCOMO", raising=False)
    with pytest.raises(DataNotFoundError, match="memlab data fetch"):
        resolve_locomo_path()
    cached = tmp_path / "cache" / "memlab" / "locomo10.json"
    cached.parent.mkdir(parents=True)
    cached.write_text("[]")
    assert resolve_locomo_path() == cached
    monkeypatch.setenv("MEMLAB_LOCOMO", str(synthetic_path))
    assert resolve_locomo_path() == synthetic_path
    assert resolve_locomo_path(cached) == cached
    with pytest.raises(DataNotFoundError, match="the path given"):
        resolve_locomo_path(tmp_path / "nope.json")


class _Server:
    def __init__(self, payload: bytes):
        payload_ = payload

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload_)))
                self.end_headers()
                self.wfile.write(payload_)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/data/locomo10.json"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_fetch_verifies_and_writes_atomically(tmp_path, synthetic_path):
    payload = synthetic_path.read_bytes()
    good = hashlib.sha256(payload).hexdigest()
    srv = _Server(payload)
    try:
        dest = tmp_path / "dl" / "locomo10.json"
        out = fetch_locomo(dest, url=srv.url, sha256=good)
        assert out == dest and dest.read_bytes() == payload
        assert not [p for p in dest.parent.iterdir() if p.name.endswith(".part")]
        assert len(load_locomo(dest)) == 2
    finally:
        srv.close()


def test_fetch_refuses_corrupted_file_and_keeps_existing(tmp_path, synthetic_path):
    payload = synthetic_path.read_bytes()
    good = hashlib.sha256(payload).hexdigest()
    srv = _Server(payload[:-10] + b"corrupted!")
    try:
        dest = tmp_path / "dl" / "locomo10.json"
        dest.parent.mkdir()
        dest.write_bytes(b"previous content")
        with pytest.raises(ChecksumMismatchError, match="does not match"):
            fetch_locomo(dest, url=srv.url, sha256=good, force=True)
        assert dest.read_bytes() == b"previous content"
        assert sorted(p.name for p in dest.parent.iterdir()) == ["locomo10.json"]
    finally:
        srv.close()


def test_fetch_unreachable_says_how(tmp_path):
    with pytest.raises(ConnectionError, match="MEMLAB_LOCOMO"):
        fetch_locomo(tmp_path / "x.json", url="http://127.0.0.1:9/none", timeout=2)


def test_cli_fetch_and_info(tmp_path, synthetic_path, capsys, monkeypatch):
    from memlab.cli import main

    payload = synthetic_path.read_bytes()
    srv = _Server(payload)
    monkeypatch.setattr("memlab.data.fetch.LOCOMO_SHA256", "0" * 64)
    try:
        rc = main(["data", "fetch", "--dest", str(tmp_path / "f.json"), "--url", srv.url])
        assert rc == 2 and "does not match" in capsys.readouterr().err
        assert not (tmp_path / "f.json").exists()
    finally:
        srv.close()
    assert main(["data", "info", str(synthetic_path)]) == 0
    out = capsys.readouterr().out
    assert "dangling" in out and "malformed" in out


def test_real_file_counts(locomo):
    c = locomo.counts()
    assert (c["conversations"], c["sessions"], c["turns"], c["questions"]) == (10, 272, 5882, 1986)
    assert locomo.stats()["questions"].to_dict() == {1: 282, 2: 321, 3: 96, 4: 841, 5: 446}
    assert sum(1 for t in (t for conv in locomo for t in conv.turns) if t.image_caption) == 1226
    kinds = sorted((i.sample_id, i.raw) for i in locomo.report.evidence_issues)
    assert ("conv-26", "D8:6; D9:17") in kinds and len(kinds) == 9
    assert all(e in locomo[q.conversation_id].turn_index for q in locomo.questions for e in q.evidence_ids)


def test_real_file_sha(locomo_path):
    from memlab.data import LOCOMO_SHA256, sha256_file

    assert sha256_file(locomo_path) == LOCOMO_SHA256


def test_demo_writes_run_folder(synthetic_path, tmp_path, capsys):
    from memlab.demo import run_demo

    run_dir = run_demo(str(synthetic_path), str(tmp_path / "results"))
    out = capsys.readouterr().out
    assert "overall 1-4" in out and "F1 always abstain" in out and "F1 offline" in out
    table = pd.read_csv(Path(run_dir, "demo_comparison.csv"), index_col=0)
    assert table.loc["5", "F1 always abstain"] == 1.0 and table.loc["overall 1-5", "n"] == 7
    row = table.loc["overall 1-5"]  # F1 with its interval and n, as `memlab report` shows it
    assert row["F1 offline lo"] <= row["F1 offline"] <= row["F1 offline hi"]
    line = next(ln for ln in out.splitlines() if ln.startswith("overall 1-5"))
    assert f"{row['F1 offline']:.3f} [{row['F1 offline lo']:.3f}, {row['F1 offline hi']:.3f}]" in line
    assert Path(run_dir, "environment.json").is_file() and Path(run_dir, "predictions.csv").is_file()


# ------------------------------------------------------------------ issue 35
@pytest.mark.parametrize("fmt", ["locomo", "longmemeval"])
def test_a_file_nested_too_deeply_is_one_line(fmt, tmp_path, capsys):
    from memlab.cli import main

    deep = "[" * 100_000 + "]" * 100_000
    key = '"sample_id": "x", "conversation"' if fmt == "locomo" else '"question_id": "x", "haystack_sessions"'
    p = tmp_path / "deep.json"
    p.write_text(f"[{{{key}: {deep}}}]")
    assert main(["data", "info", str(p)]) == 2  # before: RecursionError, a traceback
    err = capsys.readouterr().err
    assert err.startswith(f"memlab: {p}:") and "nested too deeply" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("key", ["answer", "adversarial_answer"])
def test_a_locomo_gold_answer_that_is_not_a_finite_number_is_refused(value, key, write_locomo):
    p = write_locomo()
    text = p.read_text().replace('"answer": "Rex"', f'"{key}": {value}', 1) if key == "answer" else \
        p.read_text().replace('"adversarial_answer": "Rex"', f'"adversarial_answer": {value}', 1)
    p.write_text(text)
    with pytest.raises(LoCoMoFormatError, match=rf"syn-1 \(#0\).*qa\[\d\]\.{key}.*a string or a finite number"):
        load_locomo(p)  # before: the gold answer became "nan", and a right answer scored 0
