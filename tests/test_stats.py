"""Statistics against known cases: bootstrap, paired tests, Holm, McNemar, MDD, refusals; wired into runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from memlab.cli import main as cli_main
from memlab.eval import category_summary
from memlab.eval.stats import (
    ComparisonError,
    cluster_bootstrap,
    compare_grid,
    compare_predictions,
    comparison_legend,
    holm,
    judge_disagreements,
    mcnemar_exact,
    mcnemar_from_counts,
    naive_bootstrap,
    percentile_ci,
    sign_flip,
    sign_flip_test,
)
from memlab.run import ExperimentConfig, run_experiment
from memlab.testing import Reply, ScriptedServer

SHA = "a" * 64


def frame(seed: int = 0, n_conv: int = 10, per_conv: int = 40, shift: float = 0.0, conv_sd: float = 0.0,
          noise: float = 0.25) -> pd.DataFrame:
    """Synthetic scored predictions: categories 1-5 in every conversation, f1 in [0, 1]."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_conv):
        effect = rng.normal(0, conv_sd)
        for i in range(per_conv):
            f1 = float(np.clip(0.4 + effect + shift + rng.normal(0, noise), 0, 1))
            rows.append({"qid": f"conv-{c}:{i}", "conversation_id": f"conv-{c}", "category": 1 + i % 5,
                         "question": f"q{i}", "answer": "a", "prediction": f"p{i}-{shift}", "f1": f1,
                         "bleu1": f1 * 0.9, "em": float(f1 > 0.7)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ known cases
def test_identical_runs_give_zero_delta_ci_containing_zero_and_p_one():
    a = frame(1)
    c = compare_predictions(a, a.copy(), metrics=("f1", "bleu1", "em"), a_sha=SHA, b_sha=SHA)
    t = c.table
    assert len(t) == 7 * 3  # 5 categories + overall 1-4 + overall 1-5, three metrics
    assert (t.delta == 0).all() and (t.lo <= 0).all() and (t.hi >= 0).all()
    assert (t.p_perm == 1).all() and (t.p_mcnemar == 1).all()
    assert (t.wins == 0).all() and (t.losses == 0).all() and (t.ties == t.n).all()
    assert c.flipped.empty
    row = t[(t.group == "overall 1-5") & (t.metric == "f1")].iloc[0]
    assert row.n == 400 and row.a == pytest.approx(a.f1.mean())


def test_planted_difference_is_detected():
    a = frame(2)
    b = a.copy()
    b["f1"] = np.clip(a.f1 + 0.15, 0, 1)
    b["prediction"] = "better"
    c = compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA)
    o = c.table.set_index("group").loc["overall 1-5"]
    assert o.delta == pytest.approx((b.f1 - a.f1).mean())
    assert o.lo > 0.05 and o.hi < 0.2 and o.lo < o.delta < o.hi
    assert o.p_perm == pytest.approx(2 / 1024)  # every conversation improved: the most extreme of 2^10 flips
    assert o.p_mcnemar < 1e-6 and o.wins > 300 and o.losses == 0
    assert o.mdd < o.delta  # this difference is above what the design can detect
    fl = c.flipped
    assert len(fl) > 0 and set(fl.direction) == {"fixed by B"}
    assert (fl.f1_a < 0.5).all() and (fl.f1_b >= 0.5).all() and (fl.prediction_b == "better").all()
    plain = compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA, unit="question", n_perm=2000)
    assert plain.table.set_index("group").loc["overall 1-5", "p_perm"] == pytest.approx(1 / 2001)


def test_null_difference_is_not_detected():
    a = frame(3)
    b = frame(4)  # same distribution, independent noise
    b["qid"] = a["qid"]
    o = compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA).table.set_index("group").loc["overall 1-5"]
    assert o.lo < 0 < o.hi and o.p_perm > 0.05


