"""One self-contained HTML page over finished runs (``memlab report --html OUT.html RUN [RUN ...]``).

The page needs no server and no network: plots are embedded as base64 PNG, the data as inline JSON, and
the script and style are inline. The data holds only what the page shows, packed (`memlab.report_data`:
`Tables`, column tables, one shared string table; about 3.8 MB for two full LoCoMo-10 offline runs, from 23 MB as
one nested record per question), and is escaped (`embed_json`) so that no question or model reply can end the
script block. Each run's traces are read once, for the attribution and the browser both, in a forked process per
run where there are cores (`run_pieces`).

It holds the runs table (each run's short label, folder and the config values the runs differ in:
`memlab.run.labels.run_legend`), the per-category table with 95 % intervals (with the answer ceiling and
answer-bearing of what retrieval delivered, `CEILING_METRICS`), the paired comparisons of every run against the first
(runs in the order given; each delta is run − A, the same numbers ``memlab compare`` prints, also in the page's
data as ``comparisons``), the plots (evidence recall for every run), and a question browser: filter by
category, failure label (`memlab.attribution`), correct / incorrect (F1 >= 0.5) and flipped between runs; click
a question to see, per run, its three trace layers (`memlab.trace`): the extractor ops that touched its
evidence memories, the retrieval ranks of every query, and the answer.
"""

from __future__ import annotations

import base64
import gc
import html
import io
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd

from memlab import attribution, plots, trace
from memlab.data import load_dataset
from memlab.eval.stats import Comparison
from memlab.report_data import (  # noqa: F401 (re-exported: the page's data is built there)
    ANSWER_FIELDS,
    HIT_FIELDS,
    OP_FIELDS,
    QuestionTraces,
    RunBrowser,
    Tables,
    embed_json,
    layers,
    pack_runs,
)
from memlab.run.forked import fork_map, fork_workers
from memlab.run.plan import PLAN_NOTE, plan_vs_actual
from memlab.run.report import (
    CORRECT_F1,
    DEFAULT_METRICS,
    TOKEN_NOTE,
    category_name,
    comparison_display,
    comparison_heading,
    display_frame,
    distinguishing,
    load_runs,
    report_comparison,
    report_table,
    run_labels,
    run_legend,
)
from memlab.run.runner import Run

ASSETS = Path(__file__).resolve().parent / "assets"


# ---------------------------------------------------------------------------------- pieces
def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _asset(name: str) -> str:
    """The page's inline style and script (kept as files so they read as CSS and JavaScript)."""
    return (ASSETS / name).read_text(encoding="utf-8").replace("</script", "<\\/script")


def _table_html(df: pd.DataFrame, cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>"
                   for r in df.itertuples(index=False))
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def comparison_data(cmp: Comparison) -> list[dict[str, Any]]:
    """The paired comparisons as page data: per run, its direction (``run − A``) and the signed rows."""
    cols = ["group", "metric", "n", "a", "b", "delta", "lo", "hi", "p_perm", "p_perm_holm", "p_mcnemar",
            "p_mcnemar_holm", "wins", "losses", "ties", "mdd"]
    return [{"run": name, "baseline": cmp.baseline, "direction": cmp.direction(name),
             "rows": cmp.table.loc[cmp.table["run"] == name, cols].to_dict("records")} for name in cmp.runs]


# ---------------------------------------------------------------------------------- traces
# ---------------------------------------------------------------------------------- page
#: What retrieval delivered to the reader, per category: shown beside the scores on every page.
CEILING_METRICS = ("answer_ceiling", "answer_bearing")
CEILING_NOTE = ("answer ceiling: the best official F1 any span of the supported lines could score (what a perfect "
                "reader of that context would get); answer-bearing: the share of questions whose gold is supported by "
                "the context: its content words in lines about the question (sharing its words, naming the person "
                "asked about, or an evidence turn or its same-session neighbour), each person or part supported "
                "(memlab.eval.ceiling; category 5 and arms that read no memory: n/a).")


def with_ceiling(runs: Sequence[Run], table: pd.DataFrame) -> pd.DataFrame:
    """The report table with the answer ceiling and answer-bearing columns (value and interval, from the runs'
    summaries) when it lacks them (``memlab report --metrics f1`` asked for F1 only)."""
    missing = [m for m in CEILING_METRICS if m not in table.columns]
    if not missing:
        return table
    extra = report_table(runs, metrics=missing, warn=False)
    if list(zip(extra.run, extra.group.astype(str))) != list(zip(table.run, table.group.astype(str))):
        raise ValueError("memlab report --html: the table given is not these runs' report table (runs or groups "
                         "differ); pass the runs the table was made from")
    out = table.copy()
    for c in [c for m in missing for c in (m, f"{m}_lo", f"{m}_hi") if c in extra.columns]:
        out[c] = extra[c].to_numpy()
    out.attrs = table.attrs
    return out


