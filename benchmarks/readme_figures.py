"""Regenerate the documentation's measured figures, each in its marked region, with the date and the command.

    python benchmarks/readme_figures.py offline-run dead-endpoint   # the cheap ones (a few minutes)
    python benchmarks/readme_figures.py --all                        # every figure (an hour or more on 2 cores)
    python benchmarks/readme_figures.py --list                       # names, commands, rough cost

A figure lives between ``<!-- figures:NAME -->`` and ``<!-- /figures -->`` in README.md or in a page of the
documentation site (``docs/**/*.md``; `find_region` says which); this script rewrites only that text (a region
without a generator, a generator without a region, or a name in two pages is an error), so every number in
those regions comes from one command run on one date. Run from the repository root with
``MEMLAB_LOCOMO`` pointing at locomo10.json. Timings depend on the machine and its load: each region says
the cores and the load average it was measured under.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGION = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)


@dataclass
class Figure:
    command: str
    """What the figure measures, as a user would type it."""
    cost: str
    make: Callable[[], str]
    """Returns the region's markdown (without the trailing provenance line)."""


def _memlab(args: list[str], log: Path) -> tuple[int, float, float, str]:
    """``python -m memlab ARGS`` as a separate process, stderr to ``log`` (a file: not a terminal).
    Returns (exit code, wall s, CPU s of the child, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with log.open("wb") as err:
        p = subprocess.run([sys.executable, "-m", "memlab", *args], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=err, env=dict(os.environ), check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.returncode, wall, cpu, p.stdout.decode("utf-8", "replace")


def _offline(tmp: str) -> tuple[Path, float, float, Path]:
    """``memlab run offline`` into a fresh results root under ``tmp``: (run folder, wall s, CPU s, stderr log)."""
    log = Path(tmp) / "stderr.log"
    rc, wall, cpu, _ = _memlab(["run", "offline", "--results", f"{tmp}/results"], log)
    if rc != 0:
        raise RuntimeError(f"memlab run offline exited {rc}:\n{log.read_text()[-2000:]}")
    return next(Path(tmp, "results").glob("offline-*")), wall, cpu, log


def offline_run() -> str:
    from memlab.run import load_run

    with tempfile.TemporaryDirectory() as tmp:
        run_dir, wall, cpu, log = _offline(tmp)
        run = load_run(run_dir)
        s, size, lines = run.summary, log.stat().st_size, log.read_text().count("\n")
    o4, o5, c5 = s.loc["overall 1-4"], s.loc["overall 1-5"], s.loc["5"]
    return (f"`memlab run offline` from a fresh results root: F1 (official LoCoMo) **{o4.f1:.3f} "
            f"[{o4.f1_lo:.3f}, {o4.f1_hi:.3f}]** over categories 1–4 (n {int(o4.n):,}), {o5.f1:.3f} "
            f"[{o5.f1_lo:.3f}, {o5.f1_hi:.3f}] over 1–5 (n {int(o5.n):,}); evidence Recall@10 "
            f"{o4['recall@10']:.3f} (1–4), {c5['recall@10']:.3f} (category 5), {o5['recall@10']:.3f} (1–5). "
            f"{wall:.0f} s wall, {cpu:.0f} s CPU; its stderr, captured to a file, is {size:,} bytes in "
            f"{lines} lines (a line per stage and per 10 %, no progress-bar redraws).\n")


def dead_endpoint() -> str:
    from memlab.testing import closed_port_api_base

    base = closed_port_api_base()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "stderr.log"
        rc, wall, _, _ = _memlab(["run", "original", "--set", f"models.api_base={base}", "--results",
                                  f"{tmp}/results"], log)
        msg = log.read_text().strip()
        from memlab.run import ExperimentConfig
        from memlab.run.clients import Clients, check_endpoints

        cfg = ExperimentConfig.from_yaml("original").with_overrides({"models.api_base": base})
        t0 = time.perf_counter()
        try:
            check_endpoints(cfg, Clients(cfg, Path(tmp) / "responses.sqlite"))
        except ConnectionError:
            check_s = time.perf_counter() - t0
        else:
            raise RuntimeError(f"{base}: something answers there; the figure needs a dead endpoint")
    return (f"`memlab run original --set models.api_base={base}` with nothing listening there: exit {rc} after "
            f"{wall:.1f} s wall, of which the endpoint check itself takes {1000 * check_s:.0f} ms (the rest is "
            f"the process start, imports and the dataset checks), saying:\n\n```text\n{msg}\n```\n")


def demo() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        rc1, cold, _, _ = _memlab(["demo", "--results", f"{tmp}/results"], Path(tmp) / "a.log")
        rc2, warm, _, out = _memlab(["demo", "--results", f"{tmp}/results"], Path(tmp) / "b.log")
    if rc1 or rc2:
        raise RuntimeError(f"memlab demo exited {rc1}/{rc2}")
    table = out[out.index("per-category results"):out.index("\nstages:")].strip()
    return (f"`make demo`'s job (`memlab demo`): {cold:.0f} s the first time, {warm:.0f} s once the extraction "
            f"is cached. Its table:\n\n```text\n{table}\n```\n")


def topk() -> str:
    from memlab import plots
    from memlab.run import load_run

    with tempfile.TemporaryDirectory() as tmp:
        rc, wall, cpu, _ = _memlab(["run", "topk-ablation", "--results", f"{tmp}/results"], Path(tmp) / "err.log")
        if rc != 0:
            raise RuntimeError(f"memlab run topk-ablation exited {rc}:\n{(Path(tmp) / 'err.log').read_text()[-2000:]}")
        runs = sorted((load_run(d) for d in Path(tmp, "results").glob("topk-*") if d.is_dir()),
                      key=lambda r: r.config.retrieval.top_k)
    df = plots.topk_measures(runs, groups=("overall 1-4", "1"))
    ci = lambda r, c: f"{r[c]:.3f} [{r[c + '_lo']:.3f}, {r[c + '_hi']:.3f}]"  # noqa: E731
    rows = ["| group | k | F1 [95 % CI] | answer ceiling@k [95 % CI] | answer-bearing@k | evidence Recall@k "
            "(context) | context tokens/QA |", "|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        rows.append(f"| {r.label} (n {int(r.n):,}) | {int(r.k)} | {ci(r, 'f1')} | {ci(r, 'answer_ceiling')} | "
                    f"{r.answer_bearing:.3f} | {r.context_recall:.3f} | {r.context_tokens_qa:,.0f} |")
    pred = {int(r.config.retrieval.top_k): r.predictions.set_index("qid").prediction for r in runs}
    ks = sorted(pred)
    changed = {(a, ks[-1]): int((pred[a] != pred[ks[-1]].reindex(pred[a].index)).sum()) for a in ks[:-1]}
    n = len(pred[ks[0]])
    moved = "; ".join(f"k = {a} vs {b}: {c:,} of {n:,} ({100 * c / n:.1f} %)" for (a, b), c in changed.items())
    return ("\n".join(rows) + f"\n\nPredictions that differ from the k = {ks[-1]} run's: {moved}. "
            f"The grid took {wall:.0f} s wall, {cpu:.0f} s CPU.\n")


def handcheck() -> str:
    """The attribution rules against the hand labels (`benchmarks/attribution_agreement.py --markdown`) on a
    fresh offline run: a label judges one prediction, so it needs the shipped reader's own run."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, _, _, _ = _offline(tmp)
        p = subprocess.run([sys.executable, "benchmarks/attribution_agreement.py", str(run_dir), "--markdown"],
                           cwd=ROOT, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"attribution_agreement.py exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


def _verbatim(script: str, args: list[str], fenced: bool = True) -> Callable[[], str]:
    """A script's stdout as the region: in a text block, or (``fenced=False``) as the markdown it already is."""
    def make() -> str:
        p = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, capture_output=True,
                           text=True, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"{script} exited {p.returncode}:\n{p.stderr[-2000:]}")
        return f"```text\n{p.stdout.strip()}\n```\n" if fenced else p.stdout.strip() + "\n"
    return make


