"""Estimate the offline run's wall time and peak memory on LongMemEval-S and -M from synthetic files.

    python benchmarks/longmemeval_scale.py [--s-questions 2 4] [--m-questions 1 2] [--workers 8]

No LongMemEval copy is reachable here, so the script writes LongMemEval-format files of the published
shapes (S: about 50 sessions and 115 k tokens of history per question; M: about 500 sessions per
question; 500 questions each, every type and 30 abstention ones in the full files), runs the `offline`
config on a small number of questions of each as whole processes (fresh results root each time), and
extrapolates linearly from two sizes: per-question time and memory = the difference between the two
runs over the difference in questions; the full file = the smaller run + that slope x the rest.
The N-worker figure divides the per-question time by N (questions are independent haystacks), an
ideal that ignores start-up and scheduling: a bound, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memlab.data.longmemeval import PUBLISHED_TYPE_COUNTS, QUESTION_TYPES  # noqa: E402

SHAPES = {"S": {"sessions": 50, "turns": 10, "words": 170}, "M": {"sessions": 500, "turns": 10, "words": 125}}
WORDS = ("garden trip recipe guitar budget marathon python novel coffee museum ticket flight dentist piano "
         "yoga laptop camera painting soccer birthday wedding hotel salary apartment puppy bicycle jacket "
         "concert library vaccine kayak pottery tennis cousin manager invoice sunset island market").split()


def make_item(i: int, shape: dict[str, int], rng: random.Random) -> dict:
    """One question of the given shape: filler sessions plus one evidence turn in one answer session."""
    qtype = QUESTION_TYPES[i % len(QUESTION_TYPES)]
    abstain = i % 17 == 0
    key = f"{rng.choice(WORDS)}-{i}"
    n_s, n_t, n_w = shape["sessions"], shape["turns"], shape["words"]
    ans_s = rng.randrange(n_s)
    sessions, dates, ids = [], [], []
    for s in range(n_s):
        turns = []
        for t in range(n_t):
            text = " ".join(rng.choice(WORDS) for _ in range(n_w))
            turn = {"role": "user" if t % 2 == 0 else "assistant", "content": text}
            if s == ans_s and t == 0 and not abstain:
                turn = {"role": "user", "content": f"My code word is {key}. {text}", "has_answer": True}
            turns.append(turn)
        sessions.append(turns)
        day = 1 + s // 24
        dates.append(f"2023/{1 + day // 28:02d}/{1 + day % 28:02d} (Mon) {s % 24:02d}:00")
        ids.append(f"q{i}_s{s}")
    return {"question_id": f"q{i}" + ("_abs" if abstain else ""), "question_type": qtype,
            "question": "What is my code word?", "answer": key if not abstain else "You never said a code word.",
            "question_date": "2024/12/31 (Tue) 12:00", "haystack_session_ids": ids, "haystack_dates": dates,
            "haystack_sessions": sessions, "answer_session_ids": [ids[ans_s]]}


def write_file(path: Path, n: int, shape: dict[str, int], seed: int = 0) -> int:
    """Stream ``n`` items into ``path`` (never the whole list in memory); returns the file size in bytes."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("[")
        for i in range(n):
            f.write(("," if i else "") + json.dumps(make_item(i, shape, rng)))
        f.write("]")
    return path.stat().st_size


def run_offline(path: Path, results: Path) -> dict[str, float]:
    """The offline config as a whole process: wall s, CPU s and peak RSS MB of that child alone."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = ("import resource, sys; from memlab.cli import main; rc = main(sys.argv[1:]); "
            "print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, "run", "offline", "--set", f"dataset.path={path}",
                          "--results", str(results)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(out.stdout[-3000:] + out.stderr[-3000:])
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = next(int(x.split()[1]) for x in out.stdout.splitlines() if x.startswith("PEAK_KB"))
    run_dir = Path(next(line.split()[0] for line in out.stdout.splitlines() if line.startswith("/")))
    timings = json.loads((run_dir / "run.json").read_text())["timings"]
    return {"wall_s": wall, "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
            "peak_mb": peak / 1024.0, **{k: float(v) for k, v in timings.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s-questions", type=int, nargs=2, default=[2, 4])
    ap.add_argument("--m-questions", type=int, nargs=2, default=[1, 2])
    ap.add_argument("--workers", type=int, default=8, help="N for the ideal N-worker estimate")
    ap.add_argument("--full", type=int, default=sum(PUBLISHED_TYPE_COUNTS.values()), help="questions in a full file")
    args = ap.parse_args(argv)
    print(f"{'file':6s}{'q':>4s}{'MB':>8s}{'wall s':>9s}{'cpu s':>8s}{'peak MB':>9s}{'extract s':>10s}"
          f"{'answer s':>9s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in (("S", args.s_questions), ("M", args.m_questions)):
            rows = []
            for n in sizes:
                p = Path(tmp) / f"lme_{name}_{n}.json"
                size = write_file(p, n, SHAPES[name])
                r = run_offline(p, Path(tmp) / f"res_{name}_{n}")
                rows.append((n, r))
                print(f"{name:6s}{n:4d}{size / 1e6:8.1f}{r['wall_s']:9.1f}{r['cpu_s']:8.1f}{r['peak_mb']:9.0f}"
                      f"{r.get('extraction_s', float('nan')):10.1f}{r.get('answering_s', float('nan')):9.1f}")
                p.unlink()
            (n1, a), (n2, b) = rows
            per_wall = (b["wall_s"] - a["wall_s"]) / (n2 - n1)
            per_cpu = (b["cpu_s"] - a["cpu_s"]) / (n2 - n1)
            per_mb = (b["peak_mb"] - a["peak_mb"]) / (n2 - n1)
            rest = args.full - n1
            print(f"  {name}: per question {per_wall:.2f} s wall, {per_cpu:.2f} s CPU, {per_mb:+.1f} MB peak; "
                  f"full {args.full} questions ~ {(a['wall_s'] + per_wall * rest) / 3600:.2f} h wall here, "
                  f"{(a['cpu_s'] + per_cpu * rest) / 3600:.2f} CPU-h, peak ~ {a['peak_mb'] + per_mb * rest:,.0f} MB; "
                  f"ideal {args.workers} workers ~ {per_cpu * args.full / args.workers / 3600:.2f} h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
