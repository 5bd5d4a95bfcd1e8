"""`memlab report`: the tidy table (labels, order, intervals, tokens), unfinished runs, exports, the CLI."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from memlab.run import ExperimentConfig, run_experiment
from memlab.run.report import (
    ReportError,
    format_report,
    load_runs,
    report_table,
    run_labels,
)
from tests.conftest import synthetic_samples


def base_cfg(path, **over):
    d = {"name": "offline", "dataset": {"path": str(path)}, "extraction": {"name": "turns+observations"},
         "retrieval": {"participant_boost": True}}
    cfg = ExperimentConfig.from_dict(d)
    return cfg.with_overrides(over) if over else cfg


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Three finished runs of a top-k sweep, made in the order k = 20, 5, 10, plus one other arm."""
    root = tmp_path_factory.mktemp("report")
    data = root / "syn.json"
    data.write_text(json.dumps(synthetic_samples()), encoding="utf-8")
    runs = {k: run_experiment(base_cfg(data, **{"retrieval.top_k": k}), results=root / "results", progress=False)
            for k in (20, 5, 10)}
    # syn-2 has no annotated observations: that arm answers its questions from an empty store, on purpose
    obs = run_experiment(base_cfg(data, **{"extraction.name": "observations", "name": "offline-obs",
                                           "run.allow_failed_extraction": True}),
                         results=root / "results", progress=False)
    return {"root": root, "k": runs, "obs": obs}


def test_labels_name_the_distinguishing_values_and_runs_keep_the_order_given(sweep):
    dirs = [sweep["k"][k].run_dir for k in (20, 5, 10)]
    table = report_table(dirs)
    assert list(dict.fromkeys(table.run)) == ["offline k=20", "offline k=5", "offline k=10"]  # never re-sorted
    mixed = report_table([sweep["obs"].run_dir, *dirs])
    labels = list(dict.fromkeys(mixed.run))
    # the name tells offline-obs apart; k the offline runs; the legend names every value that differs
    assert labels == ["offline-obs", "offline k=20", "offline k=5", "offline k=10"]
    legend = pd.DataFrame(mixed.attrs["legend"])
    assert legend.run.tolist() == labels and legend.folder.tolist()[1:] == [str(d) for d in dirs]
    assert legend.differs[0] == ("extraction.name=observations; retrieval.top_k=10; "
                                 "run.allow_failed_extraction=True") or set(legend.differs[0].split("; ")) == {
        "extraction.name=observations", "retrieval.top_k=10", "run.allow_failed_extraction=True"}
    text = format_report(mixed)
    assert f"offline k=5: {dirs[1]} (" in text and "retrieval.top_k=5" in text
    twin = sweep["root"] / "results" / "offline-rerun"
    shutil.copytree(dirs[0], twin)
    same = load_runs([dirs[0], twin, dirs[0]])[0]  # a folder given twice is reported once
    assert len(same) == 2 and run_labels(same) == ["offline #1", "offline #2"]


def test_table_is_tidy_with_intervals_n_and_context_tokens(sweep):
    run = sweep["k"][10]
    table = report_table([run.run_dir])
    s = run.summary
    assert len(table) == len(s) and list(table.group) == list(s.index)
    assert table.category.tolist()[:5] == ["1 multi-hop", "2 temporal", "3 open-domain", "4 single-hop",
                                           "5 adversarial"]
    assert table.n.tolist() == s.n.astype(int).tolist()
    for m in ("f1", "bleu1", "recall@10", "context_tokens_qa"):
        ok = table[[m, f"{m}_lo", f"{m}_hi"]].dropna()
        assert len(ok) and (ok[f"{m}_lo"] <= ok[m] + 1e-12).all() and (ok[m] <= ok[f"{m}_hi"] + 1e-12).all()
    # the offline arm sends no prompt: its prompt tokens stay 0 (never swapped for the context tokens,
    # which have their own column)
    assert (table.prompt_tokens_qa == 0).all() and np.allclose(table.context_tokens_qa, s.context_tokens_qa)
    assert (s.context_tokens_qa > 0).all() and not table.model_calls.any()
    assert table.j.isna().all()  # no judge: J is missing, never 0
    k5 = report_table([sweep["k"][5].run_dir])
    assert k5["recall@10"].isna().all()  # a top-5 run cannot report Recall@10


