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
    top1 = run_experiment(cfg.with_overrides({"name": "baseline-top1", "answer.params.span": "memory",
                                              "answer.params.abstain": False}), results=results)
    qf = data.questions_frame()
    abstain = category_summary(score_frame(qf.assign(prediction=ABSTAIN)))
    arms = {cfg.name: run.summary, "top-1 memory": top1.summary, "always abstain": abstain}
    table = pd.DataFrame({"label": run.summary["label"], "n": run.summary["n"]})
    for name, summ in arms.items():  # F1 and its 95 % interval (clustered bootstrap), as `memlab report` shows it
        table[f"F1 {name}"], table[f"F1 {name} lo"], table[f"F1 {name} hi"] = summ["f1"], summ["f1_lo"], summ["f1_hi"]
    table[f"BLEU-1 {cfg.name}"] = run.summary["bleu1"]
    table["Recall@10"] = run.summary["recall@10"]
    table["context tokens/QA"] = run.summary["context_tokens_qa"]
    write_table(run.run_dir / "demo_comparison.csv", table)
    stats = data.stats()
    write_table(run.run_dir / "dataset_stats.csv", stats)
    t = run.info["timings"]
    print(f"\nper-category results (official LoCoMo F1; offline arm: {cfg.extraction.name} memories, "
          f"{cfg.index.embedder.name} + {cfg.index.keyword.name} hybrid RRF, top-{cfg.retrieval.top_k}, "
          "extractive reader)")
    print(format_summary(with_intervals(table, [f"F1 {name}" for name in arms])))
    print("F1 [lo, hi]: 95 % interval, bootstrap clustered by conversation; n: questions")
    print(f"\nstages: extraction {t['extraction_s']:.1f} s, indexing {t['indexing_s']:.1f} s, "
          f"answering {t['answering_s']:.1f} s, scoring {t['scoring_s']:.1f} s")
    print(f"wrote {run.run_dir} (and {top1.run_dir.name})  [{time.perf_counter() - t0:.1f} s]")
    return run.run_dir


def with_intervals(table: pd.DataFrame, columns: list[str], digits: int = 3) -> pd.DataFrame:
    """For printing: each of ``columns`` as ``value [lo, hi]`` (its ``<column> lo`` / ``hi`` dropped)."""
    out = table.copy()
    for c in columns:
        out[c] = [f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" if pd.notna(lo) and pd.notna(hi)
                  else f"{v:.{digits}f}" for v, lo, hi in zip(table[c], table[f"{c} lo"], table[f"{c} hi"])]
        out = out.drop(columns=[f"{c} lo", f"{c} hi"])
    return out
