"""A run's results: scoring the prediction records, the per-category summary, what is written to
the run folder, and `load_run` reading it back with the types a fresh run has.

Errored questions are never scored: every metric is computed over the scored questions, and the
summary reports ``n`` (questions), ``n_scored`` and ``errors`` on every row.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from memlab.atomic import write_json, write_table
from memlab.eval import OVERALL_GROUPS, category_summary, evidence_recall, score_frame
from memlab.eval import cost as costs
from memlab.eval.profiles import RULE_J, get_profile
from memlab.eval.stats import judge_disagreements, judge_repeat_sd
from memlab.run.config import ExperimentConfig
from memlab.run.records import (  # noqa: F401  (RunFileError: re-exported, it was defined here)
    PredictionRecord,
    RecordSchemaError,
    RunFileError,
    RunInfo,
    read_frame,
    write_frame,
)

RECALL_KS = (1, 5, 10, 20)
#: Per-question reader-independent measures (`memlab.eval.ceiling`), summarised per category like F1.
CEILING_COLS = ("answer_ceiling", "answer_bearing")


@dataclass
class Run:
    """What a run returns to a notebook: DataFrames plus where everything was written."""

    run_dir: Path
    config: ExperimentConfig
    predictions: pd.DataFrame
    summary: pd.DataFrame
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def traces(self) -> dict[str, Path]:
        return {p.stem: p for p in sorted((self.run_dir / "traces").glob("*.jsonl"))}

    @property
    def status(self) -> str:
        return str(self.info.get("status", ""))

    def _repr_html_(self) -> str:
        return f"<b>{self.run_dir.name}</b> ({self.status})<br>" + self.summary._repr_html_()

    def __repr__(self) -> str:
        return f"Run({self.run_dir}, {self.status})\n{self.summary.to_string()}"


def _recall_at(first_query_ids: list[list[str]], evidence: list[str], k: int) -> float:
    ids = [s for h in first_query_ids[:k] for s in h]
    return evidence_recall(ids, evidence)


def score_records(records: list[PredictionRecord], top_k: int | None = None) -> pd.DataFrame:
    """One row per question with its scores; an errored question's scores are NaN (not 0), and so is
    Recall@k for k above the run's ``top_k`` (the reader never saw that deep)."""
    pred = pd.DataFrame([r.to_dict() for r in records])
    pred = score_frame(pred)
    pred["context_recall"] = [evidence_recall(r, e) for r, e in zip(pred.retrieved_ids, pred.evidence)]
    for k in RECALL_KS:
        pred[f"recall@{k}"] = [_recall_at(r.first_query_ids, r.evidence, k) if top_k is None or k <= top_k
                               else np.nan for r in records]
    pred["j"] = pd.to_numeric(pred["j"], errors="coerce")
    for c in CEILING_COLS:  # None (category 5, no memory read) becomes NaN: left out of means
        pred[c] = pd.to_numeric(pred[c], errors="coerce") if c in pred else np.nan
    errored = pred["error"].notna()
    score_cols = ["f1", "bleu1", "em", "evidence_recall", "context_recall", *[f"recall@{k}" for k in RECALL_KS],
                  *CEILING_COLS]
    pred.loc[errored, [c for c in score_cols if c in pred.columns]] = np.nan
    pred.loc[pred["judge_error"].notna() | errored, "j"] = np.nan
    return pred.drop(columns=["first_query_ids", "schema"])


