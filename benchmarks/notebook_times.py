"""Execute the notebooks headless, one after another, in one results root, and print each one's wall and CPU time.

    MEMLAB_LOCOMO=.../locomo10.json python benchmarks/notebook_times.py                # 01-06, full data, cold
    python benchmarks/notebook_times.py --results results-nb --notebooks 02 05         # some, in a given root
    python benchmarks/notebook_times.py --params 'conversations = ["conv-26"]'         # a subset (a quick check)
    python benchmarks/notebook_times.py --save executed/                               # keep notebooks and figures
    python benchmarks/notebook_times.py --markdown executed/                           # the saved times, as markdown

Cold by default: a new, empty results root (so empty extraction and response caches) and an empty machine cache of
model vectors, shared by the notebooks, as ``../results`` is when they are run in order. Each notebook runs as the
tests run it (nbclient, the parameter cell followed by one that sets ``results`` and ``--params``). CPU is the
kernel's (a child process, reaped when the notebook ends) plus this process's; the load average is sampled every
5 s. Also printed: the slowest cells of each notebook, and any stderr output (a clean notebook has none).

``--save DIR`` keeps what a run measured and drew: each executed notebook (``DIR/<name>.ipynb``, its outputs and
widget state), every image it displayed (``DIR/figures/<name>/cell<i>-<j>.png``: the plots as the notebook drew
them), and the timing figures (``DIR/notebook_times.json``, and ``DIR/notebook_times.md`` as a markdown table).
``--markdown DIR`` prints that table again from the saved JSON, running nothing: what a README or docs region is
regenerated from (``benchmarks/readme_figures.py``'s ``_verbatim("notebook_times.py", ["--markdown", DIR],
fenced=False)``) without executing the notebooks again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and its reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cell_seconds(cell) -> float:
    ex = cell.metadata.get("execution", {})
    a, b = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not a or not b:
        return 0.0
    return (datetime.fromisoformat(b.replace("Z", "+00:00")) - datetime.fromisoformat(a.replace("Z", "+00:00"))
            ).total_seconds()


def execute(path: Path, results: Path, params: str, save: Path | None = None) -> dict:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(f'{params}\nresults = r"{results}"'))
    c0, t0 = cpu_s(), time.perf_counter()
    NotebookClient(nb, kernel_name="python3", timeout=3600, record_timing=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    figures: list[str] = []
    if save is not None:  # to compare two versions' outputs (`benchmarks/notebook_outputs.py`), and the plots
        save.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save / path.name)
        figures = save_figures(nb, save / "figures" / path.stem)
    code = [(j, c) for j, c in enumerate(nb.cells) if c.cell_type == "code"]
    slow = sorted(((cell_seconds(c), j) for j, c in code), reverse=True)[:3]
    stderr = sum(1 for _, c in code for o in c.outputs if o.output_type == "stream" and o.name == "stderr")
    reused = sum(o.get("text", "").count("memlab: reusing ") for _, c in code for o in c.outputs
                 if o.output_type == "stream")
    return {"notebook": path.name, "wall_s": wall, "cpu_s": cpu, "slowest_cells": slow, "stderr_outputs": stderr,
            "reused_runs": reused, "figures": figures}


def save_figures(nb, folder: Path) -> list[str]:
    """Every PNG the executed notebook displayed, as ``cell<i>-<j>.png`` under ``folder``; their paths."""
    import base64

    out = []
    for i, cell in enumerate(nb.cells):
        for j, o in enumerate(cell.get("outputs", [])):
            png = o.get("data", {}).get("image/png") if o.get("output_type") in ("display_data", "execute_result") \
                else None
            if png:
                folder.mkdir(parents=True, exist_ok=True)
                target = folder / f"cell{i}-{j}.png"
                target.write_bytes(base64.b64decode(png))
                out.append(str(target))
    return out


def markdown(figures: dict) -> str:
    """The timing figures as a markdown table (one row per notebook, then all of them), with what they ran on."""
    lines = ["| notebook | wall s | CPU s | reused runs | stderr outputs | figures |", "|---|---:|---:|---:|---:|---:|"]
    for r in figures["notebooks"]:
        lines.append(f"| `{r['notebook'].removesuffix('.ipynb')}` | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | "
                     f"{r['reused_runs']} | {r['stderr_outputs']} | {len(r.get('figures', []))} |")
    a = figures["all"]
    lines.append(f"| all | {a['wall_s']:.0f} | {a['cpu_s']:.0f} | | | |")
    params = "; ".join(f"`{p}`" for p in (figures.get("params") or "").splitlines() if p.strip()) or \
        "the notebooks' own parameters (full data)"
    lines.append("")
    lines.append(f"Parameters: {params}; load average during: mean {a['load_mean']:.1f}, max {a['load_max']:.1f}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebooks", nargs="*", default=["01", "02", "03", "04", "05", "06"],
                    help="name prefixes, run in the order given (default: 01-06)")
    ap.add_argument("--results", help="results root (default: a new empty folder: cold caches)")
    ap.add_argument("--params", default="", help="code run after the parameter cell (e.g. a subset)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--save", help="write each executed notebook (with its outputs), the images it displayed and the "
                                   "timing figures (notebook_times.json, .md) into this folder")
    ap.add_argument("--markdown", metavar="DIR", help="print the timing table saved by --save DIR (runs nothing)")
    a = ap.parse_args(argv)
    if a.markdown:
        saved = Path(a.markdown) / "notebook_times.json"
        if not saved.is_file():
            print(f"--markdown {a.markdown}: no {saved.name} there (written by --save)", file=sys.stderr)
            return 2
        print(markdown(json.loads(saved.read_text())), end="")
        return 0
    if not os.environ.get("MEMLAB_LOCOMO"):
        print("set MEMLAB_LOCOMO to the LoCoMo-10 json", file=sys.stderr)
        return 2
    if a.save:  # keep the figures: drawn inline (PNG outputs of the saved notebooks), not by Agg into nothing
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ.setdefault("MPLBACKEND", "Agg")
    paths = []
    for prefix in a.notebooks:
        found = sorted(NOTEBOOKS.glob(f"{prefix}*.ipynb"))
        if len(found) != 1:
            print(f"--notebooks {prefix}: expected one notebook under {NOTEBOOKS}, found {len(found)}", file=sys.stderr)
            return 2
        paths.append(found[0])
    root = Path(a.results) if a.results else Path(tempfile.mkdtemp(prefix="memlab-nb-"))
    root.mkdir(parents=True, exist_ok=True)
    if not a.results:  # cold: the machine cache (model vectors, `memlab.index.machine_cache`) starts empty too
        os.environ["MEMLAB_CACHE_DIR"] = str(root / ".machine-cache")
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5.0):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample, daemon=True).start()
    print(f"results root {root}; {os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    t0, c0 = time.perf_counter(), cpu_s()
    for p in paths:
        row = execute(p, root, a.params, Path(a.save) if a.save else None)
        rows.append(row)
        cells = ", ".join(f"cell {j} {s:.0f} s" for s, j in row["slowest_cells"])
        print(f"{row['notebook']:32s} wall {row['wall_s']:7.1f} s  cpu {row['cpu_s']:7.1f} s  "
              f"reused {row['reused_runs']}  stderr outputs {row['stderr_outputs']}  slowest: {cells}", flush=True)
    done.set()
    total = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_s() - c0,
             "load_mean": sum(loads) / len(loads) if loads else os.getloadavg()[0],
             "load_max": max(loads) if loads else os.getloadavg()[0]}
    print(f"{'all':32s} wall {total['wall_s']:7.1f} s  cpu {total['cpu_s']:7.1f} s  "
          f"({total['wall_s'] / 60:.1f} min); load average during: mean {total['load_mean']:.1f}, "
          f"max {total['load_max']:.1f}")
    figures = {"root": str(root), "params": a.params, "cores": os.cpu_count(), "notebooks": rows, "all": total}
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1))
    if a.save:
        Path(a.save, "notebook_times.json").write_text(json.dumps(figures, indent=1))
        Path(a.save, "notebook_times.md").write_text(markdown(figures))
        print(f"saved under {a.save}: the executed notebooks, {sum(len(r['figures']) for r in rows)} figure(s) in "
              f"figures/, notebook_times.json and notebook_times.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
