"""Reports over finished runs (``memlab report``): one tidy row per run x category, ready for a paper.

- `load_runs`: reopen run folders, skipping unfinished ones with a warning that says how to finish them;
- `run_labels`: short labels — the run's name plus at most two config values that tell it apart from the others
  (the runs' ``config.yaml`` files are diffed); `run_legend` maps each to the runs' full difference;
- `report_table` (``memlab.report``): the long table — run, category (number, label), n, each metric with its
  95 % interval (``<metric>_lo`` / ``<metric>_hi``), errors, and whether the run called an answer model;
- `report_comparison`: every run against the first with `memlab.compare`, labelled like the table;
- `format_report`: that table (and the comparison, each delta signed "run − A") as text, Markdown, LaTeX
  (booktabs) or CSV.

Runs keep the order the user gave everywhere (table rows, comparisons, HTML): the first run is the baseline A
of every delta, so a report and ``memlab compare`` over the same runs show the same signs.

Token columns mean one thing each: ``prompt_tokens_qa`` were sent to a model (0 for the offline reader,
shown as ``-``), ``context_tokens_qa`` is the retrieved context placed before the reader (every arm,
counted offline with o200k); a column with nothing to show for any run is left out of the printed table.
Intervals come from the run's summary when it has them, otherwise they are computed here from the
per-question scores with the same clustered bootstrap (`memlab.eval.stats.ci_columns`).

Run labels and category names: `memlab.run.labels`; the text, Markdown, LaTeX and CSV forms:
`memlab.run.report_format` (both re-exported here).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memlab.eval.profiles import RULE_J
from memlab.eval.stats import N_BOOT, Comparison, ComparisonError, ci_columns
from memlab.run.labels import (
    IGNORED_KEYS,
    KEY_ALIASES,
    category_name,
    distinguishing,
    legend_lines,
    run_labels,
    run_legend,
)
from memlab.run.outputs import verify_outputs
from memlab.run.report_format import (
    HEADERS,
    MODEL_ONLY,
    TOKEN_NOTE,
    ReportError,
    comparison_display,
    comparison_heading,
    display_frame,
    format_report,
    format_wide,
    latex_escape,
    write_report,
)
from memlab.run.results import Run, load_run

__all__ = ["CORRECT_F1", "DEFAULT_METRICS", "HEADERS", "IGNORED_KEYS", "KEY_ALIASES", "MODEL_ONLY", "NO_CI",
           "PER_QUESTION", "TOKEN_NOTE", "ReportError", "category_name", "ci_frame", "comparison_display",
           "comparison_heading", "correct", "display_frame", "distinguishing", "format_report", "format_wide",
           "latex_escape", "legend_lines", "load_runs", "report_comparison", "report_table", "run_labels",
           "run_legend", "unfinished_reason",
           "write_report"]

DEFAULT_METRICS = ("f1", "bleu1", "j", "recall@10", "prompt_tokens_qa", "context_tokens_qa", "calls_qa",
                   "latency_p50_s")
#: Per-question columns whose mean is a summary metric (so an interval can be bootstrapped from them).
PER_QUESTION = {"answer_tokens_qa": ("prompt_tokens", "completion_tokens"), "prompt_tokens_qa": ("prompt_tokens",),
                "context_tokens_qa": ("context_tokens",), "calls_qa": ("calls",)}
#: Metrics shown without an interval: percentiles of wall time (noisy by nature; no mean to resample).
NO_CI = ("latency_p50_s", "latency_p95_s", "errors")


# ---------------------------------------------------------------------------------- runs
def unfinished_reason(run_dir: Path) -> str | None:
    """Why a run folder cannot be reported yet (None when it is finished)."""
    if not (run_dir / "predictions.parquet").is_file():
        return "did not finish (no predictions.parquet)"
    info = run_dir / "run.json"
    if info.is_file():
        from memlab.run.results import read_run_json  # a corrupt run.json is an error naming it

        status = read_run_json(info).get("status")
        if status not in (None, "complete", "complete-with-errors"):
            return f"is {status!r} (run.json)"
    return None


def load_runs(runs: Iterable[Run | str | Path], warn: bool = True) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Finished runs (reopened from disk where a path is given) and the skipped (path, reason) pairs.

    A path that is not a run folder at all is an error (a typo should not pass as 'unfinished'), and so is a file
    changed since its run completed (`memlab.run.outputs`).
    """
    done: list[Run] = []
    skipped: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for r in runs:
        key = Path(r.run_dir if isinstance(r, Run) else r).resolve()
        if key in seen:  # a folder given twice (a shell glob and a name) is reported once
            continue
        seen.add(key)
        if isinstance(r, Run):
            done.append(r)
            continue
        d = Path(r)
        if not (d / "config.yaml").is_file():
            raise FileNotFoundError(f"{d}: not a run folder (no config.yaml)")
        why = unfinished_reason(d)
        if why is not None:
            skipped.append((d, why))
            if warn:
                warnings.warn(f"{d}: skipped, the run {why}; finish it with: memlab run --resume {d}", stacklevel=2)
            continue
        run = load_run(d)
        verify_outputs(d, run.info.get("outputs"))  # traces too: the HTML page shows them as the run's
        done.append(run)
    return done, skipped


