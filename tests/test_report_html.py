"""The HTML report: one self-contained page, checked in a real headless Chromium (skipped, saying why, without one).

Set ``MEMLAB_EVIDENCE_DIR`` to keep the screenshot of the page with a question open.
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from memlab.report_html import build_html, write_html
from memlab.run import ExperimentConfig, run_experiment
from tests.conftest import synthetic_samples
from tests.headless import Chromium, find_chromium


@pytest.fixture(scope="module")
def two_arms(tmp_path_factory):
    root = tmp_path_factory.mktemp("html")
    data = root / "syn.json"
    data.write_text(json.dumps(synthetic_samples()), encoding="utf-8")
    base = ExperimentConfig.from_dict({"name": "offline", "dataset": {"path": str(data)},
                                       "extraction": {"name": "turns+observations"},
                                       "run": {"allow_failed_extraction": True}})  # syn-2 has no observations
    a = run_experiment(base, results=root / "results", progress=False)
    b = run_experiment(base.with_overrides({"name": "offline-obs", "extraction.name": "observations"}),
                       results=root / "results", progress=False)
    page = write_html(root / "report.html", [a.run_dir, b.run_dir], title="synthetic report")
    return {"a": a, "b": b, "page": page, "root": root, "base": base}


def payload(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="memlab-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def column(data: dict, table: dict, field: str) -> list:
    """A packed table's column with its string ids resolved (memlab.report_html.Tables)."""
    vals = table[field]
    return [data["strings"][v] if v is not None and field in table["s"] else v for v in vals]


HOSTILE_Q = "Melanie <!-- unsure --- maybe <script> tags"
HOSTILE_A = "</script><script>window.pwned = 1</script> & more"


def test_page_is_self_contained(two_arms):
    text = two_arms["page"].read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched from anywhere
    assert "<link" not in text and "@import" not in text
    assert text.count("data:image/png;base64,") >= 4  # category bars, F1 vs tokens, attribution, recall
    data = payload(text)
    a, b = two_arms["a"], two_arms["b"]
    assert [r["label"] for r in data["runs"]] == ["offline", "offline-obs"]  # the names tell them apart
    # the runs table is the legend: each label's folder and the config values the runs differ in
    runs_table = text.split('<table class="runs">')[1].split("</table>")[0]
    assert "<th>differs</th>" in runs_table and "extraction.name=observations" in runs_table
    assert f"<td>offline-obs</td><td>{b.run_dir}</td>" in runs_table
    qids = column(data, data["questions"], "qid")
    assert qids == a.predictions.qid.tolist()
    f1a = dict(zip(a.predictions.qid, a.predictions.f1))
    f1b = dict(zip(b.predictions.qid, b.predictions.f1))
    ra, rb = (R["q"] for R in data["runs_data"])
    for i, qid in enumerate(qids):
        assert ra["f1"][i] == pytest.approx(f1a[qid], abs=1e-4) and rb["f1"][i] == pytest.approx(f1b[qid], abs=1e-4)
        assert ra["ok"][i] == (f1a[qid] >= 0.5) and rb["ok"][i] == (f1b[qid] >= 0.5)
        assert data["questions"]["flip"][i] == ((f1a[qid] >= 0.5) != (f1b[qid] >= 0.5))
        for r in (ra, rb):  # a label exactly for each failed question
            assert (r["label"][i] is None) == bool(r["ok"][i]) or data["questions"]["cat"][i] == 5
    assert "Paired comparisons" in text and "Summary per category" in text
    # what retrieval delivered, per category, beside the scores: the summaries' answer ceiling and answer-bearing
    summary = text.split('<table class="summary">')[1].split("</table>")[0]
    assert "<th>answer ceiling</th>" in summary and "<th>answer-bearing</th>" in summary
    s = a.summary.loc["overall 1-4"]
    assert (f"{s.answer_ceiling:.3f} [{s.answer_ceiling_lo:.3f}, {s.answer_ceiling_hi:.3f}]" in summary
            and f"{s.answer_bearing:.3f} [{s.answer_bearing_lo:.3f}, {s.answer_bearing_hi:.3f}]" in summary)
    assert "answer ceiling: the best official F1 any span" in text
    # every run's evidence recall is drawn, not only the first's
    assert [f"Evidence recall ({r['label']})" in text for r in data["runs"]] == [True, True]