def test_intervals_come_from_the_summary_when_it_has_them(sweep):
    run = dataclasses.replace(sweep["k"][10], summary=sweep["k"][10].summary.assign(f1_lo=0.11, f1_hi=0.99))
    table = report_table([run])
    assert (table.f1_lo == 0.11).all() and (table.f1_hi == 0.99).all()


def test_intervals_computed_here_use_the_stats_bootstrap(sweep):
    """Bounds the summary lacks (context tokens) come from `memlab.eval.stats.cluster_bootstrap`, seeded by the run."""
    from memlab.eval.stats import cluster_bootstrap, percentile_ci
    from memlab.run.report import ci_frame

    run = sweep["k"][10]
    p = run.predictions
    got = ci_frame(run, ["context_tokens_qa"]).loc["overall 1-5"]
    lo, hi = percentile_ci(cluster_bootstrap(p.context_tokens.to_numpy(float), p.conversation_id.tolist(), 2000,
                                             run.config.run.seed))
    assert (got.context_tokens_qa_lo, got.context_tokens_qa_hi) == (float(lo), float(hi)) and lo < hi


def test_intervals_computed_here_cover_the_summary_groups_own_categories():
    """An overall row's bounds come from the questions that row counts: LongMemEval's categories 6 and 7 are in
    both overall groups of its summary (`memlab.eval.summary.OVERALL_GROUPS`), so they are in the bootstrap too;
    a summary keyed by int category numbers (an older folder) reads the same."""
    from types import SimpleNamespace

    from memlab.eval.stats import OVERALL_GROUPS, cluster_bootstrap, percentile_ci
    from memlab.run.report import ci_frame

    pred = pd.DataFrame({"category": [1, 2, 6, 7, 5, 1, 6, 7] * 3, "conversation_id": [f"q{i}" for i in range(24)],
                         "context_tokens": [float(10 * i % 37) for i in range(24)]})
    summary = pd.DataFrame({"n": [6, 3, 3, 6, 6, 21, 24]}, index=[1, 2, 5, 6, 7, "overall 1-4", "overall 1-5"])
    run = SimpleNamespace(summary=summary, predictions=pred, config=SimpleNamespace(run=SimpleNamespace(seed=3)))
    got = ci_frame(run, ["context_tokens_qa"], n_boot=200)
    for group, cats in OVERALL_GROUPS.items():
        rows = pred[pred.category.isin(cats)]
        lo, hi = percentile_ci(cluster_bootstrap(rows.context_tokens.to_numpy(float), rows.conversation_id.tolist(),
                                                 200, 3))
        assert (got.loc[group, "context_tokens_qa_lo"], got.loc[group, "context_tokens_qa_hi"]) == (lo, hi)
    assert got.loc[6].notna().all() and list(got.index) == list(summary.index)