def test_clustered_interval_is_wider_than_naive_when_conversations_differ():
    a = frame(5, conv_sd=0.2, noise=0.05)
    clustered = percentile_ci(cluster_bootstrap(a.f1, a.conversation_id, seed=0))
    naive = percentile_ci(naive_bootstrap(a.f1, seed=0))
    w_c, w_n = clustered[1] - clustered[0], naive[1] - naive[0]
    assert w_c > 2.5 * w_n
    indep = frame(6, conv_sd=0.0, noise=0.25)  # no correlation: the two agree within sampling error
    c2 = percentile_ci(cluster_bootstrap(indep.f1, indep.conversation_id, seed=0))
    n2 = percentile_ci(naive_bootstrap(indep.f1, seed=0))
    assert 0.7 < (c2[1] - c2[0]) / (n2[1] - n2[0]) < 1.4


def test_bootstrap_handles_nan_and_is_seeded():
    x = np.array([[1.0, np.nan], [0.0, 1.0], [1.0, 0.0], [0.0, np.nan]])
    cl = ["a", "a", "b", "b"]
    b1 = cluster_bootstrap(x, cl, n_boot=500, seed=7)
    assert b1.shape == (500, 2)
    assert np.array_equal(b1, cluster_bootstrap(x, cl, n_boot=500, seed=7), equal_nan=True)
    assert not np.array_equal(b1, cluster_bootstrap(x, cl, n_boot=500, seed=8), equal_nan=True)
    assert np.nanmin(b1) >= 0 and np.nanmax(b1) <= 1
    # column 2 holds one valid value per conversation (1 in a, 0 in b): a replicate's mean is i/m, m <= 4 draws
    allowed = {round(i / m, 9) for m in range(1, 5) for i in range(m + 1)}
    assert {round(v, 9) for v in b1[:, 1][~np.isnan(b1[:, 1])]} <= allowed



def test_bootstrap_means_count_only_the_drawn_values_that_exist():
    """Each replicate's mean is the mean of the values it drew, missing ones left out: checked against the same
    draws taken one by one (a column complete in one conversation and gappy in another, one all-missing)."""
    rng = np.random.default_rng(1)
    x = rng.random((40, 3))
    cl = [i % 3 for i in range(40)]
    x[[i for i in range(40) if cl[i] == 1 and i % 2], 1] = np.nan  # column 1: gaps in conversation 1 only
    x[[i for i in range(40) if cl[i] == 2], 2] = np.nan  # column 2: none at all in conversation 2
    got = cluster_bootstrap(x, cl, n_boot=200, seed=4)
    draws = np.random.default_rng(4)
    pick = draws.integers(0, 3, size=(200, 3))
    drawn: list[list[np.ndarray]] = [[] for _ in range(200)]
    for c in range(3):
        rows = np.flatnonzero(np.asarray(cl) == c)
        reps = np.nonzero(pick == c)[0]
        for rep, idx in zip(reps, rows[draws.integers(0, len(rows), size=(len(reps), len(rows)))]):
            drawn[rep].append(x[idx])
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning, match="empty slice"):  # column 2, all missing
        want = np.array([np.nanmean(np.concatenate(d), axis=0) if d else np.full(3, np.nan) for d in drawn])
    assert np.allclose(got, want, rtol=1e-12, equal_nan=True)

def test_bootstrap_gathers_in_blocks_with_the_same_result_bit_for_bit(monkeypatch):
    """The inner resample gathers a block of replicates at a time (its memory); every replicate's mean and count
    must be exactly what one whole gather gives, gappy columns included."""
    from memlab.eval import bootstrap

    rng = np.random.default_rng(2)
    x = rng.random((60, 4))
    x[rng.random((60, 4)) < 0.2] = np.nan
    cl = [i % 4 for i in range(60)]
    monkeypatch.setattr(bootstrap, "GATHER_ROWS", 10**9)
    whole = cluster_bootstrap(x, cl, n_boot=300, seed=5)
    monkeypatch.setattr(bootstrap, "GATHER_ROWS", 7)  # blocks that do not divide a conversation's ~75 slots
    assert np.array_equal(cluster_bootstrap(x, cl, n_boot=300, seed=5), whole, equal_nan=True)


