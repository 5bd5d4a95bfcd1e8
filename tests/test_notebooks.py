"""Every notebook runs headless (nbclient) on a small subset; committed notebooks carry no outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
SMALL = {
    "01_quickstart.ipynb": 'conversations = ["conv-26"]\nquestion_limit = 30',
    "02_topk_ablation.ipynb": 'conversations = ["conv-26"]\nquestion_limit = 20\nks = [5, 10]',
    "03_f1_vs_tokens.ipynb": 'conversations = ["conv-26"]\nquestion_limit = 20',
    "04_multihop_failures.ipynb": 'conversations = ["conv-26"]\nquestion_limit = 60',
    "05_reconcile_thresholds.ipynb": 'conversations = ["conv-26"]\nquestion_limit = 20\n'
                                     'settings = [(0.90, 0.70, 0.60, 0.40)]',
}


def test_all_notebooks_listed():
    assert [p.name for p in NOTEBOOKS] == sorted(SMALL)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, locomo_path, warm_results, monkeypatch):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(SMALL[path.name] + f'\nresults = r"{warm_results}"'))
    monkeypatch.setenv("MEMLAB_LOCOMO", str(locomo_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # execute() raises CellExecutionError (naming the cell and its traceback) at the first cell that fails
    NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code")  # every cell ran
