"""LongMemEval end to end on a synthetic file: an offline run, a scripted-judge run, and five malformed items.

    python benchmarks/longmemeval_demo.py [--questions 36] [--sessions 8]

No LongMemEval copy is reachable here, so the file is synthetic (`memlab.data.longmemeval_synthetic.write_synthetic`:
every published type, abstention questions, one evidence turn per answerable question). The offline run is
`memlab run offline --set dataset.path=FILE`; the judge run adds ``judge.model`` on a scripted OpenAI-compatible
server on 127.0.0.1 (`memlab.testing.ScriptedServer`) that says "yes" when the gold answer (reference, rubric
or abstention explanation, whichever the type's prompt gives) appears in the response and "no" otherwise: the
official per-type prompts and the strict yes/no parsing are exercised over real HTTP, the verdicts are not a
model's. Each run prints `memlab.eval.longmemeval_tables.report`: accuracy per type with
95 % intervals and the official session/turn recall_all@k and ndcg_any@k. Then five malformed copies of the
file, each refused by `memlab data info` with the error printed.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memlab.data.longmemeval_synthetic import write_synthetic  # noqa: E402
from memlab.eval.longmemeval_tables import format_table, report  # noqa: E402

MALFORMED = {
    "an unknown question type": lambda it: it[1].update(question_type="single-hop"),
    "a date missing for a session": lambda it: it[2]["haystack_dates"].pop(),
    "a system message in a session": lambda it: it[3]["haystack_sessions"][1][1].update(role="system"),
    "an answer session outside the haystack": lambda it: it[4].update(answer_session_ids=["nowhere"]),
    "has_answer not a boolean": lambda it: it[5]["haystack_sessions"][0][0].update(has_answer="yes"),
}


def show(run_dir: Path) -> None:
    tables = report(run_dir)
    print(format_table(tables["accuracy"]))
    print(format_table(tables["retrieval"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=36)
    ap.add_argument("--sessions", type=int, default=8)
    args = ap.parse_args(argv)
    from memlab.run import ExperimentConfig, run_experiment
    from memlab.testing import Reply, ScriptedServer

    warnings.simplefilter("ignore", UserWarning)  # the profile chosen for the file and the offline-metric notes
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lme_synthetic.json"
        write_synthetic(path, args.questions, args.sessions, turns=6, words=20)
        print(f"$ memlab run offline --set dataset.path={path.name}   ({args.questions} questions x "
              f"{args.sessions} sessions x 6 turns)")
        cfg = ExperimentConfig.from_yaml("offline").with_overrides({"dataset.path": str(path)})
        run = run_experiment(cfg, results=Path(tmp) / "res", progress=False)
        show(run.run_dir)

        def judge(body: dict) -> Reply:
            prompt = body["messages"][0]["content"]
            gold = re.search(r"^(?:Reference answer(?: \(the updated value\))?|Rubric|Explanation): (.*)$", prompt,
                             re.M)
            said = re.search(r"^Assistant's response: (.*)$", prompt, re.M)
            ok = gold and said and gold.group(1).strip().lower() in said.group(1).lower()
            return Reply(text="yes" if ok else "no")

        with ScriptedServer(responder=judge) as srv:
            print(f"\n$ memlab run offline --set dataset.path={path.name} --set judge.model=openai/scripted-judge "
                  f"--set models.api_base=<scripted server>")
            jcfg = cfg.with_overrides({"judge.model": "openai/scripted-judge", "models.api_base": srv.api_base,
                                       "models.max_retries": 0})
            jrun = run_experiment(jcfg, results=Path(tmp) / "res", progress=False)
            print(f"judge calls: {len(srv.requests)}; judge errors: {jrun.info['judge_errors']}")
        show(jrun.run_dir)
        items = json.loads(path.read_text())
        for what, mutate in MALFORMED.items():
            bad = copy.deepcopy(items)
            mutate(bad)
            p = Path(tmp) / "bad.json"
            p.write_text(json.dumps(bad))
            out = subprocess.run([sys.executable, "-m", "memlab", "data", "info", str(p)], capture_output=True,
                                 text=True, cwd=ROOT)
            err = (out.stderr.strip().splitlines() or ["(no error)"])[-1].replace(tmp, "$TMP")
            print(f"\n{what}: memlab data info exits {out.returncode}\n  {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