def test_empty_input_gives_nan_not_a_crash():
    assert np.isnan(cluster_bootstrap(np.empty((0, 3)), [], n_boot=10)).all()
    assert np.isnan(cluster_bootstrap([], [], n_boot=10)).all()


def test_holm_on_known_pvalues():
    got = holm([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    assert got.tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]).tolist() == pytest.approx([1.0, 1.0])
    nan = holm([0.01, np.nan, 0.02])
    assert nan[0] == pytest.approx(0.02) and np.isnan(nan[1]) and nan[2] == pytest.approx(0.02)


def test_mcnemar_exact_on_known_tables():
    assert mcnemar_from_counts(1, 9) == pytest.approx(2 * (1 + 10) / 1024)
    assert mcnemar_from_counts(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_from_counts(3, 3) == 1.0 and mcnemar_from_counts(0, 0) == 1.0
    a = [True] * 5 + [False] * 5 + [True, False]
    b = [True] * 5 + [True] * 5 + [False, False]  # b = 1 (only A), c = 5 (only B)
    p, nb, nc = mcnemar_exact(a, b)
    assert (nb, nc) == (1, 5) and p == pytest.approx(2 * (1 + 6) / 64)


def test_sign_flip_exact_small_case():
    assert sign_flip_test([1.0, 2.0, 3.0], clusters=["x", "y", "z"]) == pytest.approx(2 / 8)
    assert sign_flip_test([1.0, -1.0]) == 1.0
    # clustered: two conversations, every question positive -> 2 of 4 patterns as extreme
    assert sign_flip_test([0.1] * 6, clusters=["a"] * 3 + ["b"] * 3) == pytest.approx(0.5)


def test_compare_refuses_different_datasets_and_question_sets():
    a = frame(7)
    with pytest.raises(ComparisonError, match="different datasets.*bbbbbbbbbbbb"):
        compare_predictions(a, a, a_sha=SHA, b_sha="b" * 64)
    with pytest.raises(ComparisonError, match="no dataset sha256"):
        compare_predictions(a, a, a_sha=SHA, b_sha=None)
    b = a.iloc[:300]
    with pytest.raises(ComparisonError, match="A has 400 questions, B has 300, 300 shared.*intersection"):
        compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA)
    c = compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA, questions="intersection")
    assert c.table.set_index("group").loc["overall 1-5", "n"] == 300 and "300 shared" in c.notes[0]


def test_grid_applies_holm_over_runs_groups_and_metrics():
    base = frame(8)
    big = base.copy()
    big["f1"] = np.clip(base.f1 + 0.2, 0, 1)
    same = base.copy()
    cmp = compare_grid(base, {"same": same, "big": big}, {"baseline": SHA, "big": SHA, "same": SHA},
                       metrics=("f1", "bleu1"))
    table = cmp.table
    assert cmp.runs == ["same", "big"] and list(dict.fromkeys(table.run)) == ["same", "big"]  # the order given
    assert len(table) == 2 * 7 * 2  # runs x groups x metrics: one family
    for col in ("p_perm", "p_mcnemar"):
        assert table[f"{col}_holm"].tolist() == pytest.approx(holm(table[col]).tolist())
    o = table[(table.group == "overall 1-5") & (table.metric == "f1")].set_index("run")
    # 14 rows of "big" share the smallest p (2/1024): Holm multiplies it by the 28 tests of the table
    assert o.loc["big", "p_perm"] == pytest.approx(2 / 1024)
    assert o.loc["big", "p_perm_holm"] == pytest.approx(28 * 2 / 1024)
    assert o.loc["same", "p_perm_holm"] == 1.0 and set(cmp.flipped.run) == {"big"}