BF16_ARGS = ["--config", "retrieval-best", "--no-model-check", "--set", "index.embedder.params.dtype=bfloat16",
             "--set", "index.sparse.params.dtype=bfloat16"]
RECALL_ARGS = ["--configs", "retrieval-best,offline", "--baseline", "--tune", "--folds", "5"]
GRID_ARGS = ["--conversations", "2", "--questions", "10", "--latency", "0.2", "--concurrency", "2"]
LME_ARGS = ["--s-questions", "2", "6", "--m-questions", "1", "2", "--workers", "2", "8", "32"]

_FR = "results/.cache/fit_reader"
#: The reader's held-out tables read what `benchmarks/fit_reader.py --learned ... --held-out` wrote (a fit is
#: ~20 min on 2 loaded cores; its commands are on docs/benchmarks/reader.md) and the hand-weighted reader's frame.
READER_OFFLINE_ARGS = ["--held-out", f"{_FR}/heldout-offline-v5-choice.csv",
                       "--weights-csv", f"{_FR}/weights-offline.csv", "--contexts", f"{_FR}/contexts-k5-10-20-40.pkl",
                       "--before", "benchmarks/reader_before.json:offline"]
READER_RB_ARGS = ["--held-out", f"{_FR}/heldout-rb-k10-citing-choice.csv",
                  "--weights-csv", f"{_FR}/weights-rb-k10-citing.csv",
                  "--contexts", f"{_FR}/contexts-retrieval-best-k10-citing.pkl", "--ks", "10",
                  "--before", "benchmarks/reader_before.json:retrieval-best"]