def run_pieces(run: Run, data: Any) -> tuple[pd.DataFrame, RunBrowser]:
    """What the page needs of one run's traces: its failure attribution and its part of the question browser
    (the traces, ~35 MB of JSON for a full run, are read once for both and never leave this call)."""
    tr = trace.load(run.run_dir)
    return attribution.attribute(tr, data), RunBrowser.of(tr)


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """A page build allocates millions of short-lived objects (trace records, layers, tables) and no garbage cycles
    worth collecting before it ends: the cyclic collector's passes over them were ~15 % of the build's CPU. Paused
    for the build (a forked run process inherits the pause), restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def build_html(runs: Sequence[Run | str | Path], title: str | None = None, table: pd.DataFrame | None = None,
               questions: str = "same") -> str:
    """The page as a string (see the module docstring); runs keep the order given, the first is A of every delta.
    ``questions='intersection'`` compares runs with different question sets on their shared questions."""
    with cycle_collector_paused():
        return _build(runs, title, table, questions)


def summary_pieces(loaded: list[Run], labels: list[str], table: pd.DataFrame | None, questions: str
                   ) -> tuple[pd.DataFrame, Comparison | str | None, dict[str, str]]:
    """What the page needs of the runs' summaries and predictions, not their traces: the per-category table with
    intervals, the paired comparisons and the figures other than the failure attribution's (as PNG data)."""
    table = with_ceiling(loaded, report_table(loaded, (*DEFAULT_METRICS, *CEILING_METRICS), warn=False)
                         if table is None else table)
    by_label = dict(zip(labels, loaded))
    figs = {"F1 per category": _png(plots.category_bars(by_label, "f1")),
            "F1 against tokens": _png(plots.f1_vs_tokens(by_label))}
    if len(loaded) > 1 and all(set(d) == {"retrieval.top_k"} for d in distinguishing(loaded)):
        figs["Top-k curve"] = _png(plots.topk_curve(loaded))
    for lab, run in zip(labels, loaded):
        figs[f"Evidence recall ({lab})"] = _png(plots.recall_curves(run))
    cmp = table.attrs.get("comparison")
    if cmp is None and len(loaded) > 1:
        cmp = report_comparison(loaded, labels, questions)
    return table, cmp, figs


def _call(job: Callable[[], Any]) -> Any:
    return job()


