"""Compare the outputs of two executions of the notebooks (``benchmarks/notebook_times.py --save DIR``), cell by cell:
every table, printed text and figure must be the same, so a change made to run them faster moved no number.

    python benchmarks/notebook_outputs.py executed-before/ executed-after/

Run folders' time stamps (``offline-20261203-235745``), the results roots and latencies (``latency 0.0041 s``) are
masked; stderr, progress-bar widgets and memlab's ``reusing`` / ``not reusing`` lines are left out (a second
execution reuses what the first ran, and shows fewer bars).
Figures are compared as their PNG bytes. Prints each differing output and exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

STAMP = re.compile(r"\d{8}-\d{6}(?:-\d+)?")
REUSE = re.compile(r"^memlab: (?:not )?reusing .*$", re.M)
LATENCY = re.compile(r"latency \d+(?:\.\d+)? s")
WIDGET = "application/vnd.jupyter.widget-view+json"


def outputs(cell, root: str) -> list[str]:
    """A code cell's outputs as comparable strings (masked as the module docstring says)."""
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            if o.name == "stderr":
                continue
            text = REUSE.sub("", o.text)
        elif o.output_type in ("execute_result", "display_data"):
            data = o.get("data", {})
            if WIDGET in data:
                continue
            text = data.get("image/png") or data.get("text/html") or data.get("text/plain", "")
        elif o.output_type == "error":
            text = f"ERROR {o.ename}: {o.evalue}"
        else:
            continue
        text = LATENCY.sub("latency <s>", STAMP.sub("<stamp>", text.replace(root, "<root>") if root else text))
        if text.strip():
            out.append(text)
    return out


def compare(a: Path, b: Path, root_a: str = "", root_b: str = "") -> list[str]:
    """Differences between the notebooks of folder ``a`` and folder ``b`` (empty: the same)."""
    import nbformat

    problems = []
    names = sorted(p.name for p in a.glob("*.ipynb"))
    if names != sorted(p.name for p in b.glob("*.ipynb")):
        problems.append(f"different notebooks: {names} vs {sorted(p.name for p in b.glob('*.ipynb'))}")
    for name in names:
        if not (b / name).is_file():
            continue
        ca = [c for c in nbformat.read(a / name, as_version=4).cells if c.cell_type == "code"]
        cb = [c for c in nbformat.read(b / name, as_version=4).cells if c.cell_type == "code"]
        for i, (x, y) in enumerate(zip(ca, cb)):
            ox, oy = outputs(x, root_a), outputs(y, root_b)
            if ox != oy:
                diff = "\n".join(difflib.unified_diff("\n".join(ox).splitlines(), "\n".join(oy).splitlines(),
                                                      lineterm="", n=1))
                problems.append(f"{name} code cell {i}: outputs differ\n{diff[:3000]}")
        if len(ca) != len(cb):
            problems.append(f"{name}: {len(ca)} vs {len(cb)} code cells")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="folder of executed notebooks (notebook_times.py --save)")
    ap.add_argument("b", help="the other folder")
    ap.add_argument("--roots", nargs=2, default=("", ""), metavar=("ROOT_A", "ROOT_B"),
                    help="the results roots the two executions used (masked in the outputs)")
    a = ap.parse_args(argv)
    problems = compare(Path(a.a), Path(a.b), *a.roots)
    for p in problems:
        print(p)
    n = len(list(Path(a.a).glob("*.ipynb")))
    print(f"{n} notebooks compared: {'the same outputs' if not problems else f'{len(problems)} difference(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
