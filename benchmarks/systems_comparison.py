"""Memory systems side by side from finished run folders: the figures of the systems table (docs/benchmarks/systems.md),
regenerated rather than typed.

    python benchmarks/systems_comparison.py RUN_DIR [RUN_DIR ...] [--baseline offline] [--md]
    python benchmarks/systems_comparison.py --results /tmp/hf-r --configs mem0-offline,offline,retrieval-best

Per run: F1 over categories 1-4 with its 95 % clustered-bootstrap interval and n, Recall@10 over 1-4 and on
category 5, ingest seconds per conversation (a system: the median and mean of its per-conversation ingest; the
first conversation also loads the embedder; a memlab run: extraction + indexing over all conversations / their
number, marked when the extraction came from the cache), the per-question latency p50 (search plus the reader:
the extractive reader's share is small but not nil), memories stored and the store's size on disk. Then the
paired comparison (`memlab.compare`) of every run against the baseline, on F1 and Recall@10.
Wall times are whatever the machine gave the run: compare them only between runs measured side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

import memlab
from memlab.run.report_format import markdown_table
from memlab.run.results import Run, load_run
from memlab.studies import store_bytes


def latest_runs(results: Path, configs: list[str]) -> list[Path]:
    """Each config's newest complete run folder under ``results`` (an unfinished one is an error, not skipped)."""
    out = []
    for name in configs:
        folders = sorted(p for p in results.glob(f"{name}-2*") if p.is_dir() and p.name[len(name) + 1:].replace(
            "-", "").isdigit())
        if not folders:
            raise SystemExit(f"no run folder of config {name!r} under {results}")
        run = load_run(folders[-1])
        if run.status != "complete":
            raise SystemExit(f"{folders[-1]}: status {run.status!r}; expected a complete run")
        out.append(folders[-1])
    return out


def _row(summary: pd.DataFrame, group: str) -> pd.Series:
    if group not in summary.index.astype(str):
        raise SystemExit(f"summary has no group {group!r}")
    return summary.loc[summary.index.astype(str) == group].iloc[0]


def ingest_per_conversation(run: Run) -> str:
    info = run.info
    sysinfo = info.get("system")
    if sysinfo:
        secs = [c["ingest_s"] for c in sysinfo["per_conversation"]]
        return f"{statistics.median(secs):.1f} (mean {statistics.mean(secs):.1f})"
    t = info.get("timings", {})
    n = info.get("extraction", {}).get("conversations_extracted") or run.predictions["conversation_id"].nunique()
    total = (t.get("extraction_s") or 0.0) + (t.get("indexing_s") or 0.0)
    cached = " (extraction cached)" if info.get("extraction", {}).get("from_cache") else ""
    return f"{total / n:.1f}{cached}"


def system_rows(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for run in runs:
        s = run.summary
        a, c5 = _row(s, "overall 1-4"), _row(s, "5")
        info = run.info
        size = store_bytes(run)
        mems = (info.get("system") or {}).get("memories", (info.get("extraction") or {}).get("memories"))
        rows.append({
            "run": run.config.name, "system": (info.get("system") or {}).get("name", "memlab"),
            "F1 1-4 [95 % CI]": f"{a['f1']:.3f} [{a['f1_lo']:.3f}, {a['f1_hi']:.3f}]", "n 1-4": int(a["n"]),
            "R@10 1-4": f"{a['recall@10']:.3f}", "R@10 cat 5": f"{c5['recall@10']:.3f}", "n 5": int(c5["n"]),
            "ingest s/conv": ingest_per_conversation(run),
            "latency p50 ms": f"{1000 * _row(s, 'overall 1-5')['latency_p50_s']:.1f}",
            "memories": mems, "store MB": f"{size / 1e6:.2f}" if size is not None else "n/a"})
    return pd.DataFrame(rows)


def f1_by_category(runs: list[Run]) -> pd.DataFrame:
    """F1 with its 95 % interval and n per category 1-4 and overall, one column per run."""
    groups = ["1", "2", "3", "4", "overall 1-4"]
    table = {}
    for run in runs:
        rows = [_row(run.summary, g) for g in groups]
        table[run.config.name] = [f"{r['f1']:.3f} [{r['f1_lo']:.3f}, {r['f1_hi']:.3f}] n={int(r['n'])}" for r in rows]
    return pd.DataFrame(table, index=[f"{g} {_row(runs[0].summary, g)['label'] or ''}".strip() for g in groups]
                        ).rename_axis("category").reset_index()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run folders")
    ap.add_argument("--results", type=Path, help="with --configs: take each config's newest complete run here")
    ap.add_argument("--configs", default="mem0-offline,offline,retrieval-best")
    ap.add_argument("--baseline", default="offline", help="config name of the paired comparison's baseline A")
    ap.add_argument("--md", action="store_true", help="markdown tables (for docs/benchmarks/systems.md)")
    args = ap.parse_args(argv)
    dirs = [Path(r) for r in args.runs] or (latest_runs(args.results, args.configs.split(",")) if args.results
                                            else ap.error("give run folders or --results"))
    runs = [load_run(d) for d in dirs]
    names = [r.config.name for r in runs]
    if args.baseline not in names:
        raise SystemExit(f"--baseline {args.baseline!r} is none of the runs' configs: {names}")
    show = (lambda t: markdown_table(t.astype(str))) if args.md else (lambda t: t.to_string(index=False))
    print(show(system_rows(runs)))
    print()
    print(show(f1_by_category(runs)))
    base = runs[names.index(args.baseline)]
    others = [r for r in runs if r is not base]
    if not others:
        return
    for other in others:  # each pair its own Holm family: the docs ask one question per pair
        cmp = memlab.compare(base, other, metrics=("f1", "recall@10"), names=[base.config.name, other.config.name])
        t = cmp.table
        t = t[t["group"].astype(str).isin(["1", "2", "3", "4", "5", "overall 1-4"])]
        cols = ["run", "group", "metric", "n", "a", "b", "delta", "lo", "hi", "p_perm_holm", "p_mcnemar_holm", "wins",
                "losses", "ties"]
        print(f"\nPaired, every delta is {cmp.direction(other.config.name)} (A = {args.baseline}):\n")
        print(show(t[[c for c in cols if c in t.columns]].round(3)))
        print("\n".join(cmp.legend()))
    print(f"\nrun folders: {', '.join(str(d) for d in dirs)}", file=sys.stderr)


if __name__ == "__main__":
    main()
