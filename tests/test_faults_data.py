"""Fault injection, dataset and output files: a defect in the input is an error naming where it is;
what memlab writes is readable like any other file of the user's (issue 10)."""

from __future__ import annotations

import json
import os
import stat

import pandas as pd
import pytest

from memlab.atomic import write_json, write_table
from memlab.data import LoCoMoFormatError, load_locomo


def test_duplicate_dia_id_is_rejected_naming_sample_session_and_turn(write_locomo):
    def dup(s):  # the second session reuses the first session's first id
        s[0]["conversation"]["session_2"][0]["dia_id"] = "D1:1"

    with pytest.raises(LoCoMoFormatError) as e:
        load_locomo(write_locomo(dup))
    msg = str(e.value)
    assert "variant.json" in msg and "syn-1" in msg and "session_2[0].dia_id" in msg and "'D1:1'" in msg
    assert "session 1, turn 0" in msg  # where the id was first used


def test_boolean_category_is_rejected(write_locomo):
    def boolean(s):
        s[0]["qa"][3]["category"] = True  # bool is an int in Python: it used to load as category 1

    with pytest.raises(LoCoMoFormatError, match=r"syn-1.*qa\[3\]\.category.*integer 1-5.*bool"):
        load_locomo(write_locomo(boolean))


@pytest.mark.parametrize("where", ["turn", "observation", "answer"])
def test_text_with_a_lone_surrogate_is_rejected(write_locomo, where):
    def surrogate(s):
        bad = "I went to a pottery class \ud800 yesterday."
        if where == "turn":
            s[0]["conversation"]["session_1"][0]["text"] = bad
        elif where == "observation":
            s[0]["observation"]["session_1_observation"]["Alice"][0][0] = bad
        else:
            s[0]["qa"][0]["answer"] = bad

    p = write_locomo(surrogate)
    assert "\\ud800" in p.read_text(encoding="utf-8")  # valid JSON, decodes to a lone surrogate
    with pytest.raises(LoCoMoFormatError, match=r"syn-1.*UTF-8.*surrogate") as e:
        load_locomo(p)
    expected = {"turn": "session_1[0].text", "observation": "session_1_observation.Alice[0]",
                "answer": "qa[0].answer"}[where]
    assert expected in str(e.value)


@pytest.mark.parametrize("qa", ["missing", "empty"])
def test_a_sample_without_questions_loads_and_is_reported(write_locomo, qa):
    def no_questions(s):
        if qa == "missing":
            del s[1]["qa"]
        else:
            s[1]["qa"] = []

    data = load_locomo(write_locomo(no_questions))
    assert [c.sample_id for c in data] == ["syn-1", "syn-2"]
    assert data["syn-2"].questions == () and len(data["syn-2"].turns) == 2
    assert {q.conversation_id for q in data.questions} == {"syn-1"}
    assert data.report.samples_without_questions == ["syn-2"]
    assert "1 samples without questions" in data.report.summary()


def test_qa_that_is_not_a_list_is_rejected(write_locomo):
    def bad(s):
        s[1]["qa"] = {"question": "x"}

    with pytest.raises(LoCoMoFormatError, match=r"syn-2.*'qa'.*a list of questions"):
        load_locomo(write_locomo(bad))


# ------------------------------------------------------------------------------ output files
@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_atomic_outputs_get_the_users_normal_permissions(tmp_path, umask022):
    write_json(tmp_path / "run.json", {"a": 1})
    write_table(tmp_path / "predictions.csv", pd.DataFrame({"x": [1]}))
    for name in ("run.json", "predictions.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    os.umask(0o077)
    write_json(tmp_path / "private.json", {"a": 1})
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600


def test_a_failed_atomic_write_leaves_no_temp_file_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "summary.json"
    write_json(target, {"ok": True})
    with pytest.raises(TypeError):
        write_json(target, {1j: 2})  # complex keys are not JSON
    assert json.loads(target.read_text()) == {"ok": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]

    class Boom(pd.DataFrame):
        def to_csv(self, *a, **k):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_table(tmp_path / "predictions.csv", Boom({"x": [1]}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
