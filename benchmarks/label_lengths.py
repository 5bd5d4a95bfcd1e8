"""Run labels before and after, on the sets of runs reports compare: their text and length.

    python benchmarks/label_lengths.py [--before-ref main]

Each set is a list of run folders holding the ``config.yaml`` a run of a shipped config with the given overrides
writes (what `memlab.run.labels.run_labels` reads). "before" is ``run_labels`` of a git ref (``--before-ref``, its
``memlab`` package extracted with ``git archive``), "after" this checkout's; each runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_html_time import REPO, extract_ref  # noqa: E402  (the same git-archive of the before ref)

SETS = {
    "systems (notebook 07)": [("offline", "offline", {}), ("retrieval-best", "retrieval-best", {}),
                              ("mem0-offline", "mem0-offline", {})],
    "two arms (notebook 06)": [("a", "offline", {}), ("b", "offline", {
        "name": "offline-observations", "extraction.name": "observations"})],
    "top-k grid": [(f"k{k}", "topk-ablation", {"retrieval.top_k": k, "name": f"topk-top_k{k}"})
                   for k in (5, 10, 20, 40)],
    "one name, two systems (--set name)": [("a", "offline", {"retrieval.top_k": 20}),
                                           ("b", "retrieval-best", {"name": "offline"})],
    "seeds": [(f"s{s}", "offline", {"run.seed": s}) for s in (0, 1, 2)],
    "reruns": [(f"offline-2026120{i}-093000", "offline", {}) for i in (1, 2)],
}
LABELS = """
import json, sys, tempfile, yaml
from pathlib import Path
from types import SimpleNamespace
from memlab.run import ExperimentConfig
from memlab.run.labels import run_labels
out = {}
for name, runs in json.loads(sys.argv[1]).items():
    root = Path(tempfile.mkdtemp())
    objs = []
    for d, config, over in runs:
        cfg = ExperimentConfig.from_yaml(config)
        cfg = cfg.with_overrides(over) if over else cfg
        (root / d).mkdir()
        (root / d / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
        objs.append(SimpleNamespace(run_dir=root / d, config=cfg))
    out[name] = run_labels(objs)
print(json.dumps(out))
"""


def labels(tree: Path) -> dict[str, list[str]]:
    res = subprocess.run([sys.executable, "-c", LABELS, json.dumps(SETS)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    if res.returncode:
        raise SystemExit(f"labels with {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-ref", default="main")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = labels(extract_ref(args.before_ref, Path(tmp) / "before"))
    after = labels(REPO)
    longest = {"before": 0, "after": 0}
    for name in SETS:
        print(f"== {name}")
        for b, a in zip(before[name], after[name]):
            print(f"  before ({len(b):>3} chars): {b}\n  after  ({len(a):>3} chars): {a}")
        longest = {"before": max(longest["before"], *map(len, before[name])),
                   "after": max(longest["after"], *map(len, after[name]))}
    print(f"longest label: before {longest['before']} characters, after {longest['after']}")


if __name__ == "__main__":
    main()
