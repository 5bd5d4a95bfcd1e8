"""A report table (`memlab.run.report.report_table`) and its comparison for reading: ``value [lo, hi]`` strings,
then text, Markdown, LaTeX (booktabs) or CSV, written to a file whose suffix names the format."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.eval.stats import Comparison, format_p
from memlab.run.labels import category_name, legend_lines

#: Metrics that count answer-model calls or their tokens: shown as "-" for a run that made no such call.
MODEL_ONLY = ("answer_tokens_qa", "prompt_tokens_qa", "completion_tokens_qa", "cached_tokens_qa", "calls_qa")
HEADERS = {"f1": "F1", "bleu1": "BLEU-1", "em": "EM", "j": "J",
           "j_strict": "J (strict yes/no rule)", "j_official": "J (official rule: reply contains yes)",
           "answer_tokens_qa": "answer tokens/QA",
           "prompt_tokens_qa": "prompt tokens/QA", "context_tokens_qa": "context tokens/QA", "calls_qa": "Calls/QA",
           "latency_p50_s": "latency p50 (s)",
           "latency_p95_s": "latency p95 (s)", "context_recall": "context recall", "answer_ceiling": "answer ceiling",
           "answer_bearing": "answer-bearing"}
TOKEN_NOTE = ("prompt tokens: sent to the answer model (provider counts); context tokens: the retrieved context "
              "placed before the reader, counted offline (o200k), for every arm.")


#: Columns of words (left-aligned in Markdown and LaTeX): the run and category names, the run legend's.
TEXT_COLUMNS = ("run", "category", "name", "folder", "differs")


class ReportError(ValueError):
    """Nothing to report (every run given was unfinished), or a bad report option."""


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


def markdown_table(df: pd.DataFrame) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|")

    right = [c not in TEXT_COLUMNS for c in df.columns]
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
    spec = "".join("r" if c not in TEXT_COLUMNS else "l" for c in df.columns)
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
    legend = pd.DataFrame(table.attrs["legend"]) if len(table.attrs.get("legend") or ()) > 1 else None
    if fmt == "text":
        out = df.to_string(index=False) + "\n\n" + "\n".join(notes)
        if legend is not None:
            out += "\n\nRuns (label: folder (config values that differ between the runs)):\n" + "\n".join(
                legend_lines(legend))
    elif fmt == "md":
        out = markdown_table(df) + "\n\n" + "\n".join(f"_{n}_" if i == 0 else n for i, n in enumerate(notes))
        if legend is not None:
            out += "\n\nRuns:\n\n" + markdown_table(legend)
    else:
        out = _latex(df, " ".join(notes))
        if legend is not None:
            out += "\n\n" + _latex(legend, "Runs: the config values that differ between the runs.")
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
        return out + "\n\n" + legend[0] + "\n\n" + markdown_table(cdf) + "\n\n" + "\n".join(legend[1:])
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