# ---------------------------------------------------------------------------------- table
def _own_labels(run: Run, summary: pd.DataFrame) -> list[str | None]:
    """The summary's labels for a run on another benchmark than LoCoMo (LongMemEval's types); None (LoCoMo's
    labels, as before) for a LoCoMo run under any profile."""
    from memlab.eval.profiles import get_profile

    if get_profile(run.config.scoring.profile).dataset == "locomo" or "label" not in summary.columns:
        return [None] * len(summary)
    return list(summary["label"])


def _per_question(pred: pd.DataFrame, metric: str) -> pd.Series | None:
    if metric in pred.columns:
        return pd.to_numeric(pred[metric], errors="coerce")
    cols = PER_QUESTION.get(metric)
    if cols and all(c in pred.columns for c in cols):
        return sum(pd.to_numeric(pred[c], errors="coerce").fillna(0) for c in cols)
    return None


def ci_frame(run: Run, metrics: Sequence[str], n_boot: int = N_BOOT) -> pd.DataFrame:
    """``<metric>_lo`` / ``<metric>_hi`` per summary group: the summary's own where present, else bootstrapped
    from the per-question columns by `memlab.eval.stats.ci_columns` (seed ``run.seed`` of the config)."""
    s = run.summary
    pred = run.predictions
    seed = int(getattr(getattr(run.config, "run", None), "seed", 0) or 0)
    out = pd.DataFrame(index=s.index)
    missing: dict[str, pd.Series] = {}
    for m in metrics:
        if m in NO_CI:
            continue
        if f"{m}_lo" in s.columns and f"{m}_hi" in s.columns:
            out[f"{m}_lo"], out[f"{m}_hi"] = s[f"{m}_lo"], s[f"{m}_hi"]
            continue
        vals = _per_question(pred, m)
        if vals is not None and "conversation_id" in pred.columns:
            missing[m] = vals
    if missing:
        frame = pd.DataFrame({**missing, "category": pred["category"], "conversation_id": pred["conversation_id"]})
        ci = ci_columns(frame, list(missing), n_boot=n_boot, seed=seed, mdd_metrics=())
        ci = ci.reindex([str(g) for g in s.index]).set_axis(s.index)  # a summary on disk may key groups by int
        for m in missing:
            out[f"{m}_lo"], out[f"{m}_hi"] = ci[f"{m}_lo"], ci[f"{m}_hi"]
    return out[[c for m in dict.fromkeys(metrics) for c in (f"{m}_lo", f"{m}_hi") if c in out.columns]]


def _beyond_top_k(run: Run, metric: str) -> bool:
    if not metric.startswith("recall@"):
        return False
    try:
        return int(metric.split("@", 1)[1]) > int(run.config.retrieval.top_k)
    except (ValueError, AttributeError):
        return False


