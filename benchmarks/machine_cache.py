"""A second results root's cold ``retrieval-best`` run with the machine cache cold, then warm (issue 38).

Two fresh results roots, one fresh machine cache folder (``MEMLAB_CACHE_DIR``): root A pays minilm's and SPLADE's
encoding and fills the machine cache; root B is as cold as A (no ``.cache`` of its own: extraction, index fits
and answering all run again) but reads every model vector from the machine cache. Each run is its own
``memlab run`` process (model loading included), timed side by side, so the ratio is what a machine under
contention can report. Prints the wall times, each run's extraction/indexing/answering stage times, whether
the predictions are identical, and ``memlab cache info``.

    python benchmarks/machine_cache.py --conversations conv-26        # a cut (minutes)
    python benchmarks/machine_cache.py                                # all of LoCoMo-10 (~430 s cold alone)
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


def run(config: str, root: Path, cache: Path, sets: list[str]) -> tuple[float, Path]:
    env = {**os.environ, "MEMLAB_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "memlab", "run", config, "--results", str(root)]
    cmd += [a for s in sets for a in ("--set", s)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    (run_dir,) = [p for p in root.iterdir() if (p / "run.json").is_file()]
    return wall, run_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="retrieval-best")
    ap.add_argument("--conversations", help="comma-separated sample ids (a cut); default all")
    ap.add_argument("--set", action="append", default=[], help="further config overrides (KEY=VALUE)")
    ap.add_argument("--keep", help="keep the roots and the cache under this folder (default: a temporary one)")
    args = ap.parse_args()
    sets = list(args.set)
    if args.conversations:
        sets.append(f"dataset.conversations=[{args.conversations}]")
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="memlab-machine-cache-bench-"))
    cache = base / "machine-cache"
    rows = []
    for label in ("A: machine cache cold", "B: machine cache warm"):
        root = base / ("root-a" if label.startswith("A") else "root-b")
        wall, run_dir = run(args.config, root, cache, sets)
        info = json.loads((run_dir / "run.json").read_text())
        t = info.get("timings", {})
        rows.append((label, wall, t, run_dir))
        print(f"{label}: {wall:.1f} s wall ({', '.join(f'{k} {v:.1f}' for k, v in t.items() if isinstance(v, float))})",
              flush=True)
    import pandas as pd

    pa, pb = (pd.read_parquet(r[3] / "predictions.parquet")["prediction"] for r in rows)
    print(f"ratio warm/cold: {rows[1][1] / rows[0][1]:.2f} (saved {rows[0][1] - rows[1][1]:.1f} s); "
          f"predictions identical: {pa.equals(pb)} (n = {len(pa)})")
    info = subprocess.run([sys.executable, "-m", "memlab", "cache", "info", "--dir", str(cache)], capture_output=True,
                          text=True)
    print(info.stdout.strip() or info.stderr.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
