"""The HTML report's fast paths give what the slow ones gave: each is held to the definition it replaced."""

from __future__ import annotations

import math
import string

import numpy as np
import pandas as pd
import pytest

from memlab.eval import bootstrap
from memlab.eval.ceiling import conversation_words
from memlab.eval.gold_checks import conversation_bigrams
from memlab.eval.scoring import normalize_answer
from memlab.report_data import Tables, _clean, _int
from memlab.trace import Traces, table_records


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b or bool(a == b)


def test_table_records_is_to_dict_records():
    df = pd.DataFrame({
        "i": pd.array([1, None, 3], dtype="Int64"), "b": pd.array([True, None, False], dtype="boolean"),
        "f": pd.array([1.5, None, 2.0], dtype="Float64"), "s": pd.Series(["x", None, "z"], dtype="str"),
        "o": [None, np.nan, "a"], "n": np.array([3, 4, 5], dtype=np.int64), "x": [0.5, np.nan, 1.0],
        "t": pd.to_datetime(["2020-01-01", None, "2021-02-03"]), "c": pd.Categorical(["a", None, "a"]),
        "l": [[1], None, ["D1:3"]]})
    want, got = df.to_dict("records"), table_records(df)
    assert [list(r) for r in got] == [list(r) for r in want]
    bad = [(i, k, want[i][k], got[i][k]) for i in range(len(df)) for k in df.columns
           if not _same(want[i][k], got[i][k])]
    assert not bad
    assert table_records(df.iloc[:0]) == []


def test_traces_records_are_made_once_and_follow_a_replaced_table(tmp_path):
    frame = pd.DataFrame({"qid": ["a", "b"], "n": [1, 2]})
    tr = Traces(run_dir=tmp_path, questions=frame, retrieval=pd.DataFrame(), queries=pd.DataFrame(),
                answers=pd.DataFrame(), extraction=pd.DataFrame(), memories=pd.DataFrame(), contexts={})
    first = tr.records("questions")
    assert first == [{"qid": "a", "n": 1}, {"qid": "b", "n": 2}] and tr.records("questions") is first
    tr.questions = frame.iloc[:1]
    assert tr.records("questions") == [{"qid": "a", "n": 1}]
    assert tr.records("memories") == []


def _upstream_normalize(s: str) -> str:
    """LoCoMo's task_eval normalize_answer, character by character as upstream writes it."""
    import regex

    s = s.replace(",", "").lower()
    exclude = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in exclude)
    s = regex.sub(r"\b(a|an|the|and)\b", " ", s)
    return " ".join(s.split())


@pytest.mark.parametrize("text", ["The cat, and a dog!", "It's 7:30 p.m. -- (maybe) [sure] {ok}; \"quoted\"",
                                  "Café «naïve» — résumé’s… ÉTÉ", "An apple; THE end? a\u2018b #tag @me 50% $5 ~x^y|z",
                                  string.punctuation + " x " + string.punctuation, ""])
def test_normalize_answer_drops_punctuation_as_upstream(text):
    assert normalize_answer(text) == _upstream_normalize(text)


def _reference_ci(frame: pd.DataFrame, metrics: list[str], n_boot: int) -> pd.DataFrame:
    """`ci_columns` as it was: every column through `cluster_bootstrap`, whatever it holds."""
    rows = {}
    for name, _, g in bootstrap.groups_of(frame):
        vals = g[metrics].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        boot = bootstrap.cluster_bootstrap(vals, g["conversation_id"].tolist(), n_boot=n_boot, seed=3)
        lo, hi = bootstrap.percentile_ci(boot)
        row = {}
        for i, m in enumerate(metrics):
            row[f"{m}_lo"], row[f"{m}_hi"] = float(lo[i]), float(hi[i])
            row[f"{m}_mdd"] = bootstrap.MDD_FACTOR * np.sqrt(2) * bootstrap.nan_sd(boot[:, i]) if len(g) > 1 \
                else float("nan")
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