def summarize(pred: pd.DataFrame, cfg: ExperimentConfig) -> pd.DataFrame:
    """Per-category table over the scored questions: F1, BLEU-1, EM, J, Recall@k, tokens, calls,
    latency p50/p95, with ``n``, ``n_scored`` and ``errors`` (and ``judge_errors``) on every row."""
    ok = pred["error"].isna()
    if "scored" in pred:  # errata-invalid questions and a scoring profile's excluded categories
        ok &= pred["scored"].astype(bool)
    scored = pred[ok]
    metrics = ["f1", "bleu1", "em"] + (["j"] if cfg.judge.model else [])
    metrics += [c for c in RULE_J if cfg.judge.model and c in scored and scored[c].notna().any()]
    metrics += [f"recall@{k}" for k in RECALL_KS if k <= cfg.retrieval.top_k] + ["context_recall"]
    metrics += [c for c in CEILING_COLS if c in scored and scored[c].notna().any()]
    summ = category_summary(scored, metrics=metrics, labels=get_profile(cfg.scoring.profile).labels,
                            seed=cfg.run.seed).rename(columns={"n": "n_scored"})
    if cfg.judge.model and "j_repeats" in scored.columns:
        summ = summ.join(judge_repeat_sd(scored))
    groups = [(str(int(c)), pred[pred.category == c]) for c in sorted(pred.category.unique())]
    groups += [(name, pred[pred.category.isin(cats)]) for name, cats in OVERALL_GROUPS.items()]
    extra = {}
    for name, g in groups:
        ok = g[g["error"].isna()]
        n = max(len(ok), 1)
        extra[name] = {
            "n": len(g), "errors": int(g["error"].notna().sum()),
            "judge_errors": int(g["judge_error"].notna().sum()),
            "prompt_tokens_qa": ok.prompt_tokens.sum() / n, "completion_tokens_qa": ok.completion_tokens.sum() / n,
            "cached_tokens_qa": ok.cached_tokens.sum() / n,
            "context_tokens_qa": ok.context_tokens.sum() / n, "calls_qa": ok.calls.sum() / n,
            "latency_p50_s": float(np.percentile(ok.latency_s, 50)) if len(ok) else np.nan,
            "latency_p95_s": float(np.percentile(ok.latency_s, 95)) if len(ok) else np.nan,
            **costs.cost_columns(ok),
        }
    extra_df = pd.DataFrame(extra).T
    summ = extra_df[["n"]].join(summ, how="left").join(extra_df.drop(columns=["n"]))
    summ.index.name = "group"
    for c in ("n", "n_scored", "errors", "judge_errors"):
        summ[c] = summ[c].fillna(0).astype(int)
    if summ["label"].isna().any():  # a category whose every question errored
        from memlab.data.locomo import CATEGORY_LABELS

        summ["label"] = [lab if isinstance(lab, str) else CATEGORY_LABELS.get(int(g), "") if g.isdigit() else ""
                         for g, lab in zip(summ.index, summ["label"])]
        summ["category"] = pd.array([int(g) if g.isdigit() else None for g in summ.index], dtype="Int64")
    cols = ["category", "label", "n", "n_scored", "errors"] + [c for c in summ.columns if c not in
                                                                ("category", "label", "n", "n_scored", "errors")]
    return summ[cols]


def add_costs(run_dir: Path, cfg: ExperimentConfig, pred: pd.DataFrame, questions_per_conversation: dict[str, int],
              expect_build: bool = False) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Memory-building and judge cost per question, and dollars (`memlab.eval.cost`); returns the frame
    and what run.json records (where each price came from, the run's build totals)."""
    p = run_dir / "traces" / "build_cost.jsonl"
    rows = [json.loads(x) for x in open(p, encoding="utf-8")] if p.is_file() else []
    build = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["conversation"])
    pred = costs.amortize(pred, build, questions_per_conversation, expect_build)
    roles = {"answer": "reader", "extract": "extractor", "embed": "embedder", "judge": "judge"}
    models = costs.Models(answer=cfg.answer.model, judge=cfg.judge.model,
                          api_bases={r: cfg.models.resolve(role)["api_base"] for r, role in roles.items()},
                          extract=cfg.extraction.model if cfg.role_in_use("extractor") else None,
                          embed=(cfg.index.embedder_model() or cfg.index.embedder.name) if len(build) else None)
    table = costs.PriceTable.of(cfg.cost.prices)
    pred, sources = costs.add_dollars(pred, models, table)
    info: dict[str, Any] = {"prices": sources,
                            "build": {c: float(build[c].sum()) for c in costs.BUILD_COLS if c in build}}
    unknown = costs.unknown_build(pred)
    if unknown:
        info["build_unknown"] = (f"{len(unknown)} conversation(s) have no build-cost record (an extraction cache "
                                 f"written before memlab saved build costs with its entries): their build columns "
                                 f"are NaN; delete the cache dir to re-extract: {unknown}")
    return pred, info