READER_LOSS_ARGS = ["--k", "10", "--categories", "4", "1", "--held-out", f"{_FR}/heldout-offline-v5-choice.csv"]
READER_COST_ARGS = ["--n", "300", "--ks", "10", "40", "--question", "batch"]
READER_IMPORTANCE_ARGS = ["--importances", "memlab/answer/reader_model.json:offline"]

FIGURES: dict[str, Figure] = {
    "reader-heldout": Figure(f"python benchmarks/reader_table.py {' '.join(READER_OFFLINE_ARGS)}",
                             "~10 min (the hand-weighted frame; the held-out CSV is fit_reader.py's)",
                             _verbatim("reader_table.py", READER_OFFLINE_ARGS, fenced=False)),
    "reader-heldout-rb": Figure(f"python benchmarks/reader_table.py {' '.join(READER_RB_ARGS)}",
                                "~5 min (the hand-weighted frame; the held-out CSV is fit_reader.py's)",
                                _verbatim("reader_table.py", READER_RB_ARGS, fenced=False)),
    "reader-losses": Figure(f"python benchmarks/reader_losses.py {' '.join(READER_LOSS_ARGS)}", "~2 min",
                            _verbatim("reader_losses.py", READER_LOSS_ARGS, fenced=False)),
    "reader-importances": Figure(f"python benchmarks/reader_table.py {' '.join(READER_IMPORTANCE_ARGS)}", "seconds",
                                 _verbatim("reader_table.py", READER_IMPORTANCE_ARGS, fenced=False)),
    "reader-cost": Figure(f"python benchmarks/reader_cost.py {' '.join(READER_COST_ARGS)}", "~3 min",
                          _verbatim("reader_cost.py", READER_COST_ARGS)),
    "offline-run": Figure("memlab run offline", "~2 min on 2 cores", offline_run),
    "dead-endpoint": Figure("memlab run original --set models.api_base=<nothing listening>", "seconds",
                            dead_endpoint),
    "handcheck": Figure("python benchmarks/attribution_agreement.py <fresh offline run> --markdown",
                        "~5 min on 2 cores (an offline run, then the rules on its failed questions)", handcheck),
    "topk": Figure("memlab run topk-ablation (k = 5, 10, 20, 40; offline arm)", "~5 min on 2 cores", topk),
    "demo": Figure("memlab demo (twice: cold, cached)", "~4 min", demo),
    "retrieval-recall": Figure(f"python benchmarks/retrieval_recall.py {' '.join(RECALL_ARGS)}",
                               "~30 min+ (SPLADE and minilm encodings, a 5-fold tuning grid)",
                               _verbatim("retrieval_recall.py", RECALL_ARGS)),
    "grid-scaling": Figure(f"python benchmarks/grid_scaling.py {' '.join(GRID_ARGS)}",
                           "~5 min plus Ray's start; needs ray", _verbatim("grid_scaling.py", GRID_ARGS)),
    "retrieval-best-run": Figure("python benchmarks/offline_run.py --config retrieval-best --no-model-check",
                                 "~7 min on 2 quiet cores (minilm and SPLADE encode LoCoMo-10 cold)",
                                 _verbatim("offline_run.py", ["--config", "retrieval-best", "--no-model-check"])),
    "retrieval-best-bf16-run": Figure(f"python benchmarks/offline_run.py {' '.join(BF16_ARGS)}",
                                      "~5 min on 2 quiet cores (minilm and SPLADE in bfloat16, cold)",
                                      _verbatim("offline_run.py", BF16_ARGS)),
    "longmemeval-scale": Figure(f"python benchmarks/longmemeval_scale.py {' '.join(LME_ARGS)}",
                                "~10 min on 2 loaded cores", _verbatim("longmemeval_scale.py", LME_ARGS)),
    "real-model": Figure("python benchmarks/real_model.py", "~1-2 h on 2 cores (SmolLM2 on llama.cpp; needs the "
                         "local extra)", _verbatim("real_model.py", [], fenced=False)),
    "serve-threads": Figure("python benchmarks/serve_threads.py", "~5 min (needs the local extra)",
                            _verbatim("serve_threads.py", [], fenced=False)),
    "real-vs-scripted": Figure("python benchmarks/real_vs_scripted.py", "~1 min (needs the local extra)",
                               _verbatim("real_vs_scripted.py", [], fenced=False)),
}