@pytest.mark.parametrize("metrics", [["f1", "j", "calls", "tokens", "three", "gappy", "tenth"],
                                     ["j", "calls", "tokens"], ["j", "calls"], ["tokens", "gappy"], ["j"],
                                     ["calls", "f1"]])
def test_known_bootstrap_columns_give_the_resampled_bounds(metrics):
    rng = np.random.default_rng(5)
    n = 400
    frame = pd.DataFrame({"conversation_id": rng.integers(0, 8, n).astype(str), "category": rng.integers(1, 6, n),
                          "f1": rng.random(n), "j": np.nan, "calls": 0.0, "tokens": rng.integers(0, 4000, n) * 1.0,
                          "three": 3.0, "gappy": np.where(rng.random(n) < 0.5, np.nan, 2.0), "tenth": 0.1})
    got = bootstrap.ci_columns(frame, metrics, n_boot=300, seed=3, mdd_metrics=metrics)
    want = _reference_ci(frame, metrics, 300)
    pd.testing.assert_frame_equal(got[want.columns], want, check_exact=True)
    if "calls" in metrics:
        assert got.loc["1", "calls_lo"] == got.loc["1", "calls_hi"] == 0.0
    # a group with no rows: NaN bounds, as the bootstrap of nothing gives
    only5 = frame[frame.category == 5]
    got5 = bootstrap.ci_columns(only5, metrics, n_boot=50, seed=3, mdd_metrics=())
    assert got5.loc["overall 1-4"].isna().all()


def test_conversation_words_are_shared_by_equal_turns():
    turns = (("Caroline", "I went to the LGBTQ support group yesterday."), ("Melanie", "That's great, Caroline!"))
    conversation_words.cache_clear()
    spoken, bigrams = conversation_words(turns)
    again = conversation_words(tuple(list(turns)))  # an equal tuple from another run's dataset object
    assert again[0] is spoken and again[1] is bigrams and conversation_words.cache_info().hits == 1
    assert spoken == {"Caroline": [turns[0][1]], "Melanie": [turns[1][1]]}
    assert bigrams == conversation_bigrams(t for _, t in turns)


def test_clean_and_tables_fast_paths():
    v = {"a": [1, "x", None, float("nan"), np.int64(4), {"b": float("inf"), 2: pd.NA}], "c": (True, 1.5)}
    assert _clean(v) == {"a": [1, "x", None, None, 4, {"b": None, "2": None}], "c": [True, 1.5]}
    assert [_int(x) for x in (3, 2.0, None, float("nan"), pd.NA, np.int64(7), True)] == [3, 2, None, None, None, 7, 1]
    t = Tables()
    tab = t.table([{"w": "x", "n": 1}, {"w": None, "n": 2}, {"w": "x"}, {"w": float("nan")}, {"w": 5}], ("w", "n"),
                  ("w",))
    assert tab["n"] == [1, 2, None, None, None]
    assert t.finish() == ["x", "5"] and tab["w"] == [0, None, 0, None, 1]


def test_the_shipped_stop_words_are_scikit_learns():
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    from memlab.index.text import stop_words

    assert stop_words() == frozenset(ENGLISH_STOP_WORDS) and len(stop_words()) == 318


@pytest.mark.parametrize("b,c", [(0, 1), (1, 1), (5, 9), (40, 60), (300, 330), (900, 1000), (0, 40), (700, 700),
                                 (12, 1974)])
def test_exact_mcnemar_is_scipys_binomial_tail(b, c):
    """The exact integer sum against scipy.stats' binomial CDF (the definition it replaced)."""
    from scipy import stats

    from memlab.eval.significance import mcnemar_from_counts

    want = float(min(1.0, 2 * stats.binom.cdf(min(b, c), b + c, 0.5)))
    assert mcnemar_from_counts(b, c) == pytest.approx(want, rel=1e-12, abs=1e-300)
    assert mcnemar_from_counts(b, c) == mcnemar_from_counts(c, b)
