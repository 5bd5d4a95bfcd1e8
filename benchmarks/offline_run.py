"""Time a config (default `offline`) over all of LoCoMo-10 as whole processes, cold and cached.

    python benchmarks/offline_run.py [--path locomo10.json]
    python benchmarks/offline_run.py --config retrieval-best --no-model-check   # minilm + SPLADE: minutes cold
    python benchmarks/offline_run.py --config retrieval-best --no-model-check \
        --set index.embedder.params.dtype=bfloat16 --set index.sparse.params.dtype=bfloat16   # both models in bf16

Cold: a fresh results root and a fresh machine cache (`memlab.index.machine_cache`: no model vector from an
earlier run; benchmarks/machine_cache.py times a second root with it warm): extraction with turns + observations
into SQLite, indexing, 1,986 retrievals, extractive answers, scoring, traces. Cached: the same config again
(extraction and index served from the cache: the store and each key's saved fit are read back, nothing is extracted
or fitted). Prints, per run: the process's wall time, CPU time (user + sys, what to trust on a shared
machine) and peak RSS (both from `wait4` on that process: all of it, through its last file), each stage's
wall seconds and share of the run's own total (from run.json; start-up, imports and dataset checks are the
difference between the process wall time and the stages' sum), and the cold run's overall F1 and Recall@10
(categories 1-4, 95% intervals): a ``--set`` variant's speed next to what it does to the figures. Targets
(issue 24), on 2 quiet cores: `offline` cold <= 15 s, peak <= 2 GB; `retrieval-best` cold <= 120 s, cached
<= 20 s, peak <= 1.2 GB.

Then a model-backed config (`original`, scripted OpenAI-compatible server on 127.0.0.1) is run
twice on conversation conv-26: the rerun must make 0 model calls (response cache).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_process(args: list[str], env: dict[str, str]) -> tuple[float, float, float, Path]:
    """(wall s, CPU s = user + sys, peak RSS MB, run folder) of one ``memlab run`` process, its CPU time and peak
    from ``wait4`` on that process alone: the whole process, through writing its last file (``run.json``'s
    per-stage peaks stop at scoring; RUSAGE_CHILDREN's maxrss is the largest child so far)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "memlab", "run", *args], env=env, stdout=out, stderr=err,
                                text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(stdout[-3000:] + stderr[-3000:])
    run_dir = Path(next(line.split()[0] for line in stdout.splitlines() if line.startswith("/")))
    return wall, usage.ru_utime + usage.ru_stime, maxrss_mb(usage.ru_maxrss), run_dir


def maxrss_mb(maxrss: int) -> float:
    """``ru_maxrss`` in MB (Linux counts kilobytes, macOS bytes)."""
    return maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)


def quality(run_dir: Path) -> str:
    """The run's overall F1 and Recall@10 over categories 1-4 with their n and 95% intervals (summary.csv)."""
    import pandas as pd

    s = pd.read_csv(run_dir / "summary.csv")
    row = s[s["group"].astype(str) == "overall 1-4"].iloc[0]
    return (f"overall 1-4 (n={int(row['n'])}): F1 {row['f1']:.4f} [{row['f1_lo']:.3f}, {row['f1_hi']:.3f}], "
            f"Recall@10 {row['recall@10']:.4f} [{row['recall@10_lo']:.3f}, {row['recall@10_hi']:.3f}]")


#: Issue 24's targets per config: (cold wall s, cached wall s or None, peak MB).
TARGETS = {"offline": (15.0, None, 2048.0), "retrieval-best": (120.0, 20.0, 1228.8)}


def met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="offline run benchmark")
    ap.add_argument("--path")
    ap.add_argument("--config", default="offline", help="a shipped config name or YAML file (default offline)")
    ap.add_argument("--no-model-check", action="store_true", help="skip the scripted model run and its rerun")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for both runs, as `memlab run --set` (repeatable)")
    args = ap.parse_args(argv)
    overrides = [a for kv in args.set for a in ("--set", kv)]
    cold_max, cached_max, peak_max = TARGETS.get(args.config, (float("nan"), None, float("nan")))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if args.path:
        env["MEMLAB_LOCOMO"] = str(Path(args.path).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        env["MEMLAB_CACHE_DIR"] = str(Path(tmp) / "machine-cache")  # cold: no model vector cached on this machine
        print(f"load average {os.getloadavg()[0]:.1f} (wall times stretch with it; CPU times much less)")
        print(f"{'run':10s}{'wall s':>9s}{'CPU s':>8s}{'peak RSS MB':>13s}   stages: wall s (share of the run's total)")
        for label in ("cold", "cached"):
            wall, cpu, peak, run_dir = run_process([args.config, *overrides, "--results", tmp], env)
            info = json.loads((run_dir / "run.json").read_text())
            t = info["timings"]
            stages = {k[:-2]: v for k, v in t.items() if k.endswith("_s") and k != "total_s"}
            shares = ", ".join(f"{k} {v:.1f} ({v / t['total_s']:.0%})" for k, v in stages.items())
            print(f"{label:10s}{wall:9.1f}{cpu:8.1f}{peak:13.0f}   {shares}; "
                  f"start-up and checks {wall - t['total_s']:.1f}")
            if label == "cold":
                print(f"{'':10s}targets: wall <= {cold_max:g} s (2 quiet cores) {met(wall <= cold_max)}, "
                      f"peak <= {peak_max:g} MB {met(peak <= peak_max)}")
                print(f"{'':10s}{quality(run_dir)}")
            else:
                print(f"{'':10s}cached: extraction from cache {info['extraction']['from_cache']}"
                      + (f"; targets: wall <= {cached_max:g} s {met(wall <= cached_max)}, peak <= {peak_max:g} MB "
                         f"{met(peak <= peak_max)}" if cached_max else ""))
        if args.no_model_check:
            return 0
        from memlab.testing import ScriptedServer
        from memlab.testing.models import scripted_model as responder

        with ScriptedServer(responder=responder) as srv:
            sets = ["--set", "dataset.conversations=[conv-26]", "--set", f"models.api_base={srv.api_base}",
                    "--set", "answer.model=openai/scripted", "--set", "index.embedder=tfidf-lsa",
                    "--set", "extraction.model=openai/scripted", "--results", tmp]
            for label in ("model run", "rerun"):
                n0 = len(srv.requests)
                wall, _, _, run_dir = run_process(["original", *sets], env)
                m = json.loads((run_dir / "run.json").read_text())["models"]
                print(f"{label:10s}{wall:9.1f}   server saw {len(srv.requests) - n0} requests; "
                      f"model calls {m['model_calls']}, served from cache {m['cache_hits']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
