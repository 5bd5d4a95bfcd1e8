"""How long ``memlab report --html`` takes to build its page, before and after, side by side on the same runs.

    python benchmarks/report_html_time.py RUN_A RUN_B [--before-ref main] [--repeat 3] [--stages] [--profile 25]

"before" is the page builder of a git ref (``--before-ref``, default ``main``: its ``memlab`` package, extracted
with ``git archive`` into a temporary folder), "after" is this checkout's; each build runs in its own Python
process (imports included: what a user waits for), alternating before / after ``--repeat`` times, so both see the
same machine load. Wall time on a shared machine is noisy (read the ratio); CPU time (the process's own, all
threads, plus its forked children's) is what the build costs on a quiet machine, give or take contention's cache
effects; wall time below CPU time is the forked runs overlapping. ``--stages`` runs the stages in one process.

It then checks that the pages show the same numbers: the question browser's data (every question's outcome and
three layers, the string table), the paired comparisons' rows, and every cell of the summary table the before
page shows (the after page may add columns: the answer ceiling and answer-bearing); and says whether the two pages
are the same bytes but for their "generated" time (plots included). ``--stages`` builds each side once more and
prints its CPU seconds per stage; ``--profile N`` builds the after page under cProfile (CPU time) and prints its N
most expensive calls (cumulative): where the time goes.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = """
import os, sys, time
def cpu():  # this process and its finished children (the builder forks one process per run where there are cores)
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
t0, c0 = time.perf_counter(), cpu()
from memlab.report_html import build_html
page = build_html(sys.argv[2:])
open(sys.argv[1], "w", encoding="utf-8").write(page)
print(time.perf_counter() - t0, cpu() - c0)
"""
PROFILE = """
import cProfile, pstats, sys, time
prof = cProfile.Profile(time.process_time)
prof.enable()
from memlab.report_html import build_html
build_html(sys.argv[2:])
prof.disable()
pstats.Stats(prof).sort_stats("cumulative").print_stats(int(sys.argv[1]))
"""
STAGES = """
import collections, functools, json, sys, time
c0 = time.process_time()
import memlab.report_html as rh
import memlab.plots as plots
cpu = collections.Counter({"imports": time.process_time() - c0})
def timed(mod, name, key):
    f = getattr(mod, name, None)
    if f is None:
        return
    @functools.wraps(f)
    def g(*a, **k):
        s = time.process_time()
        try:
            return f(*a, **k)
        finally:
            cpu[key] += time.process_time() - s
    setattr(mod, name, g)
for n in ("load_runs", "report_table", "load_dataset", "pack_runs", "embed_json", "report_comparison", "_png"):
    timed(rh, n, n.strip("_"))
if hasattr(rh, "fork_workers"):  # the stages in this one process (a forked child's timers would be lost)
    rh.fork_workers = lambda *a: 1
timed(rh.trace, "load", "trace.load")
timed(rh.attribution, "attribute", "attribute")
for n in ("category_bars", "f1_vs_tokens", "attribution_bars", "recall_curves", "topk_curve"):
    timed(plots, n, "plots (figures)")
rh.build_html(sys.argv[1:])
cpu["total"] = time.process_time() - c0
cpu["other"] = cpu["total"] - sum(v for k, v in cpu.items() if k != "total")
print(json.dumps(cpu))
"""
GENERATED = re.compile(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC")


def extract_ref(ref: str, into: Path) -> Path:
    """The ``memlab`` package of ``ref`` in ``into`` (a tree importable with PYTHONPATH)."""
    into.mkdir(parents=True, exist_ok=True)
    tar = into / "src.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", "-C", str(REPO), "archive", ref, "memlab"], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into


def build(tree: Path, runs: list[str], out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one page build (imports included) in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run([sys.executable, "-c", BUILD, str(out), *runs], env=env, capture_output=True, text=True,
                         cwd=tree)
    if res.returncode:
        raise SystemExit(f"build with {tree} failed:\n{res.stderr[-3000:]}")
    wall, cpu = res.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def stage_cpu(tree: Path, runs: list[str]) -> dict[str, float]:
    """CPU seconds per stage of one page build in a fresh process (the stages timed by wrapping the functions
    ``build_html`` calls; what is not wrapped is 'other')."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run([sys.executable, "-c", STAGES, *runs], env=env, capture_output=True, text=True, cwd=tree)
    if res.returncode:
        raise SystemExit(f"staged build with {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def payload(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="memlab-data">(.*?)</script>', text, re.S)
    if m is None:
        raise SystemExit("no data block in the page")
    return json.loads(m.group(1))


def summary_cells(text: str) -> list[dict[str, str]]:
    """The summary table's rows as {header: cell}."""
    table = text.split('<table class="summary">')[1].split("</table>")[0]
    heads = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])
    return [dict(zip(heads, (html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r)))) for r in rows]