def _deltas(rows) -> dict:
    """(delta, lo, hi, Holm p) per (group, metric); an unbounded bound (one question cannot reject) as None,
    the way the page's JSON holds it."""
    def v(x):
        return None if x is None or not math.isfinite(x) else x

    return {(str(r["group"]), r["metric"]): (v(r["delta"]), v(r["lo"]), v(r["hi"]), v(r["p_perm_holm"]))
            for r in rows}


def test_one_order_and_one_sign_in_compare_report_and_html(two_arms, tmp_path, capsys):
    """Issue 21: A = turns+observations, B = observations, both named "offline" (the config values then tell them
    apart, and the old report sorted them by value, so its HTML showed A - B while compare showed B - A)."""
    import memlab
    from memlab.cli import main

    a = two_arms["a"]
    b = run_experiment(two_arms["base"].with_overrides({"extraction.name": "observations"}),
                       results=two_arms["root"] / "results", progress=False)
    want = _deltas(memlab.compare(a, b).table.to_dict("records"))
    sh = want[("overall 1-5", "f1")]
    assert None not in sh and sh[0] < 0 and sh[1] < sh[2]  # B loses questions: a signed difference to check

    assert main(["compare", str(a.run_dir), str(b.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "every delta is B \u2212 A" in out
    # the legend under the comparison: each label, its folder and what its config changes
    assert (f"offline extractor=observations: {b.run_dir} (extraction.name=observations)" in out
            and f"offline extractor=turns+observations: {a.run_dir} (extraction.name=turns+observations)" in out)
    line = next(ln for ln in out.splitlines() if ln.split()[:3] == ["overall", "1-5", "f1"])
    assert f"{sh[0]:.3f}" in line.split() and f"{sh[1]:.3f}" in line.split()

    page = tmp_path / "ab.html"
    assert main(["report", str(a.run_dir), str(b.run_dir), "--metrics", "f1", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert ("A = offline extractor=turns+observations, B = offline extractor=observations; every delta is "
            "B \u2212 A") in out
    row = next(ln for ln in out.splitlines() if "overall 1-5" in ln and " f1 " in ln and "[" in ln and "/" in ln)
    assert f"{sh[0]:+.3f} [{sh[1]:+.3f}, {sh[2]:+.3f}]" in row
    text = page.read_text(encoding="utf-8")
    data = payload(text)
    assert [r["label"] for r in data["runs"]] == ["offline extractor=turns+observations",
                                                  "offline extractor=observations"]
    (c,) = data["comparisons"]
    assert c["direction"] == "offline extractor=observations \u2212 offline extractor=turns+observations"
    got = _deltas(c["rows"])
    assert got.keys() == want.keys()
    for k in want:
        assert [None if x is None else pytest.approx(x) for x in want[k]] == list(got[k]), k
    assert "B &minus; A = offline extractor=observations &minus; offline extractor=turns+observations" in text
    assert "<th>answer ceiling</th>" in text  # added to the table `memlab report --metrics f1` made

    # given the other way round, every view swaps the runs and the sign
    flipped = payload(build_html([b.run_dir, a.run_dir]))
    assert [r["label"] for r in flipped["runs"]] == ["offline extractor=observations",
                                                     "offline extractor=turns+observations"]
    back = _deltas(flipped["comparisons"][0]["rows"])
    assert back[("overall 1-5", "f1")][:3] == pytest.approx((-sh[0], -sh[2], -sh[1]))


def test_report_intersection_and_a_run_that_only_errored(two_arms, tmp_path, capsys):
    """`report` takes --intersection like compare; a run whose every question errored gets a message, not a crash
    (before: "cluster_bootstrap: 0 values but 1 cluster labels")."""
    from memlab.cli import main
    from memlab.testing import Reply, ScriptedServer

    a = two_arms["a"]
    small = run_experiment(two_arms["base"].with_overrides({"dataset.categories": [4]}),
                           results=two_arms["root"] / "results", progress=False)
    assert main(["report", str(a.run_dir), str(small.run_dir), "--metrics", "f1"]) == 0
    out = capsys.readouterr().out
    assert "no paired comparison: different question sets" in out and "--intersection" in out
    page = tmp_path / "inter.html"
    assert main(["report", str(a.run_dir), str(small.run_dir), "--metrics", "f1", "--intersection",
                 "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "every delta is B \u2212 A" in out and f"compared on the {len(small.predictions)} shared questions" in out
    assert {r["n"] for r in payload(page.read_text(encoding="utf-8"))["comparisons"][0]["rows"]
            if r["group"] == "overall 1-5"} == {len(small.predictions)}

    with ScriptedServer(responder=lambda body: Reply(text="")) as srv:  # every answer call: an empty reply
        cfg = two_arms["base"].with_overrides({"name": "errored", "answer.name": "original",
                                               "answer.model": "openai/scripted", "models.max_retries": 0,
                                               "run.max_error_rate": 1.0})
        cfg.models.api_base = srv.api_base
        errored = run_experiment(cfg, results=two_arms["root"] / "results", progress=False)
    assert errored.predictions.error.notna().all()
    assert main(["compare", str(a.run_dir), str(errored.run_dir)]) == 2
    err = capsys.readouterr().err
    assert "every one of its" in err and "ended in an error" in err and f"--resume {errored.run_dir}" in err
    page = tmp_path / "errored.html"
    assert main(["report", str(a.run_dir), str(errored.run_dir), "--metrics", "f1", "--html", str(page)]) == 0
    assert "no paired comparison" in capsys.readouterr().out
    text = page.read_text(encoding="utf-8")
    assert "ended in an error" in text and payload(text)["comparisons"] == []


def test_indexed_question_traces_match_memlab_trace(two_arms):
    from memlab import trace
    from memlab.report_html import QuestionTraces, layers

    for run in (two_arms["a"], two_arms["b"]):
        tr = trace.load(run.run_dir)
        fast = QuestionTraces(tr)
        mem_text = dict(zip(tr.memories.id, tr.memories.text))
        for qid in tr.questions.qid:
            want = layers(tr.question(qid), mem_text)
            assert layers(fast.question(qid), mem_text) == want
            assert want["queries"] and want["answer"]["rule"]
            assert set(want) == {"ops", "queries", "answer"}  # the evidence memories are never displayed


def test_each_text_is_stored_once_and_numbers_rounded(two_arms):
    data = payload(two_arms["page"].read_text(encoding="utf-8"))
    assert len(set(data["strings"])) == len(data["strings"])
    hits = data["runs_data"][0]["hits"]
    assert len(hits["mem"]) > len(set(hits["mem"]))  # one memory shown by several questions: one record
    assert "mems" not in json.dumps(data["runs_data"])  # no per-question memory records
    assert "rank" not in hits  # ranks 1..n in every query: numbered by the page (checked in Chromium below)
    via = data["strings"].index("primary")
    assert via == 0 or data["strings"][via - 1] in column(data, hits, "via")  # the most used texts come first
    assert all(v is None or v == round(v, 4) for R in data["runs_data"] for v in R["q"]["f1"])


def test_forked_and_serial_builds_are_the_same_page(two_arms, monkeypatch):
    """The runs' traces and the summaries' part are built in forked processes where there are cores; the page is
    the same bytes as one built in this process alone (but for its generation time)."""
    import memlab.report_html as rh
    from memlab.run import forked

    runs = [two_arms["a"].run_dir, two_arms["b"].run_dir]
    made = []
    real = forked.fork_map
    monkeypatch.setattr(rh, "fork_workers", lambda threads, units: 2)  # forked even on a one-core machine
    monkeypatch.setattr(rh, "fork_map", lambda fn, items, workers: made.append(workers) or real(fn, items, workers))
    in_children = build_html(runs)
    monkeypatch.setattr(rh, "fork_workers", lambda threads, units: 1)
    here = build_html(runs)
    assert made == [2, 1]
    stamp = re.compile(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC")
    assert stamp.sub("", in_children) == stamp.sub("", here) and len(here) > 10_000


def test_a_forked_runs_error_reaches_the_caller(two_arms, monkeypatch):
    import memlab.report_html as rh

    def broken(run, data):
        raise ValueError(f"attribution broke on {run.run_dir.name}")

    monkeypatch.setattr(rh, "fork_workers", lambda threads, units: 2)
    monkeypatch.setattr(rh, "run_pieces", broken)
    with pytest.raises(ValueError, match="attribution broke on offline-"):
        build_html([two_arms["a"].run_dir, two_arms["b"].run_dir])


def test_no_text_can_end_the_data_block(tmp_path):
    """Issue 20: a question or reply holding ``<!--`` then ``<script``, or ``</script>``, used to end or comment out
    the inline JSON (the browser went empty). Every < > & in the data is now written as \\u003c..."""
    from memlab.report_html import embed_json

    data = {"q": HOSTILE_Q, "a": HOSTILE_A}
    text = embed_json(data)
    assert not set("<>&") & set(text) and json.loads(text) == data


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A run whose question, gold answer and memories (so also the extractive reply) hold hostile text."""
    root = tmp_path_factory.mktemp("hostile")
    samples = synthetic_samples()
    samples[0]["qa"][3]["question"] = HOSTILE_Q
    samples[0]["qa"][3]["answer"] = HOSTILE_A
    samples[0]["conversation"]["session_1"][1]["text"] = "I adopted a dog named " + HOSTILE_A
    data = root / "syn.json"
    data.write_text(json.dumps(samples), encoding="utf-8")
    cfg = ExperimentConfig.from_dict({"name": "hostile", "dataset": {"path": str(data)},
                                      "extraction": {"name": "turns"}})
    run = run_experiment(cfg, results=root / "results", progress=False)
    return {"run": run, "page": write_html(root / "hostile.html", [run.run_dir], title="hostile")}


def test_hostile_text_stays_data(hostile):
    text = hostile["page"].read_text(encoding="utf-8")
    block = re.search(r'<script type="application/json" id="memlab-data">(.*?)</script>', text, re.S).group(1)
    assert "<" not in block and text.count("</script>") == 2  # the data block's and the page script's own
    data = payload(text)
    assert HOSTILE_Q in data["strings"] and HOSTILE_A in data["strings"]
    assert any(HOSTILE_A in s_ for s_ in column(data, data["mems"], "text"))


def test_build_refuses_when_no_run_finished(tmp_path, two_arms):
    import shutil

    d = tmp_path / "killed"
    shutil.copytree(two_arms["a"].run_dir, d)
    (d / "predictions.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="no finished run"):
        build_html([d])


needs_chromium = pytest.mark.skipif(
    find_chromium() is None, reason="no chromium on PATH: `make test` installs Debian's chromium when run as root "
    "with apt-get (apt-get install -y chromium); set MEMLAB_CHROMIUM to a binary")


@needs_chromium
def test_question_browser_in_headless_chromium(two_arms, tmp_path):
    a, b = two_arms["a"], two_arms["b"]
    pa = a.predictions.set_index("qid")
    pb = b.predictions.set_index("qid")
    cat4 = pa.index[pa.category == 4].tolist()
    flips = [q for q in pa.index if (pa.f1[q] >= 0.5) != (pb.f1[q] >= 0.5)]
    assert flips and cat4  # the fixture has both, so the filters below are really exercised
    shot_dir = os.environ.get("MEMLAB_EVIDENCE_DIR") or str(tmp_path)
    with Chromium(1400, 1000) as br:
        br.goto(two_arms["page"].resolve().as_uri())
        assert br.eval("document.title") == "synthetic report"
        assert br.eval("document.getElementById('f-count').textContent") == f"showing {len(pa)} of {len(pa)} questions"
        # images decoded from the embedded data (a broken base64 gives naturalWidth 0)
        assert br.eval("[...document.images].every(i => i.complete && i.naturalWidth > 100)")
        assert br.eval("performance.getEntriesByType('resource').filter(e => /^https?:/.test(e.name)).length") == 0
        # filter: category 4
        br.set_value("#f-cat", "4")
        shown = br.eval("[...document.querySelectorAll('#qbody tr')].map(t => t.dataset.qid)")
        assert shown == cat4
        count = br.eval("document.getElementById('f-count').textContent")
        assert count == f"showing {len(cat4)} of {len(pa)} questions"
        # filter: flipped between runs only (on all categories)
        br.set_value("#f-cat", "")
        br.set_value("#f-flip", True)
        assert br.eval("[...document.querySelectorAll('#qbody tr')].map(t => t.dataset.qid)") == flips
        br.set_value("#f-flip", False)
        # filter: incorrect in run 1, then open the first such question
        br.set_value("#f-outcome", "bad")
        bad = br.eval("[...document.querySelectorAll('#qbody tr')].map(t => t.dataset.qid)")
        assert bad == [q for q in pa.index if pa.f1[q] < 0.5]
        br.eval("document.querySelector('#qbody tr').click()")
        detail = br.eval("document.getElementById('detail').innerText")
        q = pa.loc[bad[0]]
        assert q.question in detail and str(q.answer) in detail
        for layer in ("1. extractor layer", "2. retrieval layer", "3. answer layer"):
            assert detail.count(layer) == 2  # once per run
        assert "query 0" in detail and "No prompt was sent (offline reader)" in detail
        assert br.eval("document.querySelector('#qbody tr.sel').dataset.qid") == bad[0]
        assert br.console_errors() == []
        br.eval("document.getElementById('questions').scrollIntoView()")
        shot = br.screenshot(os.path.join(shot_dir, "report-synthetic.png"))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@needs_chromium
def test_packed_layers_read_back_exactly(two_arms):
    """What report.js rebuilds from the packed tables is, for every question and run, `layers()` itself."""
    from memlab import trace
    from memlab.report_html import QuestionTraces, layers

    runs = (two_arms["a"], two_arms["b"])
    with Chromium(1200, 900) as br:
        br.goto(two_arms["page"].resolve().as_uri())
        qids = br.eval("memlabReport.questions.map(q => q.qid)")
        for k, run in enumerate(runs):
            tr = trace.load(run.run_dir)
            fast = QuestionTraces(tr)
            mem_text = dict(zip(tr.memories.id, tr.memories.text))
            got = br.eval(f"memlabReport.questions.map(q => q.r[{k}] && memlabReport.layersOf({k}, q.i))")
            for qid, g in zip(qids, got):
                assert g == layers(fast.question(qid), mem_text), qid


@needs_chromium
def test_rows_open_from_the_keyboard(two_arms):
    with Chromium(1200, 900) as br:
        br.goto(two_arms["page"].resolve().as_uri())
        assert br.eval("[...document.querySelectorAll('#qbody tr')].every(t => t.tabIndex === 0)")
        second = br.eval("document.querySelectorAll('#qbody tr')[1].dataset.qid")
        br.eval("document.getElementById('f-text').focus()")
        br.key("Tab")  # from the last filter, Tab reaches the first row
        assert br.eval("document.activeElement === document.querySelector('#qbody tr')")
        br.key("ArrowDown")
        br.key("Enter")
        assert br.eval("document.activeElement.dataset.qid") == second  # focus kept on the re-rendered row
        assert br.eval("document.querySelector('#qbody tr.sel').dataset.qid") == second
        assert second in br.eval("document.getElementById('d-title').textContent")
        assert br.console_errors() == []


@needs_chromium
def test_hostile_text_in_chromium(hostile):
    pred = hostile["run"].predictions
    with Chromium(1200, 900) as br:
        br.goto(hostile["page"].resolve().as_uri())
        count = br.eval("document.getElementById('f-count').textContent")
        assert count == f"showing {len(pred)} of {len(pred)} questions"
        assert br.eval("typeof window.pwned") == "undefined"
        qid = pred.qid[pred.question == HOSTILE_Q].iloc[0]
        br.eval(f"memlabReport.show({json.dumps(qid)})")
        detail = br.eval("document.getElementById('detail').innerText")
        assert HOSTILE_Q in detail and HOSTILE_A in detail and "1. extractor layer" in detail
        assert br.eval("document.getElementById('data-error')") is None and br.console_errors() == []


@needs_chromium
def test_unreadable_data_shows_a_banner(two_arms, tmp_path):
    text = two_arms["page"].read_text(encoding="utf-8")
    cut = tmp_path / "cut.html"  # the data block cut short, as a truncated copy would leave it
    start = text.index('id="memlab-data">') + len('id="memlab-data">')
    cut.write_text(text[:start + 200] + text[text.index("</script>", start):], encoding="utf-8")
    with Chromium(1200, 900) as br:
        br.goto(cut.resolve().as_uri())
        banner = br.eval("document.getElementById('data-error').textContent")
        assert "could not be read" in banner and "question browser is empty" in banner
        assert br.eval("document.getElementById('data-error').getBoundingClientRect().top") < 50  # top of page
