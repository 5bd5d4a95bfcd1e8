"""Estimate the offline run's wall time and peak memory on LongMemEval-S and -M from synthetic files.

    python benchmarks/longmemeval_scale.py [--s-questions 2 6] [--m-questions 1 2] [--workers 2 8 32]
    python benchmarks/longmemeval_scale.py --compare OLD_CHECKOUT --s-questions 6   # peak RSS, this vs OLD

No LongMemEval copy is reachable here, so the script writes LongMemEval-format files of the published shapes
(`memlab.data.longmemeval_synthetic.write_synthetic`: S about 50 sessions x 10 turns, ~115 k tokens per question;
M about 500 sessions per question), runs the `offline` config on a few questions of each as whole processes (fresh
results root each time; CPU seconds of the child, its peak RSS from run.json) and extrapolates linearly from two
sizes: per question = the difference of the two runs over the difference in questions; a full file (500
questions) = the smaller run + that slope x the rest. Questions are independent haystacks, so N Ray workers
divide the CPU time by N (start-up and scheduling ignored: a bound) and each worker holds one question's
haystack at a time (its peak = the one-question run's); the local run uses one core for its pipeline, so its
wall on 2 idle cores is about its CPU time. ``--compare`` runs the same file with another memlab checkout
(e.g. one before streaming) to show what the peak was.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memlab.data.longmemeval import PUBLISHED_TYPE_COUNTS  # noqa: E402
from memlab.data.longmemeval_synthetic import SYNTHETIC_SHAPES, write_synthetic  # noqa: E402


def run_offline(path: Path, results: Path, root: Path = ROOT) -> dict[str, float]:
    """The offline config as a whole process with ``root``'s memlab: wall s, CPU s, peak RSS MB, stage timings."""
    env = dict(os.environ, PYTHONPATH=str(root))
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = ("import resource, sys; from memlab.cli import main; rc = main(sys.argv[1:]); "
            "print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, "run", "offline", "--set", f"dataset.path={path}",
                          "--results", str(results)], env=env, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(out.stdout[-3000:] + out.stderr[-3000:])
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = next(int(x.split()[1]) for x in out.stdout.splitlines() if x.startswith("PEAK_KB"))
    run_dir = Path(next(line.split()[0] for line in out.stdout.splitlines() if line.startswith("/")))
    info = json.loads((run_dir / "run.json").read_text())
    return {"wall_s": wall, "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
            "peak_mb": peak / 1024.0, "resident": info.get("extraction", {}).get("max_resident_keys", -1),
            **{k: float(v) for k, v in info["timings"].items()}}


def _row(name: str, n: int, size: int, r: dict[str, float], who: str = "") -> str:
    res = "all" if r["resident"] < 0 else str(int(r["resident"]))
    return (f"{name + who:10s}{n:4d}{size / 1e6:8.1f}{r['wall_s']:9.1f}{r['cpu_s']:8.1f}{r['peak_mb']:9.0f}"
            f"{res:>6s}{r.get('extraction_s', float('nan')):10.1f}{r.get('answering_s', float('nan')):9.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s-questions", type=int, nargs="+", default=[2, 6])
    ap.add_argument("--m-questions", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 8, 32], help="N for the N-worker estimates")
    ap.add_argument("--full", type=int, default=sum(PUBLISHED_TYPE_COUNTS.values()), help="questions in a full file")
    ap.add_argument("--compare", type=Path, help="another memlab checkout: run its offline config on the same files")
    args = ap.parse_args(argv)
    print(f"{'file':10s}{'q':>4s}{'MB':>8s}{'wall s':>9s}{'cpu s':>8s}{'peak MB':>9s}{'keys':>6s}{'extract s':>10s}"
          f"{'answer s':>9s}")
    estimates = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in (("S", args.s_questions), ("M", args.m_questions)):
            rows = []
            for n in sizes:
                p = Path(tmp) / f"lme_{name}_{n}.json"
                size = write_synthetic(p, n, **SYNTHETIC_SHAPES[name])
                r = run_offline(p, Path(tmp) / f"res_{name}_{n}")
                rows.append((n, r))
                print(_row(name, n, size, r), flush=True)
                if args.compare is not None:
                    print(_row(name, n, size, run_offline(p, Path(tmp) / f"old_{name}_{n}", args.compare), " (old)"),
                          flush=True)
                p.unlink()
            if len(rows) < 2:
                continue
            (n1, a), (n2, b) = rows[0], rows[-1]
            per_cpu = (b["cpu_s"] - a["cpu_s"]) / (n2 - n1)
            per_mb = (b["peak_mb"] - a["peak_mb"]) / (n2 - n1)
            rest = args.full - n1
            cpu_h = (a["cpu_s"] + per_cpu * rest) / 3600
            workers = ", ".join(f"{w} workers ~{per_cpu * args.full / w / 3600:.2f} h" for w in args.workers)
            estimates.append(f"{name}: {per_cpu:.1f} CPU-s and {per_mb:+.1f} MB peak per question; {args.full} "
                             f"questions: ~{cpu_h:.2f} CPU-h (local, 2 idle cores: ~{cpu_h:.2f} h wall), peak "
                             f"~{a['peak_mb'] + per_mb * rest:,.0f} MB; Ray: {workers}, each worker's peak ~"
                             f"{a['peak_mb']:,.0f} MB (at most the {n1}-question run's)")
    print("\n".join(estimates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
