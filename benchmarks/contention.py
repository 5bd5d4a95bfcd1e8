"""How runs share a machine: wall and CPU time of one run alone and of three started together, side by side.

    python benchmarks/contention.py [--configs retrieval-best offline] [--conversation conv-26] [--copies 3]
                                    [--threads N] [--path locomo10.json]

For each config, ``memlab run <config> --set dataset.conversations=[<conversation>]`` is started as a child
process from a new results folder (cold caches: every embedding and SPLADE vector is computed), first alone,
then ``--copies`` at once, each in its own folder. Wall time is the child's; CPU time is its user + system
time (``os.wait4``), so a pool spinning against the others shows as CPU spent for the same work. The targets
(issue 24): CPU per run <= 1.2x the lone run's, and the slowest of the copies <= ``copies``x its wall time
(a fair share of the cores). ``--threads`` passes ``run.threads`` (default: the run's own default).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start(config: str, conversation: str, results: Path, threads: int | None, path: str | None
          ) -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "-m", "memlab", "run", config, "--results", str(results),
           "--set", f"dataset.conversations=[{conversation}]"]
    if threads is not None:
        cmd += ["--set", f"run.threads={threads}"]
    if path:
        cmd += ["--set", f"dataset.path={path}"]
    # cold: a machine cache of the results folder's own (`memlab.index.machine_cache`), nothing encoded before
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEMLAB_CACHE_DIR": str(results / "machine-cache")}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True), time.perf_counter()


def wait_all(procs: list[tuple[subprocess.Popen, float]]) -> list[tuple[float, float]]:
    """(wall s, CPU s) per child, in start order; a child that failed stops the benchmark with its stderr."""
    out: dict[int, tuple[float, float]] = {}
    by_pid = {p.pid: (p, t0) for p, t0 in procs}
    while len(out) < len(procs):
        pid, status, usage = os.wait4(-1, 0)
        if pid not in by_pid:
            continue
        p, t0 = by_pid[pid]
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(p.args)} exited {p.returncode}:\n{p.stderr.read()[-2000:]}")
        out[pid] = (time.perf_counter() - t0, usage.ru_utime + usage.ru_stime)
    return [out[p.pid] for p, _ in procs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one run alone vs several started together")
    ap.add_argument("--configs", nargs="+", default=["retrieval-best", "offline"])
    ap.add_argument("--conversation", default="conv-26")
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--path", default=os.environ.get("MEMLAB_LOCOMO"))
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    print(f"machine: {len(os.sched_getaffinity(0))} cores available, load average {load:.1f} at start; "
          f"run.threads {args.threads if args.threads is not None else 'default'}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="memlab-contention-") as tmp:
        for config in args.configs:
            alone = wait_all([start(config, args.conversation, Path(tmp) / f"{config}-alone", args.threads,
                                    args.path)])[0]
            together = wait_all([start(config, args.conversation, Path(tmp) / f"{config}-{i}", args.threads,
                                       args.path) for i in range(args.copies)])
            rows.append((config, alone, together))
    head = (f"{'config':16s} {'alone wall':>10s} {'alone CPU':>9s} | {args.copies} together: "
            f"{'wall (each)':>22s} {'CPU (each)':>22s} {'max wall x':>10s} {'max CPU x':>9s}")
    print(head)
    for config, (w1, c1), together in rows:
        walls = " ".join(f"{w:6.1f}" for w, _ in together)
        cpus = " ".join(f"{c:6.1f}" for _, c in together)
        print(f"{config:16s} {w1:9.1f}s {c1:8.1f}s | {'':11s} {walls:>22s} {cpus:>22s} "
              f"{max(w for w, _ in together) / w1:9.2f}x {max(c for _, c in together) / c1:8.2f}x")
    print(f"targets: max CPU x <= 1.2, max wall x <= {args.copies}; load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
