"""Reports over finished runs (``memlab report``): one tidy row per run x category, ready for a paper.

- `load_runs`: reopen run folders, skipping unfinished ones with a warning that says how to finish them;
- `run_labels`: short labels — the run's name plus the config values that distinguish it from the others
  (the runs' ``config.yaml`` files are diffed);
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
per-question scores with the same clustered bootstrap (`memlab.eval.stats.cluster_bootstrap`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from memlab.data.locomo import CATEGORY_LABELS
from memlab.eval.stats import Comparison, ComparisonError, cluster_bootstrap, format_p, percentile_ci
from memlab.run.results import Run, load_run
from memlab.systems.base import read_by_system

DEFAULT_METRICS = ("f1", "bleu1", "j", "recall@10", "prompt_tokens_qa", "context_tokens_qa", "calls_qa",
                   "latency_p50_s")
#: Per-question columns whose mean is a summary metric (so an interval can be bootstrapped from them).
PER_QUESTION = {"answer_tokens_qa": ("prompt_tokens", "completion_tokens"), "prompt_tokens_qa": ("prompt_tokens",),
                "context_tokens_qa": ("context_tokens",), "calls_qa": ("calls",)}
#: Metrics that count answer-model calls or their tokens: shown as "-" for a run that made no such call.
MODEL_ONLY = ("answer_tokens_qa", "prompt_tokens_qa", "completion_tokens_qa", "cached_tokens_qa", "calls_qa")
#: Metrics shown without an interval: percentiles of wall time (noisy by nature; no mean to resample).
NO_CI = ("latency_p50_s", "latency_p95_s", "errors")
HEADERS = {"f1": "F1", "bleu1": "BLEU-1", "em": "EM", "j": "J", "answer_tokens_qa": "answer tokens/QA",
           "prompt_tokens_qa": "prompt tokens/QA", "context_tokens_qa": "context tokens/QA", "calls_qa": "Calls/QA",
           "latency_p50_s": "latency p50 (s)",
           "latency_p95_s": "latency p95 (s)", "context_recall": "context recall"}
#: Short names for swept keys in run labels.
KEY_ALIASES = {"retrieval.top_k": "k"}
#: Config keys that never change a result (names, how a run is driven): left out of run labels.
IGNORED_KEYS = ("name", "grid", "run.concurrency", "run.max_error_rate", "run.check_endpoint", "models.timeout",
                "models.max_retries")
TOKEN_NOTE = ("prompt tokens: sent to the answer model (provider counts); context tokens: the retrieved context "
              "placed before the reader, counted offline (o200k), for every arm.")
N_BOOT = 2000


class ReportError(ValueError):
    """Nothing to report (every run given was unfinished), or a bad report option."""


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

    A path that is not a run folder at all is an error (a typo should not pass as 'unfinished').
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
        done.append(load_run(d))
    return done, skipped


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_dict(run: Run) -> dict[str, Any]:
    p = run.run_dir / "config.yaml"
    d = yaml.safe_load(p.read_text(encoding="utf-8")) if p.is_file() else run.config.to_dict()
    return _flatten(d or {})


def distinguishing(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per run, the config values (dotted keys) that are not the same in every run (name and grid aside)."""
    flat = [_config_dict(r) for r in runs]
    keys = sorted({k for f in flat for k in f})
    # a value a run's memory system never reads (mem0 and memlab's extractor) tells nothing about that run
    systems = [str(f.get("system.name") or "memlab") for f in flat]
    differ = [k for k in keys if k not in IGNORED_KEYS and not k.startswith("grid.")
              and len({yaml.safe_dump(f.get(k)) for f, s in zip(flat, systems) if read_by_system(k, s)}) > 1]
    return [{k: f.get(k) for k in differ if read_by_system(k, s)} for f, s in zip(flat, systems)]