def write_results(run_dir: Path, pred: pd.DataFrame, summ: pd.DataFrame) -> None:
    write_frame(run_dir / "predictions", pred.set_index("qid"))
    write_frame(run_dir / "summary", summ)
    if pred["j"].notna().any():  # questions where F1 and J disagree: where the judge (or F1) deserves a look
        write_table(run_dir / "judge_disagreements.csv", judge_disagreements(pred))
    write_json(run_dir / "summary.json", json.loads(summ.to_json(orient="index")))


def _read_text(path: Path) -> str:
    """A run folder's file as text, never through a link nor from a device (`memlab.run.outputs.open_regular`)."""
    from memlab.run.outputs import open_regular

    with os.fdopen(open_regular(path.parent, path.name), "rb") as f:
        return f.read().decode("utf-8")


def read_run_json(path: Path) -> dict[str, Any]:
    """A run's ``run.json``, or a `RunFileError` naming the file."""
    try:
        d = json.loads(_read_text(path))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RunFileError(f"{path}: unreadable ({type(e).__name__}: {e}); expected the JSON object memlab writes "
                           f"(status, counts, timings)") from None
    if not isinstance(d, dict):
        raise RunFileError(f"{path}: expected a JSON object, got {type(d).__name__}")
    try:
        return RunInfo.from_dict(d, where=str(path)).to_dict()
    except RecordSchemaError as e:
        raise RunFileError(str(e)) from None


def read_config(path: Path) -> ExperimentConfig:
    """A run's ``config.yaml``, or a `RunFileError` (unreadable) / `ConfigError` (a bad value) naming it."""
    try:
        d = yaml.safe_load(_read_text(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise RunFileError(f"{path}: unreadable ({type(e).__name__}: {e}); expected the run's config as YAML") from None
    if not isinstance(d, dict):
        raise RunFileError(f"{path}: expected a mapping (the run's config), got {type(d).__name__}")
    return ExperimentConfig.from_dict(d, where=str(path), recorded=True)  # a run's own record: old spellings quietly


def _read_table(stem: Path) -> pd.DataFrame:
    from memlab.run.outputs import open_regular

    try:
        with os.fdopen(open_regular(stem.parent, stem.name + ".parquet"), "rb") as f:
            return read_frame(stem, f)
    except (FileNotFoundError, RunFileError):
        raise
    except Exception as e:  # pyarrow's errors for a cut or foreign file are of several kinds
        raise RunFileError(f"{stem.with_suffix('.parquet')}: unreadable ({type(e).__name__}: {e}); expected the "
                           f"Parquet table memlab writes (rerun, or resume the run after deleting it)") from None


def load_run(run_dir: str | Path) -> Run:
    """Reopen a finished run folder as a `Run` (tables from disk, the same types as a fresh run); a corrupt
    file, or one changed since the run completed (`memlab.run.outputs`), is a `RunFileError` naming it."""
    from memlab.run.outputs import verify_outputs

    d = Path(run_dir)
    if not (d / "config.yaml").is_file():
        raise FileNotFoundError(f"{d}: not a run folder (no config.yaml)")
    if not (d / "predictions.parquet").is_file():
        raise FileNotFoundError(f"{d}: the run did not finish (no predictions.parquet); "
                                f"finish it with: memlab run --resume {d}")
    cfg = read_config(d / "config.yaml")
    pred = _read_table(d / "predictions").reset_index()
    summ = _read_table(d / "summary")
    summ = summ.rename(columns={o: n for o, n in costs.RENAMED.items() if o in summ and n not in summ}) \
        .drop(columns=[o for o in costs.RENAMED if o in summ], errors="ignore")  # older runs' token names
    info = read_run_json(d / "run.json") if (d / "run.json").is_file() else {}
    verify_outputs(d, info.get("outputs"), ("config.yaml", "predictions.parquet", "summary.parquet"))
    return Run(run_dir=d, config=cfg, predictions=pred, summary=summ, info=info)
