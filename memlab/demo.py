"""The README demo: validate LoCoMo-10, print its statistics, run the offline arm and two baselines."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from memlab.answer import ABSTAIN
from memlab.atomic import write_table
from memlab.data import load_locomo
from memlab.eval import category_summary, format_summary, score_frame


def run_demo(path: str | None = None, results: str | None = None, config: str = "offline") -> Path:
    """Everything offline: the ``offline`` config (turns + observations, tfidf-lsa hybrid, extractive
    reader) against the top-1-memory and always-abstain baselines, per category."""
    from memlab.run import ExperimentConfig, run_experiment

    t0 = time.perf_counter()
    data = load_locomo(path)
    print(f"LoCoMo: {data.report.path}")
    print("counts:", ", ".join(f"{k} {v:,}" for k, v in data.counts().items()))
    print("load report:", data.report.summary())
    print("\nquestions per category\n" + data.stats().to_string())
    cfg = ExperimentConfig.from_yaml(config).with_overrides({"dataset.path": data.report.path})
    run = run_experiment(cfg, results=results)
    top1 = run_experiment(cfg.with_overrides({"name": "baseline-top1", "answer.span": "memory",
                                              "answer.abstain": False}), results=results)
    qf = data.questions_frame()
    abstain = category_summary(score_frame(qf.assign(prediction=ABSTAIN)))
    table = pd.DataFrame({
        "label": run.summary["label"], "n": run.summary["n"],
        f"F1 {cfg.name}": run.summary["f1"], "F1 top-1 memory": top1.summary["f1"], "F1 always abstain": abstain["f1"],
        f"BLEU-1 {cfg.name}": run.summary["bleu1"], "Recall@10": run.summary["recall@10"],
        "context tokens/QA": run.summary["context_tokens_qa"],
    })
    write_table(run.run_dir / "demo_comparison.csv", table)
    stats = data.stats()
    write_table(run.run_dir / "dataset_stats.csv", stats)
    t = run.info["timings"]
    print(f"\nper-category results (official LoCoMo F1; offline arm: {cfg.extraction.extractor} memories, "
          f"{cfg.index.embedder} + {cfg.index.keyword} hybrid RRF, top-{cfg.retrieval.top_k}, extractive reader)")
    print(format_summary(table))
    print(f"\nstages: extraction {t['extraction_s']:.1f} s, indexing {t['indexing_s']:.1f} s, "
          f"answering {t['answering_s']:.1f} s, scoring {t['scoring_s']:.1f} s")
    print(f"wrote {run.run_dir} (and {top1.run_dir.name})  [{time.perf_counter() - t0:.1f} s]")
    return run.run_dir