def same_numbers(before: str, after: str) -> list[str]:
    """What differs between the pages' numbers (empty: nothing)."""
    a, b = payload(before), payload(after)
    out = [k for k in ("questions", "mems", "runs_data", "strings", "cats", "labels") if a.get(k) != b.get(k)]
    if [c["rows"] for c in a["comparisons"]] != [c["rows"] for c in b["comparisons"]]:
        out.append("comparisons")
    sa, sb = summary_cells(before), summary_cells(after)
    if len(sa) != len(sb) or any(ra[h] != rb.get(h) for ra, rb in zip(sa, sb) for h in ra if h != "run"):
        out.append("summary table")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="finished run folders (the page's runs, in order)")
    ap.add_argument("--before-ref", default="main", help="git ref whose page builder is 'before' (default: main)")
    ap.add_argument("--repeat", type=int, default=1, help="builds per side, alternating (default 1)")
    ap.add_argument("--stages", action="store_true",
                    help="then build each side once more and print its CPU seconds per stage (imports included)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then profile one more after build and print its N top calls (default: no profile)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        before_tree = extract_ref(args.before_ref, (t / "before"))
        times: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for _ in range(args.repeat):
            for side, tree in (("before", before_tree), ("after", REPO)):
                times[side].append(build(tree, args.runs, t / f"{side}.html"))
                print(f"{side}: {times[side][-1][0]:.1f} s wall, {times[side][-1][1]:.1f} s CPU", flush=True)
        pages = {s: (t / f"{s}.html").read_text(encoding="utf-8") for s in times}
        diff = same_numbers(pages["before"], pages["after"])
        same_page = GENERATED.sub("", pages["before"]) == GENERATED.sub("", pages["after"])
        stages = {side: stage_cpu(tree, args.runs) for side, tree in (("before", before_tree), ("after", REPO))} \
            if args.stages else {}
    wall = {s: statistics.median(w for w, _ in v) for s, v in times.items()}
    cpu = {s: statistics.median(c for _, c in v) for s, v in times.items()}
    print(f"\n{'':8}{'wall s':>10}{'CPU s':>10}{'page bytes':>14}   (medians of {args.repeat}; each build, wall/CPU)")
    for s in ("before", "after"):
        print(f"{s:8}{wall[s]:>10.1f}{cpu[s]:>10.1f}{len(pages[s].encode()):>14,}   "
              + ", ".join(f"{w:.1f}/{c:.1f}" for w, c in times[s]))
    print(f"speed-up: {wall['before'] / wall['after']:.1f}x wall, {cpu['before'] / cpu['after']:.1f}x CPU "
          f"({args.before_ref} -> this checkout), {len(args.runs)} runs: {', '.join(args.runs)}")
    print("numbers shown: " + ("identical (browser data, comparisons, every summary cell of the before page)"
                               if not diff else "DIFFER in " + ", ".join(diff)))
    print("whole page: " + ("the same bytes but for the generation time (plots included)" if same_page else
                            "differs (beyond the generation time)"))
    if stages:
        print(f"\nCPU s per stage (one build per side; 'attribute' includes importing nltk and scikit-learn, "
              f"'png' is drawing the figures to PNG):\n{'stage':20}{'before':>10}{'after':>10}")
        for k in sorted(set(stages["before"]) | set(stages["after"]), key=lambda k: -stages["before"].get(k, 0)):
            print(f"{k:20}{stages['before'].get(k, 0):>10.2f}{stages['after'].get(k, 0):>10.2f}")
    if args.profile:
        res = subprocess.run([sys.executable, "-c", PROFILE, str(args.profile), *args.runs], capture_output=True,
                             text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        print(f"\nwhere the after build's CPU goes (cProfile, top {args.profile} by cumulative time; the profiler "
              f"inflates many small calls):\n" + (res.stdout[-30000:] if not res.returncode else
                                                  f"profile failed:\n{res.stderr[-3000:]}"))
    if diff:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