def test_report_and_compare_do_not_import_the_stemmer_or_scikit_learn(sweep):
    """Reading finished runs stems nothing: nltk and scikit-learn (seconds of CPU each to import) stay unloaded."""
    import subprocess
    import sys
    from pathlib import Path

    dirs = [str(sweep["k"][k].run_dir) for k in (5, 10)]
    code = ("import sys, contextlib, io\nimport memlab.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert memlab.cli.main(['report', *{dirs!r}]) == 0\n"
            f"    assert memlab.cli.main(['compare', *{dirs!r}]) == 0\n"
            "print(sorted(m for m in ('nltk', 'sklearn') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_unfinished_runs_are_skipped_with_a_warning(sweep, tmp_path):
    done = sweep["k"][10].run_dir
    broken = tmp_path / "offline-killed"
    shutil.copytree(done, broken)
    (broken / "predictions.parquet").unlink()
    with pytest.warns(UserWarning, match="memlab run --resume"):
        table = report_table([done, broken])
    assert set(table.run_dir) == {str(done)}
    assert table.attrs["skipped"] == [(str(broken), "did not finish (no predictions.parquet)")]
    assert "skipped" in format_report(table, "md")
    with pytest.warns(UserWarning), pytest.raises(ReportError, match="nothing to report"):
        report_table([broken])
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        report_table([tmp_path])


def test_exports_markdown_latex_csv(sweep):
    table = report_table([sweep["k"][5].run_dir, sweep["k"][10].run_dir])
    md = format_report(table, "md").splitlines()
    assert md[0].startswith("| run | category | n | F1 |") and set(md[1]) <= set("|:-")
    body, legend = md[:md.index("Runs:")], md[md.index("Runs:"):]
    assert len([ln for ln in body if ln.startswith("| offline")]) == len(table)
    assert legend[2].startswith("| run | name | folder | differs |") and legend[4].startswith(
        f"| offline k=5 | offline | {sweep['k'][5].run_dir} | retrieval.top_k=5 |")
    row = next(ln for ln in md if "| 4 single-hop |" in ln and "k=10" in ln)
    r = table[(table.group.astype(str) == "4") & table.run.str.contains("k=10")].iloc[0]
    assert f"{r.f1:.3f} [{r.f1_lo:.3f}, {r.f1_hi:.3f}]" in row and f"{r.context_tokens_qa:,.0f}" in row
    # offline runs only: no column is empty for every run (no J without a judge, no calls, no prompt tokens)
    assert md[0].startswith("| run | category | n | F1 | BLEU-1 | recall@10 | context tokens/QA | latency")
    assert not any(h in md[0] for h in ("| J |", "Calls/QA", "prompt tokens/QA", "n/a"))
    tex = format_report(table, "latex")
    assert "\\toprule" in tex and "\\bottomrule" in tex and "recall@10" in tex and "context tokens/QA" in tex
    assert "k=5" in tex and "latency p50 (s)" in tex and "_" not in tex.replace("\\_", "")
    back = pd.read_csv(io.StringIO(format_report(table, "csv")))
    assert len(back) == len(table) and np.allclose(back.f1, table.f1) and np.allclose(back.f1_hi, table.f1_hi)
    with pytest.raises(ReportError, match="expected one of"):
        format_report(table, "docx")


def test_latex_fits_a_column_and_escapes_every_label(sweep):
    """Issue 23: the LaTeX export was an 11-column tabular wider than a column, and labels went in unescaped."""
    import re

    table = report_table([sweep["k"][5].run_dir, sweep["k"][10].run_dir])
    table["run"] = table["run"].str.replace("offline", "arm_1 & co 50% #2 {x} ~^\\ <y> |z| \u2212 \u2026")
    tex = format_report(table, "latex")
    assert "\\resizebox{\\linewidth}{!}{%\n\\begin{tabular}" in tex and "\\end{tabular}}" in tex
    known = r"\\(textbackslash|textasciitilde|textasciicircum|textless|textgreater|textbar|ldots)\{\}|\\[&%#_{}$]"
    spec = re.search(r"\\begin\{tabular\}\{([lr]+)\}", tex).group(1)
    body = tex[tex.index("\\toprule") + len("\\toprule"):tex.index("\\bottomrule")]
    rows = [ln[:-3] for ln in body.splitlines() if ln.endswith(" \\\\")]
    assert len(rows) == len(table) + 1
    for ln in rows:
        cells = re.split(r"(?<!\\)&", ln)
        assert len(cells) == len(spec)  # no label adds a cell
        for cell in cells:
            plain = re.sub(known, "", cell).replace("$-$", "")
            assert not set(plain) & set("\\&%#_{}$~^<>|\u2212\u2026"), cell  # every special character escaped
    assert "arm\\_1 \\& co 50\\% \\#2 \\{x\\} \\textasciitilde{}\\textasciicircum{}\\textbackslash{}" in tex
    depth = 0
    for ch in re.sub(r"\\[{}]", "", tex):  # braces balance (escaped ones aside)
        depth += (ch == "{") - (ch == "}")
        assert depth >= 0
    assert depth == 0


def test_cli_report(sweep, tmp_path, capsys):
    from memlab.cli import main

    broken = tmp_path / "offline-killed"
    shutil.copytree(sweep["k"][10].run_dir, broken)
    (broken / "predictions.parquet").unlink()
    out = tmp_path / "table.tex"
    rc = main(["report", str(sweep["k"][20].run_dir), str(sweep["k"][5].run_dir), str(broken), "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0 and f"wrote {out}" in cap.out
    assert "warning" in cap.err and "memlab run --resume" in cap.err
    tex = out.read_text()
    assert tex.index("k=20") < tex.index("k=5") and "\\begin{tabular}" in tex  # the order given
    assert "every delta is B $-$ A" in tex  # the paired comparison, k=5 against k=20
    assert main(["report", str(sweep["k"][5].run_dir), "--format", "csv", "--metrics", "f1,calls_qa"]) == 0
    back = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert {"f1", "f1_lo", "f1_hi", "calls_qa", "n", "errors"} <= set(back.columns) and (back.calls_qa == 0).all()
    assert main(["report", str(broken)]) == 2
    assert "nothing to report" in capsys.readouterr().err


def test_public_names_report_and_compare_are_the_functions_the_cli_uses():
    import memlab
    from memlab.run.compare import compare

    assert memlab.report is report_table and memlab.compare is compare  # `memlab.report` raised AttributeError
    assert {"report", "compare", "run_experiment"} <= set(dir(memlab))
    for gone in ("compare_runs", "paired"):
        with pytest.raises(AttributeError):
            getattr(memlab, gone)


def test_printed_tables_leave_out_what_an_offline_run_does_not_have(synthetic_path, tmp_path, capsys):
    # `memlab run` printed tokens_qa 0.000 and calls_qa 0.000 for the offline reader, and report_table swapped
    # its context tokens into tokens_qa; now each column is one quantity and empty ones are not printed.
    from memlab.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"name: offline\ndataset: {{path: {synthetic_path}}}\nextraction: {{name: turns}}\n")
    assert main(["run", str(cfg), "--results", str(tmp_path / "r")]) == 0
    header = set(next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("label")).split())
    assert {"context_tokens_qa", "embedding_tokens_qa"} <= header
    assert not header & {"prompt_tokens_qa", "calls_qa", "tokens_qa", "total_tokens_qa"}
    table = report_table(list((tmp_path / "r").glob("offline-*")))
    assert (table.prompt_tokens_qa == 0).all() and (table.context_tokens_qa > 0).all()
    shown = format_report(table)
    assert "context tokens/QA" in shown and "Calls/QA" not in shown and "prompt tokens/QA" not in shown
    mixed = pd.concat([table, table.assign(run="model", model_calls=True, prompt_tokens_qa=100.0, calls_qa=1.0,
                                           prompt_tokens_qa_lo=np.nan, prompt_tokens_qa_hi=np.nan)])
    from memlab.run.report import display_frame

    d = display_frame(mixed)
    assert set(d.loc[d.run == "model", "prompt tokens/QA"]) == {"100"}
    offline = d[d.run != "model"]
    assert set(offline["prompt tokens/QA"]) == {"-"} and set(offline["Calls/QA"]) == {"-"}
    # a run folder written before the renaming reads with the new names
    from memlab.run.records import read_frame, write_frame
    from memlab.run.results import load_run

    d = next((tmp_path / "r").glob("offline-*"))
    s = read_frame(d / "summary")
    old = s.drop(columns=["answer_tokens_qa"]).rename(columns={"embedding_tokens_qa": "embed_tokens_qa",
                                                               "model_tokens_qa": "total_tokens_qa"})
    write_frame(d / "summary", old.assign(tokens_qa=0.0))
    info = json.loads((d / "run.json").read_text())
    del info["outputs"]  # nor did such a folder record its outputs' digests
    (d / "run.json").write_text(json.dumps(info))
    back = load_run(d).summary
    assert {"answer_tokens_qa", "embedding_tokens_qa", "model_tokens_qa"} <= set(back.columns)
    assert not {"tokens_qa", "embed_tokens_qa", "total_tokens_qa"} & set(back.columns)
    assert np.allclose(back.embedding_tokens_qa, s.embedding_tokens_qa)
