"""The HTML report: one self-contained page, checked in a real headless Chromium (skipped, saying why, without one).

Set ``MEMLAB_EVIDENCE_DIR`` to keep the screenshot of the page with a question open.
"""

from __future__ import annotations

import json
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
                                       "extraction": {"extractor": "turns+observations"},
                                       "run": {"allow_failed_extraction": True}})  # syn-2 has no observations
    a = run_experiment(base, results=root / "results", progress=False)
    b = run_experiment(base.with_overrides({"name": "offline-obs", "extraction.extractor": "observations"}),
                       results=root / "results", progress=False)
    page = write_html(root / "report.html", [a.run_dir, b.run_dir], title="synthetic report")
    return {"a": a, "b": b, "page": page, "root": root}


def payload(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="memlab-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_page_is_self_contained(two_arms):
    text = two_arms["page"].read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched from anywhere
    assert "<link" not in text and "@import" not in text
    assert text.count("data:image/png;base64,") >= 4  # category bars, F1 vs tokens, attribution, recall
    data = payload(text)
    a, b = two_arms["a"], two_arms["b"]
    assert [r["label"] for r in data["runs"]] == ["offline extractor=turns+observations",
                                                  "offline-obs extractor=observations"]
    assert [q["qid"] for q in data["questions"]] == a.predictions.qid.tolist()
    f1a = dict(zip(a.predictions.qid, a.predictions.f1))
    f1b = dict(zip(b.predictions.qid, b.predictions.f1))
    for q in data["questions"]:
        assert q["r"][0]["f1"] == pytest.approx(f1a[q["qid"]]) and q["r"][1]["f1"] == pytest.approx(f1b[q["qid"]])
        assert q["flip"] == ((f1a[q["qid"]] >= 0.5) != (f1b[q["qid"]] >= 0.5))
        for r in q["r"]:
            assert set(r["layers"]) == {"ops", "mems", "queries", "answer"}
            assert (r["label"] is None) == r["ok"] or q["cat"] == 5  # a label exactly for each failed question
    assert "Paired comparisons" in text and "Summary per category" in text


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


def test_build_refuses_when_no_run_finished(tmp_path, two_arms):
    import shutil

    d = tmp_path / "killed"
    shutil.copytree(two_arms["a"].run_dir, d)
    (d / "predictions.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="no finished run"):
        build_html([d])


@pytest.mark.skipif(find_chromium() is None, reason="no chromium on PATH: `make test` installs Debian's chromium "
                    "when run as root with apt-get (apt-get install -y chromium); set MEMLAB_CHROMIUM to a binary")
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