def test_holm_runs_over_the_categories_and_metrics_of_one_comparison():
    a = frame(12)
    b = a.copy()
    b["f1"] = np.clip(a.f1 + 0.1, 0, 1)
    t = compare_predictions(a, b, metrics=("f1", "bleu1", "em"), a_sha=SHA, b_sha=SHA).table
    assert len(t) == 21
    assert t.p_perm_holm.tolist() == pytest.approx(holm(t.p_perm).tolist())
    assert t.p_mcnemar_holm.tolist() == pytest.approx(holm(t.p_mcnemar).tolist())
    assert (t.p_perm_holm >= t.p_perm).all() and (t.p_perm_holm > t.p_perm).any()


def test_interval_and_permutation_test_use_one_method():
    """Every conversation loses 0.02 on average, but each question swings by +-0.5: the conversation sign-flip test
    gives its smallest p (2/1024), and the interval, which inverts that test, excludes 0. (The two-stage bootstrap,
    which also redraws questions within each conversation, gave [-0.07, +0.03] here.)"""
    rows = []
    for c in range(10):
        for i in range(40):
            up = i % 2 == 0
            rows.append({"qid": f"c{c}:{i}", "conversation_id": f"c{c}", "category": 1 + i % 5,
                         "f1": 0.5 if up else 0.54, "f1_b": 1.0 if up else 0.0, "prediction": "p"})
    a = pd.DataFrame(rows)
    b = a.assign(f1=a.f1_b)
    c = compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA)
    o = c.table.set_index("group").loc["overall 1-5"]
    assert c.unit == "conversation" and o.delta == pytest.approx(-0.02)
    assert o.p_perm == pytest.approx(2 / 1024) and o.hi < 0
    assert any("excludes 0 exactly when p_perm <= 0.05" in line for line in c.legend())


@pytest.mark.parametrize("unit", ["conversation", "question"])
def test_interval_excludes_zero_exactly_when_the_test_rejects(unit):
    rows = []
    few = unit == "question"  # Monte Carlo flips of 400 questions: a smaller grid keeps the test short
    for shift in (0.0, 0.03, 0.08) if few else (0.0, 0.01, 0.02, 0.03, 0.05, 0.08):
        for seed in (20,) if few else (20, 21):
            a = frame(seed, conv_sd=0.05)
            b = frame(seed + 100, shift=shift, conv_sd=0.05).assign(qid=a.qid)
            rows.append(compare_predictions(a, b, metrics=("f1",) if few else ("f1", "bleu1"), a_sha=SHA, b_sha=SHA,
                                            unit=unit, n_perm=2000, n_boot=200).table)
    t = pd.concat(rows)
    assert ((t.lo <= 0) & (0 <= t.hi)).tolist() == (t.p_perm > 0.05).tolist()
    assert (t.p_perm <= 0.05).any() and (t.p_perm > 0.05).any()  # both outcomes really occur
    assert ((t.lo <= t.delta) & (t.delta <= t.hi)).all()


def test_sign_flip_interval_bounds_are_where_the_test_turns():
    rng = np.random.default_rng(3)
    d = rng.normal(0.04, 0.3, 400) + np.repeat(rng.normal(0, 0.03, 10), 40)
    cl = np.repeat(np.arange(10), 40)
    p, lo, hi = sign_flip(d, cl)
    assert p == sign_flip_test(d, cl) and lo < d.mean() < hi
    eps = 1e-7
    assert sign_flip_test(d - (hi - eps), cl) > 0.05 >= sign_flip_test(d - (hi + eps), cl)
    assert sign_flip_test(d - (lo + eps), cl) > 0.05 >= sign_flip_test(d - (lo - eps), cl)
    assert sign_flip(d[:200], cl[:200])[1] == -np.inf  # five conversations: no shift is ever rejected