def regions(text: str) -> dict[str, str]:
    """A page's figure regions by name (a region opened but not closed, or named twice, is an error)."""
    found = [m.group("name") for m in REGION.finditer(text)]
    opened = re.findall(r"<!-- figures:([\w-]+) -->", text)
    if sorted(found) != sorted(opened) or len(set(found)) != len(found):
        raise ValueError(f"figure regions: opened {opened}, closed {found}; each name once, each closed "
                         f"by <!-- /figures -->")
    return {m.group("name"): m.group("body") for m in REGION.finditer(text)}


def replace_region(text: str, name: str, body: str) -> str:
    """``text`` with region ``name``'s body replaced (an unknown region is an error naming the known ones)."""
    known = regions(text)
    if name not in known:
        raise KeyError(f"page has no region <!-- figures:{name} --> (it has: {', '.join(known) or 'none'})")
    return REGION.sub(lambda m: m.group(1) + body + m.group(4) if m.group("name") == name else m.group(0), text)


def pages(root: Path = ROOT) -> list[Path]:
    """Where figure regions may live: README.md and every markdown page of the documentation site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def all_regions(root: Path = ROOT) -> dict[str, Path]:
    """Every figure region's name and the page holding it (a name in two pages is an error naming both)."""
    out: dict[str, Path] = {}
    for page in pages(root):
        if not page.is_file():
            continue
        try:
            names = regions(page.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"{page.relative_to(root)}: {e}") from None
        for name in names:
            if name in out:
                raise ValueError(f"figure region {name!r} is in {out[name].relative_to(root)} and "
                                 f"{page.relative_to(root)}; each name once")
            out[name] = page
    return out


def find_region(name: str, root: Path = ROOT) -> Path:
    """The page (README.md or docs/**/*.md) holding region ``name``; an unknown name is an error listing them."""
    found = all_regions(root)
    if name not in found:
        raise KeyError(f"no page has <!-- figures:{name} --> (README.md and docs/**/*.md have: "
                       f"{', '.join(sorted(found)) or 'none'})")
    return found[name]


def provenance(name: str, when: dt.date | None = None) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"<sub>Regenerated {(when or dt.date.today()).isoformat()} by `python benchmarks/readme_figures.py "
            f"{name}` ({FIGURES[name].command}) on {os.cpu_count()} cores, load average {load:.1f}.</sub>\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"figures to regenerate: {', '.join(FIGURES)}")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    have = all_regions()
    if set(have) != set(FIGURES):
        raise SystemExit(f"figure regions {sorted(have)} (README.md and docs/) and generators {sorted(FIGURES)} "
                         f"differ")
    if args.list or not (args.names or args.all):
        for n, f in FIGURES.items():
            print(f"{n:18s} {f.cost:55s} {f.command}")
        return 0
    names = list(FIGURES) if args.all else args.names
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise SystemExit(f"unknown figure(s) {unknown}; known: {', '.join(FIGURES)}")
    for n in names:
        t0 = time.perf_counter()
        body = FIGURES[n].make() + "\n" + provenance(n)
        page = find_region(n)
        text = replace_region(page.read_text(encoding="utf-8"), n, body)
        page.write_text(text, encoding="utf-8")  # one region at a time: a later failure keeps the earlier ones
        print(f"{n}: regenerated in {time.perf_counter() - t0:.0f} s ({page.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
