"""Offline extraction of all LoCoMo-10 conversations into SQLite with the `observations` and `turns`
extractors, then a rerun over the same sessions (cursor state kept) that must add nothing.

    python benchmarks/extract_offline.py [--path locomo10.json] [--out /tmp/memlab-extract]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

from memlab.data import load_locomo
from memlab.extract.pipeline import extract_dataset
from memlab.index import open_service


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--path")
    ap.add_argument("--out", default="/tmp/memlab-extract")
    ap.add_argument("--extractors", default="observations,turns")
    args = ap.parse_args(argv)
    data = load_locomo(args.path)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pd.set_option("display.width", 200)
    for name in args.extractors.split(","):
        db = out / f"{name}.db"
        t0 = time.perf_counter()
        svc = open_service("sqlite", path=db)
        table, _ = extract_dataset(svc, data, name)
        svc.close()
        first = time.perf_counter() - t0
        svc = open_service("sqlite", path=db)  # a restart: store and index reloaded from disk
        again, _ = extract_dataset(svc, data, name)
        svc.close()
        table.loc["total"] = table.sum(numeric_only=True)
        print(f"\n=== extractor {name}: {first:.1f} s into {db} ===")
        print(table.to_string())
        print(f"rerun with the saved cursors: jobs_run {int(again.jobs_run.sum())}, ops_proposed "
              f"{int(again.ops_proposed.sum())}, memories added {int(again.memories_added.sum())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
