"""The README demo: load and validate LoCoMo-10, print its statistics, score baselines, write a run folder."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from memlab.data import LoCoMo, load_locomo
from memlab.eval import ABSTAIN_PHRASES, category_summary, format_summary, score_frame
from memlab.rundir import environment, new_run_dir, write_json, write_table

ABSTAIN_ANSWER = "Not mentioned in the conversation."


def baseline_predictions(data: LoCoMo) -> dict[str, pd.DataFrame]:
    """Two reference points no memory system should lose to, and one it cannot beat by reading turns.

    - ``abstain``: always "Not mentioned ..." (scores 1 on adversarial, 0 elsewhere);
    - ``evidence-turn``: the raw text of the gold evidence turns (an oracle retriever with no reader),
      showing how far verbatim turns are from the short answers the metric rewards.
    """
    qf = data.questions_frame()
    abstain = qf.assign(prediction=ABSTAIN_ANSWER)
    texts = []
    for q in data.questions:
        conv = data[q.conversation_id]
        texts.append(", ".join(conv.turn(e).text for e in q.evidence_ids) if q.evidence_ids else "")
    oracle = qf.assign(prediction=texts)
    return {"abstain": abstain, "evidence-turn": oracle}


def run_demo(path: str | None = None, results: str | None = None) -> Path:
    assert ABSTAIN_PHRASES[1] in ABSTAIN_ANSWER.lower()
    t0 = time.perf_counter()
    data = load_locomo(path)
    print(f"LoCoMo: {data.report.path}")
    print("counts:", ", ".join(f"{k} {v:,}" for k, v in data.counts().items()))
    print("load report:", data.report.summary())
    stats = data.stats()
    print("\nquestions per category\n" + stats.to_string())
    run_dir = new_run_dir("demo", results)
    write_table(run_dir / "dataset_stats.csv", stats)
    tables = []
    for name, preds in baseline_predictions(data).items():
        scores = score_frame(preds)
        write_table(run_dir / f"scores_{name}.csv", scores.set_index("qid"))
        summ = category_summary(scores)
        write_table(run_dir / f"summary_{name}.csv", summ)
        tables.append(summ[["label", "n", "f1"]].rename(columns={"f1": f"F1 {name}"}))
    table = tables[0].join([t.drop(columns=["label", "n"]) for t in tables[1:]])
    print("\nper-category F1 (official LoCoMo metric)\n" + format_summary(table))
    write_json(run_dir / "environment.json", environment())
    write_json(
        run_dir / "run.json",
        {"kind": "demo", "dataset": data.report.path, "counts": data.counts(),
         "wall_s": round(time.perf_counter() - t0, 3)},
    )
    print(f"\nwrote {run_dir}  ({time.perf_counter() - t0:.1f} s)")
    return run_dir