def _short_keys(keys: Iterable[str]) -> dict[str, str]:
    keys = list(keys)
    last = [k.split(".")[-1] for k in keys]
    return {k: KEY_ALIASES.get(k, s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _fmt_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ",".join(map(str, v)) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, str) and ("/" in v or "\\" in v):
        return Path(v).name
    return str(v)


def _base_name(run: Run, diff: dict[str, Any]) -> str:
    """The run's name without the suffixes an ablation grid appended (``topk-top_k5`` -> ``topk``)."""
    parts = run.config.name.split("-")
    suffixes = {f"{k.split('.')[-1]}{v}" for k, v in diff.items()}
    while len(parts) > 1 and parts[-1] in suffixes:
        parts.pop()
    return "-".join(parts)


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Short, unique labels: name plus ``key=value`` for each config value that differs between the runs."""
    diffs = distinguishing(runs)
    short = _short_keys(dict.fromkeys(k for d in diffs for k in d))
    labels = []
    for r, d in zip(runs, diffs):
        base = _base_name(r, d)
        parts = [f"{short[k]}={_fmt_value(v)}" for k, v in d.items()]
        labels.append(" ".join([base, ", ".join(parts)]) if parts else base)
    seen: dict[str, int] = {}
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
    if any(c > 1 for c in seen.values()):  # identical configs (reruns): the folder tells them apart
        labels = [f"{lab} [{r.run_dir.name}]" if seen[lab] > 1 else lab for lab, r in zip(labels, runs)]
    return labels


# ---------------------------------------------------------------------------------- table
def category_name(group: Any, n: int | None = None, label: str | None = None) -> str:
    """``1 multi-hop`` / ``overall 1-4``, with ``(n=…)`` when ``n`` is given; ``label``: the run's own label
    for the number (its summary's, e.g. LongMemEval's types), else LoCoMo's."""
    try:
        g = int(group)
        name = f"{g} {label if isinstance(label, str) and label else CATEGORY_LABELS.get(g, '')}".strip()
    except (TypeError, ValueError):
        name = str(group)
    return f"{name} (n={int(n):,})" if n is not None else name


def _own_labels(run: Run, summary: pd.DataFrame) -> list[str | None]:
    """The summary's labels for a run on another benchmark than LoCoMo (LongMemEval's types); None (LoCoMo's
    labels, as before) for a LoCoMo run under any profile."""
    from memlab.eval.profiles import get_profile

    if get_profile(run.config.scoring.profile).dataset == "locomo" or "label" not in summary.columns:
        return [None] * len(summary)
    return list(summary["label"])


def _group_key(g: Any) -> Any:
    try:
        return int(g)
    except (TypeError, ValueError):
        return g


def _per_question(pred: pd.DataFrame, metric: str) -> pd.Series | None:
    if metric in pred.columns:
        return pd.to_numeric(pred[metric], errors="coerce")
    cols = PER_QUESTION.get(metric)
    if cols and all(c in pred.columns for c in cols):
        return sum(pd.to_numeric(pred[c], errors="coerce").fillna(0) for c in cols)
    return None


def ci_frame(run: Run, metrics: Sequence[str], n_boot: int = N_BOOT) -> pd.DataFrame:
    """``<metric>_lo`` / ``<metric>_hi`` per summary group: the summary's own where present, else bootstrapped
    from the per-question columns (seed ``run.seed`` of the config)."""
    s = run.summary
    pred = run.predictions
    seed = int(getattr(getattr(run.config, "run", None), "seed", 0) or 0)
    out = pd.DataFrame(index=s.index)
    for m in metrics:
        if m in NO_CI:
            continue
        if f"{m}_lo" in s.columns and f"{m}_hi" in s.columns:
            out[f"{m}_lo"], out[f"{m}_hi"] = s[f"{m}_lo"], s[f"{m}_hi"]
            continue
        vals = _per_question(pred, m)
        if vals is None or "conversation_id" not in pred.columns:
            continue
        lo, hi = [], []
        for g in s.index:
            if isinstance(g, str) and g.startswith("overall"):
                cats = {"overall 1-4": (1, 2, 3, 4)}.get(g, (1, 2, 3, 4, 5))
                mask = pred.category.isin(cats)
            else:
                mask = pred.category == _group_key(g)
            boot = cluster_bootstrap(vals[mask].to_numpy(float), pred.conversation_id[mask].tolist(), n_boot, seed)
            b_lo, b_hi = percentile_ci(boot)
            lo.append(float(b_lo))
            hi.append(float(b_hi))
        out[f"{m}_lo"], out[f"{m}_hi"] = lo, hi
    return out


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
    ``model_calls`` (whether the run called an answer model) and ``run_dir``. A metric a run lacks (J
    without a judge) is NaN, never a 0; each token column is what its name says (no substitution).
    With ``compare`` and two or more runs, ``attrs["comparison"]`` holds every run against the first
    (`report_comparison`; ``questions`` as in `memlab.compare`) and `format_report` prints it.
    """
    loaded, skipped = load_runs(runs, warn=warn)
    if not loaded:
        raise ReportError("nothing to report: " + "; ".join(f"{d} {why}" for d, why in skipped)
                          + (f" (finish a run with: memlab run --resume {skipped[0][0]})" if skipped else ""))
    labels = run_labels(loaded)
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


# ---------------------------------------------------------------------------------- format
def _fmt_number(m: str, x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if m.endswith("tokens_qa"):
        return f"{x:,.0f}"
    if m == "calls_qa":
        return f"{x:.2f}"
    if m.startswith("latency"):
        return f"{x:.4f}"
    return f"{x:.3f}"


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """Strings for reading: ``value [lo, hi]`` per metric. A model-only metric (`MODEL_ONLY`) of a run that
    called no model reads ``-``; a column empty for every row (``n/a`` or ``-``: J without a judge, calls
    of offline runs only) is left out."""
    metrics = [c for c in table.columns if c not in ("run", "group", "category", "n", "errors", "tokens_source",
                                                     "model_calls", "run_dir") and not c.endswith(("_lo", "_hi"))]
    rows = []
    for _, r in table.iterrows():
        row = {"run": r["run"], "category": r["category"], "n": f"{int(r['n']):,}"}
        for m in metrics:
            if m in MODEL_ONLY and "model_calls" in table.columns and not r["model_calls"]:
                row[HEADERS.get(m, m)] = "-"
                continue
            v = _fmt_number(m, r[m])
            if f"{m}_lo" in table.columns and v != "n/a":
                lo, hi = r[f"{m}_lo"], r[f"{m}_hi"]
                if not (pd.isna(lo) or pd.isna(hi)):
                    v += f" [{_fmt_number(m, lo)}, {_fmt_number(m, hi)}]"
            row[HEADERS.get(m, m)] = v
        row["errors"] = f"{int(r['errors'])}"
        rows.append(row)
    df = pd.DataFrame(rows)
    empty = [c for c in df.columns if c not in ("run", "category", "n", "errors") and df[c].isin(("n/a", "-")).all()]
    return df.drop(columns=empty)


def comparison_display(cmp: Comparison) -> pd.DataFrame:
    """Strings for reading, one row per run x group x metric: the signed delta ``run − A`` with its interval,
    each p-value raw and Holm-adjusted, wins / losses / ties and the MDD (their meaning: `Comparison.legend`)."""
    def num(x: Any, fmt: str = "{:+.3f}") -> str:
        return "n/a" if x is None or pd.isna(x) else fmt.format(x)

    delta = f"{'B' if len(cmp.runs) == 1 else 'run'} \u2212 A [95 % CI]"
    rows = []
    for r in cmp.table.to_dict("records"):
        rows.append({"run": r["run"], "category": category_name(r["group"]), "metric": r["metric"], "n": r["n"],
                     delta: f"{num(r['delta'])} [{num(r['lo'])}, {num(r['hi'])}]",
                     "p_perm": format_p(r["p_perm"]), "p_perm (Holm)": format_p(r["p_perm_holm"]),
                     "p_mcnemar": format_p(r["p_mcnemar"]), "p_mcnemar (Holm)": format_p(r["p_mcnemar_holm"]),
                     "wins / losses / ties": f"{r['wins']} / {r['losses']} / {r['ties']}",
                     "mdd": num(r["mdd"], "{:.3f}")})
    return pd.DataFrame(rows)


def comparison_heading(cmp: Comparison) -> str:
    """Who is A and which way every delta points."""
    if len(cmp.runs) == 1:
        return (f"Paired differences, question by question: A = {cmp.baseline}, B = {cmp.runs[0]}; every delta is "
                "B \u2212 A (positive: B higher).")
    return (f"Paired differences, question by question: A = {cmp.baseline} (the first run); every delta is "
            "run \u2212 A (positive: the run higher).")


def _markdown(df: pd.DataFrame) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|")

    right = [c not in ("run", "category") for c in df.columns]
    lines = ["| " + " | ".join(cell(c) for c in df.columns) + " |",
             "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}", "\u2212": "$-$",
                  "\u2026": r"\ldots{}", "\u2265": r"$\geq$", "\u2264": r"$\leq$", "\u00d7": r"$\times$",
                  "\u2013": "--", "\u2014": "---", "\u00b1": r"$\pm$"}


def latex_escape(s: str) -> str:
    """Text as LaTeX reads it literally: every special character (and the few non-ASCII signs memlab's
    labels use) as its command, so a run named ``arm_1 & co`` neither breaks the table nor the build."""
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in str(s))


def _latex(df: pd.DataFrame, caption: str | None) -> str:
    """A booktabs table that fits the column: ``\\resizebox`` to ``\\linewidth`` (needs graphicx and booktabs)."""
    spec = "".join("r" if c not in ("run", "category") else "l" for c in df.columns)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", r"\resizebox{\linewidth}{!}{%",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(latex_escape(c) for c in df.columns) + r" \\", r"\midrule"]
    prev = None
    for row in df.itertuples(index=False):
        vals = list(row)
        if prev is not None and vals[0] != prev:
            lines.append(r"\midrule")
        show = [latex_escape(v) if i or vals[0] != prev else "" for i, v in enumerate(vals)]
        prev = vals[0]
        lines.append(" & ".join(show) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}"]
    if caption:
        lines.append(rf"\caption{{{latex_escape(caption)}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines)


def format_report(table: pd.DataFrame, fmt: str = "text") -> str:
    """The table as ``text``, ``md`` (Markdown), ``latex`` (booktabs) or ``csv`` (tidy numbers, all bounds)."""
    if fmt == "csv":
        return table.to_csv(index=False, float_format="%.6g")
    df = display_frame(table)
    notes = ["Values are means with 95 % clustered-bootstrap intervals [lo, hi] (conversations, then questions)."]
    if any(c.endswith("tokens_qa") for c in table.columns):
        notes.append(TOKEN_NOTE)
    for d, why in table.attrs.get("skipped", []):
        notes.append(f"skipped {d}: the run {why}")
    if fmt not in ("text", "md", "latex"):
        raise ReportError(f"--format {fmt!r}; expected one of: text, md, latex, csv")
    cmp = table.attrs.get("comparison")
    if fmt == "text":
        out = df.to_string(index=False) + "\n\n" + "\n".join(notes)
    elif fmt == "md":
        out = _markdown(df) + "\n\n" + "\n".join(f"_{n}_" if i == 0 else n for i, n in enumerate(notes))
    else:
        out = _latex(df, " ".join(notes))
    if isinstance(cmp, str):
        return out + "\n\n" + cmp
    if cmp is None:
        return out
    cdf, legend = comparison_display(cmp), [comparison_heading(cmp), *cmp.legend(), *cmp.notes]
    if len(cmp.runs) == 1:  # the heading names B
        cdf = cdf.drop(columns=["run"])
    if fmt == "text":
        return out + "\n\n" + legend[0] + "\n" + cdf.to_string(index=False) + "\n\n" + "\n".join(legend[1:])
    if fmt == "md":
        return out + "\n\n" + legend[0] + "\n\n" + _markdown(cdf) + "\n\n" + "\n".join(legend[1:])
    return out + "\n\n" + _latex(cdf, " ".join(legend))


def write_report(table: pd.DataFrame, out: str | Path, fmt: str | None = None) -> Path:
    """Write the report; the format follows ``fmt`` or the file suffix (.md, .tex, .csv, .txt)."""
    p = Path(out)
    fmt = fmt or {".md": "md", ".tex": "latex", ".csv": "csv"}.get(p.suffix.lower(), "text")
    p.parent.mkdir(parents=True, exist_ok=True)
    from memlab.atomic import write_text  # a full disk keeps the old file

    write_text(p, format_report(table, fmt) + "\n")
    return p


def format_wide(table: pd.DataFrame) -> str:
    """A wide table (one run under several scoring profiles, `memlab.run.rescore.profile_table`) as text."""
    return table.to_string(float_format=lambda x: f"{x:.3f}")