def test_few_conversations_use_questions_as_the_unit_and_say_so():
    a = frame(13, n_conv=3)
    b = a.copy()
    b["f1"] = np.clip(a.f1 + 0.15, 0, 1)
    c = compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA, n_perm=2000)
    o = c.table.set_index("group").loc["overall 1-5"]
    assert c.unit == "question" and o.p_perm == pytest.approx(1 / 2001)  # 3 conversations could only give 0.25
    text = str(c)
    assert "3 conversation(s) < 6" in text and "bootstrap over the same questions" in text
    assert np.isfinite(o.lo) and np.isfinite(o.hi)
    clustered = compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA, unit="conversation")
    oc = clustered.table.set_index("group").loc["overall 1-5"]
    assert oc.p_perm == pytest.approx(2 / 8) and oc.lo == -np.inf and oc.hi == np.inf  # nothing can be rejected
    with pytest.raises(ValueError, match="unit = 'runs'"):
        compare_predictions(a, b, a_sha=SHA, b_sha=SHA, unit="runs")


def test_printed_comparison_names_the_direction_the_tests_and_mdd():
    a = frame(14)
    b = a.copy()
    b["f1"] = np.clip(a.f1 - 0.1, 0, 1)
    text = str(compare_predictions(a, b, metrics=("f1", "bleu1"), a_sha=SHA, b_sha=SHA, a_name="base",
                                   b_name="new"))
    assert "A (baseline) = base; B = new; every delta is B \u2212 A" in text
    header = next(line for line in text.splitlines() if "p_perm" in line and "metric" in line)
    assert "B \u2212 A" in header and "p_perm_holm" in header and "mdd" in header
    for key in ("p_perm: two-sided paired permutation test", "p_mcnemar: exact McNemar", "*_holm: Holm-adjusted over "
                "all 14 rows", "mdd: minimum detectable difference", "smallest possible p 0.00195"):
        assert key in text, key
    assert "no p_perm_holm can fall below" not in text  # 14 x 2/1024 < 0.05
    floor = comparison_legend("conversation", 10, "f1", 0.5, 35)[-1]
    assert "after Holm over 35 tests no p_perm_holm can fall below 0.0684" in floor


def test_a_run_whose_every_question_errored_is_refused_clearly():
    a = frame(15)
    b = a.assign(error="ModelError: empty reply", f1=np.nan, bleu1=np.nan, em=np.nan)
    with pytest.raises(ComparisonError, match="B: every one of its 400 questions ended in an error"):
        compare_predictions(a, b, metrics=("f1",), a_sha=SHA, b_sha=SHA)
    with pytest.raises(ComparisonError, match="no metric among j has a value in both"):
        compare_predictions(a, a.copy(), metrics=("j",), a_sha=SHA, b_sha=SHA)


def test_category_summary_carries_intervals_n_and_mdd():
    a = frame(9)
    s = category_summary(a, seed=3)
    for m in ("f1", "bleu1", "em"):
        assert (s[f"{m}_lo"] <= s[m]).all() and (s[m] <= s[f"{m}_hi"]).all()
    assert list(s.columns[:6]) == ["category", "label", "n", "f1", "f1_lo", "f1_hi"]
    assert s.loc["overall 1-5", "n"] == 400 and s.loc["1", "n"] == 80
    assert (s.f1_mdd > 0).all() and s.loc["1", "f1_mdd"] > s.loc["overall 1-5", "f1_mdd"]  # fewer questions
    assert s.equals(category_summary(a, seed=3)) and not s.equals(category_summary(a, seed=4))
    with pytest.warns(UserWarning, match="independent"):
        category_summary(a.drop(columns=["conversation_id"]))


def test_judge_disagreements():
    df = pd.DataFrame({"qid": ["a", "b", "c", "d"], "category": [1, 1, 2, 2], "f1": [0.9, 0.1, 0.6, 0.1],
                       "j": [0.0, 1.0, 1.0, 0.0], "prediction": ["x"] * 4})
    d = judge_disagreements(df)
    assert d.qid.tolist() == ["a", "b"] and d.kind.tolist() == ["F1 >= 0.5, J = 0", "F1 < 0.2, J = 1"]