def _build(runs: Sequence[Run | str | Path], title: str | None, table: pd.DataFrame | None, questions: str) -> str:
    matplotlib.use("Agg", force=False)
    loaded, skipped = load_runs(runs, warn=False)
    if not loaded:
        raise FileNotFoundError("memlab report --html: no finished run among " + ", ".join(str(d) for d, _ in skipped))
    labels = run_labels(loaded)
    by_label = dict(zip(labels, loaded))
    datasets: dict[str, Any] = {}
    jobs: list[Callable[[], Any]] = [partial(summary_pieces, loaded, labels, table, questions)]
    for run in loaded:
        path = str(run.info.get("dataset") or run.config.dataset.path)
        if path not in datasets:
            datasets[path] = load_dataset(path)
        jobs.append(partial(run_pieces, run, datasets[path]))
    # the summaries' part and each run's traces in forked processes of their own where there are cores (they start
    # from this one's memory: the runs and datasets are not copied); the pieces come back in order, so the page is
    # the same bytes either way
    (table, cmp, drawn), *pieces = fork_map(_call, jobs, fork_workers(None, len(jobs)))
    atts, browsers = [a for a, _ in pieces], [b for _, b in pieces]
    figs = list(drawn.items())
    figs.insert(2, ("Failure attribution", _png(plots.attribution_bars(  # after the two F1 figures
        dict(zip(labels, atts)), n={lab: {int(k): int(v) for k, v in r.summary["n"].items() if str(k).isdigit()}
                                    for lab, r in by_label.items()}))))
    flipped: set[str] = set(map(str, cmp.flipped.qid)) if isinstance(cmp, Comparison) and len(cmp.flipped) else set()

    data = {"runs": [{"label": lab, "dir": str(r.run_dir)} for lab, r in zip(labels, loaded)],
            "labels": list(attribution.LABELS), **pack_runs(browsers, atts, flipped),
            "comparisons": comparison_data(cmp) if isinstance(cmp, Comparison) else []}
    data["cats"] = sorted({(c, category_name(c)) for c in data["questions"]["cat"]})
    payload = embed_json(data)

    notes = ["Means with 95 % clustered-bootstrap intervals [lo, hi] (conversations, then questions within them)."]
    if any(c in table.columns for c in CEILING_METRICS):
        notes.append(CEILING_NOTE)
    if any(c.endswith("tokens_qa") for c in table.columns):
        notes.append(TOKEN_NOTE)
    notes += [f"Skipped {d}: the run {why}." for d, why in skipped]
    plan_rows = [{"run": lab, **r} for lab, run in zip(labels, loaded) for r in plan_vs_actual(run.info)]
    parts = [f"<h1>{html.escape(title or 'memlab report')}</h1>",
             f'<p class="meta">{len(loaded)} run(s); generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. '
             f"Correct = F1 &ge; {CORRECT_F1}.</p>",
             _table_html(run_legend(loaded).drop(columns=["name"]).assign(
                 questions=[len(r.predictions) for r in loaded]), "runs"),
             *([f'<h2 id="plan">Plan vs actual (model calls and tokens per role)</h2><p class="note">{PLAN_NOTE}</p>',
                _table_html(pd.DataFrame(plan_rows), "plan")] if plan_rows else []),
             '<h2 id="summary">Summary per category</h2>', _table_html(display_frame(table), "summary"),
             "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)]
    if isinstance(cmp, str):
        parts.append(f'<h2 id="compare">Paired comparisons</h2><p class="note">{html.escape(cmp)}</p>')
    elif cmp is not None:
        parts.append('<h2 id="compare">Paired comparisons (question by question, against the first run)</h2>')
        parts.append(f'<p class="note">{html.escape(comparison_heading(cmp))}</p>')
        shown = comparison_display(cmp)
        for lab in cmp.runs:
            nfl = int((cmp.flipped["run"] == lab).sum()) if len(cmp.flipped) else 0
            parts.append(f"<h3>B &minus; A = {html.escape(lab)} &minus; {html.escape(cmp.baseline)}: "
                         f"{nfl} flipped question(s)</h3>")
            parts.append(_table_html(shown[shown["run"] == lab].drop(columns=["run"]), "compare"))
        parts.append("".join(f'<p class="note">{html.escape(str(n))}</p>' for n in [*cmp.legend(), *cmp.notes]))
    parts.append('<h2 id="plots">Plots</h2><div class="plots">' + "".join(
        f'<figure><img alt="{html.escape(c)}" src="{src}"><figcaption>{html.escape(c)}</figcaption></figure>'
        for c, src in figs) + "</div>")
    parts.append(_BROWSER)
    body = "\n".join(parts)
    head = f'<meta charset="utf-8"><title>{html.escape(title or "memlab report")}</title>'
    return (f'<!DOCTYPE html><html lang="en"><head>{head}<style>{_asset("report.css")}</style></head><body>{body}'
            f'<script type="application/json" id="memlab-data">{payload}</script>'
            f'<script>{_asset("report.js")}</script></body></html>')


def write_html(out: str | Path, runs: Sequence[Run | str | Path], title: str | None = None,
               table: pd.DataFrame | None = None) -> Path:
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    from memlab.atomic import write_text  # a full disk keeps the old file

    write_text(p, build_html(runs, title=title, table=table))
    return p


_BROWSER = """
<h2 id="questions">Question browser</h2>
<div class="filters">
 <label>judge by run <select id="f-run"></select></label>
 <label>category <select id="f-cat"><option value="">all</option></select></label>
 <label>failure label <select id="f-label"><option value="">any</option></select></label>
 <label>outcome <select id="f-outcome"><option value="">all</option><option value="ok">correct</option>
   <option value="bad">incorrect</option></select></label>
 <label><input type="checkbox" id="f-flip"> flipped between runs only</label>
 <label>text <input id="f-text" size="16" placeholder="question or answer"></label>
 <span id="f-count"></span>
</div>
<div id="browser"><div id="qlist"><table><thead id="qhead"></thead><tbody id="qbody"></tbody></table></div>
<div id="detail"><p class="note">Click a question to see its three trace layers in every run.</p></div></div>
"""