def report_table(runs: Sequence[Run | str | Path], metrics: Sequence[str] = DEFAULT_METRICS,
                 warn: bool = True, compare: bool = False, questions: str = "same") -> pd.DataFrame:
    """The long, tidy table: one row per (run, category), runs in the order given; unfinished runs are skipped
    with a warning.

    Columns: ``run`` (short label), ``group`` (1..5, ``overall 1-4``, ``overall 1-5``), ``category``
    (``1 multi-hop``), ``n``, then per metric the value and its ``_lo`` / ``_hi`` bounds, ``errors``,
    ``model_calls`` (whether the run called an answer model) and ``run_dir``. With ``j`` among the metrics, J under
    the profile's other verdict rule (``j_official`` or ``j_strict``, LongMemEval) is added where it differs.
    A metric a run lacks (J without a judge) is NaN, never a 0; each token column is what its name says (no
    substitution).
    With ``compare`` and two or more runs, ``attrs["comparison"]`` holds every run against the first
    (`report_comparison`; ``questions`` as in `memlab.compare`) and `format_report` prints it;
    ``attrs["legend"]`` maps each run label to the config values it changes (`run_legend`).
    """
    loaded, skipped = load_runs(runs, warn=warn)
    if not loaded:
        raise ReportError("nothing to report: " + "; ".join(f"{d} {why}" for d, why in skipped)
                          + (f" (finish a run with: memlab run --resume {skipped[0][0]})" if skipped else ""))
    labels = run_labels(loaded)
    if "j" in metrics:  # J under the other verdict rule (LongMemEval's official one), where it differs from J
        from memlab.eval.longmemeval_tables import differs_from_j

        metrics = [*metrics, *(c for c in RULE_J if c not in metrics
                               and any(differs_from_j(r.predictions, c) for r in loaded))]
    frames = []
    for run, label in zip(loaded, labels):
        s = run.summary
        ci = ci_frame(run, metrics)
        called = bool((pd.to_numeric(s.get("calls_qa", pd.Series(0.0, index=s.index)), errors="coerce")
                       .fillna(0) > 0).any())
        t = pd.DataFrame({"run": label, "group": list(s.index),
                          "category": [category_name(g, label=lab) for g, lab in
                                       zip(s.index, _own_labels(run, s))],
                          "n": s["n"].astype(int).to_numpy()})
        for m in metrics:
            col, src = m, s
            lo, hi = f"{m}_lo", f"{m}_hi"
            t[m] = pd.to_numeric(src[col], errors="coerce").to_numpy() if col in src.columns else np.nan
            if m not in NO_CI:
                t[lo] = ci[lo].to_numpy() if lo in ci.columns else np.nan
                t[hi] = ci[hi].to_numpy() if hi in ci.columns else np.nan
            if _beyond_top_k(run, m):  # Recall@20 of a top-10 run would silently equal Recall@10
                t[[c for c in (m, lo, hi) if c in t.columns]] = np.nan
        t["errors"] = s["errors"].astype(int).to_numpy() if "errors" in s.columns else 0
        t["model_calls"] = called
        t["run_dir"] = str(run.run_dir)
        frames.append(t)
    out = pd.concat(frames, ignore_index=True)
    out.attrs["skipped"] = [(str(d), why) for d, why in skipped]
    out.attrs["legend"] = run_legend(loaded).to_dict("records")  # records: pandas compares attrs when joining
    if compare and len(loaded) > 1:
        out.attrs["comparison"] = report_comparison(loaded, labels, questions)
    return out


CORRECT_F1 = 0.5


def correct(f1: Any) -> bool:
    """The correct/incorrect threshold the report's browser and flips use (F1 >= 0.5)."""
    try:
        return float(f1) >= CORRECT_F1
    except (TypeError, ValueError):
        return False


def report_comparison(runs: Sequence[Run], labels: Sequence[str], questions: str = "same") -> Comparison | str:
    """Every run against the first (A) with `memlab.compare`, labelled as in the report; where the runs cannot be
    compared, the reason (a report still shows each run's own table)."""
    from memlab.run.compare import compare

    try:
        return compare(*runs, questions=questions, threshold=CORRECT_F1, names=labels)
    except ComparisonError as e:
        return f"no paired comparison: {e}"