# ------------------------------------------------------------------------------ runs
def offline(path, **over) -> ExperimentConfig:
    cfg = ExperimentConfig.from_dict({"name": "s", "dataset": {"path": str(path)},
                                      "extraction": {"name": "turns+observations"}, "store": {"backend": "memory"},
                                      "retrieval": {"top_k": 5}})
    return cfg.with_overrides(over) if over else cfg


def test_run_summary_has_cis_and_no_recall_past_top_k(synthetic_path, tmp_path, capsys):
    import memlab

    run = run_experiment(offline(synthetic_path, **{"run.seed": 11}), results=tmp_path, progress=False)
    s = run.summary
    assert {"f1_lo", "f1_hi", "recall@5_lo", "recall@5_hi", "n", "f1_mdd"} <= set(s.columns)
    assert "recall@10" not in s.columns and "recall@20" not in s.columns
    assert run.predictions["recall@10"].isna().all() and run.predictions["recall@5"].notna().any()
    info = json.loads((run.run_dir / "run.json").read_text())
    assert any("recall@10/20 not reported" in n for n in info["notes"]) and len(info["dataset_sha256"]) == 64
    again = run_experiment(offline(synthetic_path, **{"run.seed": 11}), results=tmp_path, progress=False)
    pd.testing.assert_frame_equal(again.summary[["f1_lo", "f1_hi"]], s[["f1_lo", "f1_hi"]])
    c = memlab.compare(run, again.run_dir)
    o = c.table.set_index(["group", "metric"]).loc[("overall 1-5", "f1")]
    assert o.delta == 0 and o.p_perm == 1 and o.n == len(run.predictions)
    other = run_experiment(offline(synthetic_path, **{"dataset.categories": [4]}), results=tmp_path, progress=False)
    assert cli_main(["compare", str(run.run_dir), str(other.run_dir)]) == 2
    assert "different question sets" in capsys.readouterr().err
    assert cli_main(["compare", str(run.run_dir), str(other.run_dir), str(again.run_dir), "--intersection"]) == 0
    out = capsys.readouterr().out
    assert "p_perm_holm" in out and "overall 1-4" in out and "mdd" in out


def test_inert_knobs_are_recorded(synthetic_path, tmp_path):
    with pytest.warns(UserWarning, match="preload is not used by the extractive arm"):
        run = run_experiment(offline(synthetic_path, **{"retrieval.preload": 3}), results=tmp_path, progress=False)
    assert any("preload" in n for n in run.info["notes"])


def test_judge_repeats_cached_apart_over_http(synthetic_path, tmp_path):
    verdicts = iter(["CORRECT", "WRONG", "CORRECT"] * 100)
    seen: list[dict] = []

    def judge(body):
        seen.append(body)
        return Reply(text=next(verdicts))

    cfg = offline(synthetic_path, **{"judge.model": "openai/scripted-judge", "judge.repeats": 3,
                                     "judge.temperature": 0.7, "judge.prompt": "strict"})
    with ScriptedServer(responder=judge) as srv:
        cfg.models.api_base = srv.api_base
        run = run_experiment(cfg, results=tmp_path, progress=False)
        n = len(run.predictions)
        assert len(srv.requests) == 3 * n  # three distinct requests per question, none served from cache
        assert all(b["temperature"] == 0.7 for b in seen)
        assert "strict" in seen[0]["messages"][0]["content"].lower()
        assert run.predictions.j.tolist() == pytest.approx([2 / 3] * n)
        s = run.summary.loc["overall 1-5"]
        assert s.j_repeats == 3 and s.j == pytest.approx(2 / 3)
        assert s.j_sd == pytest.approx(np.std([1.0, 0.0, 1.0], ddof=1))  # every question got C, W, C in order
        assert s.j_lo <= s.j <= s.j_hi
        assert (run.run_dir / "judge_disagreements.csv").is_file()
        rerun = run_experiment(cfg, results=tmp_path, progress=False)
        assert len(srv.requests) == 3 * n and rerun.info["models"]["cache_hits"] == 3 * n
        assert rerun.predictions.j.tolist() == run.predictions.j.tolist()
