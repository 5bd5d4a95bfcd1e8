"""Progress outside a terminal: a line per stage and about every 10 %, never tqdm's carriage-return redraws."""

from __future__ import annotations

import io

from memlab.progress import LineProgress, progress_bar
from memlab.run import ExperimentConfig, run_experiment


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_file_gets_a_line_per_tenth_and_the_end():
    out = io.StringIO()
    assert sum(1 for _ in progress_bar(range(250), desc="answer (x)", file=out)) == 250
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and all(ln.startswith("answer (x): ") for ln in lines)
    assert lines[0] == "answer (x): 0/250" and lines[-1].startswith("answer (x): 250/250 done, ")
    assert len(lines) == 11 and "25/250 (10 %)" in lines[1] and "225/250 (90 %)" in lines[-2]
    out = io.StringIO()
    list(progress_bar(range(10), desc="extract", file=out))  # every tenth of 10 (3/10 is not 0.2999...)
    assert [ln.split(" ")[1] for ln in out.getvalue().splitlines()[1:-1]] == [f"{i}/10" for i in range(1, 10)]


def test_update_total_growth_and_disable():
    out = io.StringIO()
    bar = progress_bar(total=0, desc="grid", file=out)
    assert isinstance(bar, LineProgress)
    bar.total += 4
    bar.refresh()
    for _ in range(4):
        bar.update()
    bar.close()
    bar.close()  # closing twice says nothing more
    assert out.getvalue().splitlines()[-1].startswith("grid: 4/4 done") and out.getvalue().count("done") == 1
    cut = io.StringIO()
    for i in progress_bar(range(10), desc="cut", file=cut):
        if i == 2:
            break
    assert cut.getvalue().splitlines()[-1].startswith("cut: 2/10 stopped")  # not "done"
    quiet = io.StringIO()
    b = progress_bar(total=3, desc="q", disable=True, file=quiet)
    b.update(3)
    b.close()
    assert quiet.getvalue() == ""


def test_a_terminal_keeps_tqdm():
    from tqdm import tqdm

    bar = progress_bar(total=2, desc="t", file=Terminal())
    assert isinstance(bar, tqdm)
    bar.close()


def test_a_run_logged_to_a_file_has_no_redraws(synthetic_path, tmp_path, capsys):
    """Before: every stage's tqdm bar wrote its redraws (\\r) into a captured stderr."""
    cfg = ExperimentConfig.from_dict({"name": "log", "dataset": {"path": str(synthetic_path)},
                                      "extraction": {"name": "turns"}})
    run_experiment(cfg, results=tmp_path)
    err = capsys.readouterr().err
    assert "\r" not in err and "answer (extractive): 7/7 done" in err and "extract (turns): " in err


def test_the_time_shown_counts_from_when_the_bar_is_made():
    """A bar advanced by ``update()`` after each chunk of work must count the first chunk: before, the clock
    started at the first update, so a 7 s encode said "2.4 s"."""
    import time

    out = io.StringIO()
    bar = progress_bar(total=2, desc="encode", file=out)
    time.sleep(0.3)  # the first chunk's work
    bar.update(2)
    bar.close()
    shown = float(out.getvalue().splitlines()[-1].split(", ")[-1].removesuffix(" s"))
    assert shown >= 0.3


def test_a_saved_notebook_shows_each_bar_as_it_ended():
    """In a notebook the bar is tqdm's widget; the output's plain-text copy (what a viewer without widgets shows)
    is replaced when the bar closes: the final frame, nothing for ``leave=False``, the stopping point for a bar
    that did not finish (before: every bar frozen at its first frame, ``0/1986``)."""
    import re

    import nbformat
    from nbclient import NotebookClient

    code = ("from memlab.progress import progress_bar\n"
            "b = progress_bar(total=50, desc='answer')\nb.update(20)\nb.update(30)\nb.close()\n"
            "c = progress_bar(total=30, desc='encode', leave=False)\nc.update(30)\nc.close()\n"
            "for x in progress_bar(range(7), desc='iter'):\n    pass\n"
            "d = progress_bar(total=9, desc='stopped')\nd.update(4)\nd.close()\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(nb, kernel_name="python3", timeout=120).execute()
    plain = [o.get("data", {}).get("text/plain") for o in nb.cells[0].outputs if o.output_type == "display_data"]
    assert len(plain) == 4
    assert re.match(r"answer: 100%\|.*\| 50/50 ", plain[0]) and plain[1] == ""
    assert re.match(r"iter: 100%\|.*\| 7/7 ", plain[2]) and re.match(r"stopped:  44%\|.*\| 4/9 ", plain[3])
    widgets = [o for o in nb.cells[0].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widgets) == 3  # the kept bars stay widgets (their state is saved as it ended)
