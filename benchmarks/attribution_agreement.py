"""Agreement between the attribution rules (`memlab.attribution`) and a hand check.

The hand check: 60 failed questions of the ``offline`` run, 12 per category 1-5, drawn with a fixed
seed from the failed questions outside conv-26 (`draw`; sample ``dev``), each labelled by reading the
question, the gold, the evidence turns, the retrieved context and the prediction, before looking at the
rule's label. The rules were then revised where the disagreements showed them wrong, so agreement on
``dev`` is in-sample. 50 more (``holdout`` and ``holdout2``, 5 per category each, other seeds) were drawn
and labelled the same way after the last change to the rules: that is the out-of-sample figure, with
``holdout3`` (6 per category, seed 24, 30 questions), drawn and labelled on the shipped reader's run with
the rules unchanged. Rule 7's redundant-hop check came after those four samples, designed on their
disagreements, so for it they are not out of sample; ``holdout4`` (8 per category, seed 25, 40 questions)
was drawn and labelled blind (without looking at the rules or their labels) on the run of commit 42aa9b4's
reader, before rule 7 was merged, and is out of sample for every rule. ``holdout5`` (8 per category, seed
26, 40 questions) was drawn and labelled blind the same way on the run of commit 42aa9b4's reader, after
rule 7 was merged, so it is out of sample for rule 7 too. Labels and reasons
are in ``benchmarks/attribution_handcheck.csv`` (qid, category, hand_label, reason, sample, prediction:
the prediction the label judged). This script recomputes the rules' labels on a run and prints Cohen's
kappa (with a 95 % bootstrap interval over questions) and the confusion table (rows: hand, columns: rules).
The 110 were drawn from a run of the old extractive reader; after its rewrite the 20 it no longer failed
were dropped and the 35 whose prediction changed relabelled on the new run. ``draw`` on a run of another
reader therefore draws other questions: ``--dump dev`` is for a fresh sample, ``--dump stale`` for the CSV's.
A sample's draw skips the questions the CSV labelled for the samples before it (`samples`), so a new
sample (add it to `SAMPLES`, then ``--dump NAME``) never repeats one.

    python -m memlab run offline --results /tmp/r
    python benchmarks/attribution_agreement.py /tmp/r/offline-<time>
    python benchmarks/attribution_agreement.py /tmp/r/offline-<time> --sample holdout3   # one sample's table
    python benchmarks/attribution_agreement.py /tmp/r/offline-<time> --dump dev   # the drawn questions, no labels
    python benchmarks/attribution_agreement.py /tmp/r/offline-<time> --dump stale  # labels to redo
    python benchmarks/attribution_agreement.py /tmp/r/offline-<time> --markdown    # the attribution guide's tables

A label judges one prediction: a question of the CSV whose run prediction differs from the labelled one
(whitespace normalised; another reader), or that the run does not count as failed, is left out and
reported, never compared. ``--dump stale`` prints the still-failed ones of the first kind for relabelling.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
HANDCHECK = HERE / "attribution_handcheck.csv"
PER_CATEGORY = 12
SEED = 21
EXCLUDED_CONVERSATION = "conv-26"
ALL_CATEGORIES = (1, 2, 3, 4, 5)
#: The samples in the order they were drawn, each excluding the earlier ones: (per category, seed[, categories]).
#: ``blind2`` (issue 36): 10 per category 1-4, drawn on main's full offline run and labelled blind from the sheet
#: of ``--blind`` (no rule output), each category committed before agreement is computed.
#: ``blind3`` (issue 36, second revision): the same, labelled blind while the rules were revised on the others'
#: disagreements. ``blind4`` (issue 36, third revision): the same, labelled blind while the rules were revised on
#: ``blind3``'s disagreements. ``blind5`` (issue 36, fourth revision): the same, drawn and labelled blind
#: after the rules were revised on ``blind4``'s disagreements and the definitions said what grounds an inference.
#: ``blind6`` (issue 36, fifth revision): the same, after a revision on ``blind5``'s disagreements that put the
#: definitions in the rules' computable terms (same words, not paraphrases; a name is no topic word; a line's date
#: is a date gold's only).
SAMPLES: dict[str, tuple[int, int] | tuple[int, int, tuple[int, ...]]] = {
    "dev": (PER_CATEGORY, SEED), "holdout": (5, 22), "holdout2": (5, 23), "holdout3": (6, 24),
    "holdout4": (8, 25), "holdout5": (8, 26), "blind2": (10, 27, (1, 2, 3, 4)),
    "blind3": (10, 28, (1, 2, 3, 4)), "blind4": (10, 29, (1, 2, 3, 4)), "blind5": (10, 30, (1, 2, 3, 4)),
    "blind6": (10, 31, (1, 2, 3, 4))}
#: Samples labelled blind (without the rules or their output).
BLIND = ("holdout4", "holdout5", "blind2", "blind3", "blind4", "blind5", "blind6")
#: Blind samples drawn and labelled after the last revision: the out-of-sample figure (``holdout4``, ``holdout5`` and
#: ``blind2`` were each used to design a later revision, ``blind3`` the third, ``blind4`` the fourth, ``blind5`` the
#: fifth; ``blind6`` then showed one bug, the relative time "A few years ago", fixed after its figure was taken).
HELD_OUT = ("blind6",)


def draw(att: pd.DataFrame, per_category: int = PER_CATEGORY, seed: int = SEED,
         exclude: set[str] = frozenset(), categories: tuple[int, ...] = ALL_CATEGORIES  # type: ignore[assignment]
         ) -> pd.DataFrame:
    """The hand-check sample: ``per_category`` failed questions per category of ``categories``, none from conv-26
    nor ``exclude``."""
    pool = att[(att.conversation_id != EXCLUDED_CONVERSATION) & ~att.qid.isin(exclude)
               & att.category.isin(list(categories))].sort_values("qid")
    return pd.concat([g.sample(n=min(per_category, len(g)), random_state=seed)
                      for _, g in pool.groupby("category", sort=True)]).reset_index(drop=True)


def samples(att: pd.DataFrame, labelled: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """Every `SAMPLES` draw, each excluding the questions drawn before it on this run and the questions
    ``labelled`` (the CSV) holds for the earlier samples: a run of another reader draws other questions,
    so a new sample must not repeat ones labelled on an old run. Only earlier samples' labels are excluded,
    so a sample's draw stays the same once its own labels are written."""
    out: dict[str, pd.DataFrame] = {}
    seen: set[str] = set()
    for name, spec in SAMPLES.items():
        per, seed = spec[0], spec[1]
        cats = spec[2] if len(spec) > 2 else ALL_CATEGORIES  # type: ignore[misc]
        old = set() if labelled is None else set(labelled.qid[labelled["sample"].isin(list(out))])
        out[name] = draw(att, per, seed, seen | old, cats)
        seen |= set(out[name].qid)
    return out


def cohen_kappa(a: pd.Series, b: pd.Series) -> float:
    """Cohen's kappa of two label columns over the same items."""
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    labels = sorted(set(a) | set(b))
    po = float((a == b).mean())
    pe = sum(float((a == x).mean()) * float((b == x).mean()) for x in labels)
    return 1.0 if pe == 1 else (po - pe) / (1 - pe)


def kappa_interval(a: pd.Series, b: pd.Series, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of Cohen's kappa, resampling questions (seeded)."""
    import numpy as np

    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    rng = np.random.default_rng(seed)
    ks = [cohen_kappa(a[i], b[i]) for i in (rng.integers(0, len(a), len(a)) for _ in range(n_boot))]
    lo, hi = np.percentile(ks, [2.5, 97.5])
    return float(lo), float(hi)


def _norm(text: object) -> str:
    return " ".join(str(text).split())


def stale(hand: pd.DataFrame, predictions: pd.Series) -> list[str]:
    """qids of the CSV whose labelled prediction is not the run's (``predictions``: qid -> prediction)."""
    run = hand.qid.map(predictions)
    return sorted(hand.qid[run.isna() | (run.map(_norm) != hand.prediction.map(_norm))])


def agreement(att: pd.DataFrame, hand: pd.DataFrame, predictions: pd.Series
              ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, list[str]]]:
    """(the joined rows, the confusion table hand x rules, left-out qids by reason).

    A hand label judged one prediction, so only questions the run answered the same way are compared:
    left out are those whose prediction changed, then those the run does not count as failed.
    """
    changed = stale(hand, predictions)
    not_failed = sorted(set(hand.qid) - set(att.qid) - set(changed))
    keep = hand[~hand.qid.isin(changed)]
    both = keep.merge(att[["qid", "label", "reason"]].rename(columns={"label": "rule_label",
                                                                      "reason": "rule_reason"}), on="qid")
    table = pd.crosstab(both.hand_label, both.rule_label, margins=True, margins_name="total")
    return both, table, {"prediction changed": changed, "question no longer failed": not_failed}


def _row(name: str, g: pd.DataFrame, bold: bool = False, n_boot: int = 2000) -> str:
    lo, hi = kappa_interval(g.hand_label, g.rule_label, n_boot)
    k = f"{cohen_kappa(g.hand_label, g.rule_label):.3f} [{lo:.2f}, {hi:.2f}]"
    return f"| {name} | {len(g)} | {float((g.hand_label == g.rule_label).mean()):.3f} | {f'**{k}**' if bold else k} |"


def markdown(both: pd.DataFrame, left_out: dict[str, list[str]], n_boot: int = 2000) -> str:
    """The attribution guide's hand-check figure: agreement and Cohen's kappa per sample, every sample but ``dev``
    pooled (``dev`` is the one the rules were first revised on; see `SAMPLES` for the rest), and their confusion
    table."""
    held = both[both["sample"] != "dev"]
    rows = ["| sample | n | agreement | Cohen's κ [95 % CI] |", "|---|---|---|---|"]
    rows += [_row(f"`{name}`" + (" (in-sample)" if name == "dev" else ""), g, n_boot=n_boot)
             for name, g in both.groupby("sample", sort=False)]
    rows.append(_row(f"**every sample but `dev` ({' + '.join(f'`{n}`' for n in held['sample'].unique())})**", held,
                     True, n_boot))
    rows.append(_row("every sample but `dev`, categories 1–4 (category 5 is always `abstain-error`)",
                     held[held.category != 5], n_boot=n_boot))
    blind = both[both["sample"].isin(BLIND)]
    if len(blind):
        names = " + ".join(f"`{n}`" for n in blind["sample"].unique())
        rows.append(_row(f"labelled blind, without the rules or their output ({names})", blind, n_boot=n_boot))
    clean = both[both["sample"].isin(HELD_OUT)]
    if len(clean):
        names = " + ".join(f"`{n}`" for n in clean["sample"].unique())
        rows.append(_row(f"**held out: labelled blind after the last revision ({names}; a fix found on it since is in "
                         "the text)**", clean, True, n_boot))
    rows.append(_row("all", both, n_boot=n_boot))
    labels = sorted(set(held.hand_label) | set(held.rule_label))
    table = pd.crosstab(held.hand_label, held.rule_label).reindex(index=labels, columns=labels, fill_value=0)
    conf = ["| hand \\ rules | " + " | ".join(labels) + " | total |", "|---" * (len(labels) + 2) + "|"]
    conf += [f"| {h} | " + " | ".join(str(int(v)) for v in table.loc[h]) + f" | {int(table.loc[h].sum())} |"
             for h in labels]
    conf.append("| total | " + " | ".join(str(int(v)) for v in table.sum()) + f" | {int(table.values.sum())} |")
    out = "\n".join(rows) + (f"\n\nConfusion on every sample but `dev`, {len(held)} questions (rows: hand, "
                             "columns: rules; diagonal: agreement):\n\n")
    out += "\n".join(conf) + "\n"
    gone = "; ".join(f"{why} {len(q)}" for why, q in left_out.items() if q)
    return out + (f"\nLeft out of the comparison: {gone}.\n" if gone else "")


def dump(tr, att: pd.DataFrame, data, sample: pd.DataFrame) -> str:
    """Everything a hand labeller reads for the drawn questions, without the rule's label."""
    out = []
    texts = tr.memories.set_index("id")["text"].to_dict()
    for r in sample.to_dict("records"):
        q = tr.questions.set_index("qid").loc[r["qid"]]
        conv = data[r["conversation_id"]]
        out.append(f"==== {r['qid']}  cat {r['category']}  F1 {r['f1']:.2f}  ceiling {r['ceiling']:.2f}  "
                   f"bearing {r['bearing']}")
        out.append(f"Q: {q['question']}\nGOLD: {q['answer']}\nPRED: {q['prediction']}   (rule {q['rule']})")
        out.append(f"raw evidence: {list(q['evidence_raw'])}")
        for e in q["evidence"]:
            t = conv.turn_index.get(e)
            if t is not None:
                d = conv.session_by_index[t.session_index].date_time_raw
                out.append(f"  EV {e} [{d}] {t.speaker}: {t.searchable_text}")
        for i, mid in enumerate(tr.contexts.get(r["qid"], [])):
            out.append(f"  ctx{i + 1:02d} {str(texts.get(mid, '?'))[:220]}")
    return "\n".join(out)


def _day(when: object) -> str:
    from memlab.data.locomo import format_day

    try:
        return format_day(pd.Timestamp(when).to_pydatetime())
    except (TypeError, ValueError):
        return "no date"


def blind_question(tr, data, qid: str) -> str:
    """One question as a blind labeller reads it: question, gold, prediction, evidence turns, the reader's
    context in rank order (best hit rank over the question's queries; ``preload`` when no query returned it) and
    each evidence turn's retrieval rank when it is not in the context. Nothing the rules compute is shown."""
    q = tr.questions.set_index("qid").loc[qid]
    conv = data[q["conversation_id"]]
    mems = tr.memories.set_index("id")
    hits = tr.retrieval[tr.retrieval.qid == qid]
    best = hits.groupby("id")["rank"].min().to_dict() if len(hits) else {}
    ctx = tr.contexts.get(qid, [])
    order = sorted(ctx, key=lambda m: (best.get(m) is None or pd.isna(best.get(m)), best.get(m) or 0, ctx.index(m)))
    def is_turn(text: str) -> bool:  # a turn memory is the turn as said ("Jon: ..."); else an observation
        return text.startswith(tuple(f"{sp}:" for sp in conv.speakers))

    def rank_of(m: str) -> str:
        r = best.get(m)
        return "preload" if r is None or pd.isna(r) else str(int(r))

    in_ctx: dict[str, list[str]] = {}
    for m in ctx:
        if m in mems.index:
            for s in mems.loc[m, "source_ids"] or []:
                kind = "" if is_turn(str(mems.loc[m, "text"])) else " (observation)"
                in_ctx.setdefault(s, []).append(f"rank {rank_of(m)}{kind}")
    ranks = tr.best_ranks(qid)
    depth = tr.rank_depth.get(qid)
    out = [f"### {qid} (category {int(q['category'])})", "", f"- **Question**: {q['question']}",
           f"- **Gold**: {q['answer']}", f"- **Prediction**: {q['prediction']}  (F1 {float(q['f1']):.2f})", "",
           "Evidence turns:", ""]
    raw = [str(x) for x in (q.get("evidence_raw") if q.get("evidence_raw") is not None else [])]
    for e in list(q["evidence"]) or []:
        t = conv.turn_index.get(e)
        if t is None:
            out.append(f"- `{e}`: names no turn of the conversation")
            continue
        where = f"in context: {', '.join(in_ctx[e])}" if e in in_ctx else (
            "not in context, " + (f"retrieval rank {ranks[e]}" if ranks.get(e) is not None else
                                  f"beyond retrieval rank {depth}" if e in ranks and depth else
                                  "retrieval rank not traced"))
        out.append(f"- `{e}` [{conv.session_by_index[t.session_index].date_time_raw}] **{t.speaker}**: "
                   f"{t.searchable_text}  — *{where}*")
    dangling = [r for r in raw if r not in set(q["evidence"])]
    if dangling:
        out.append(f"- raw evidence entries as the dataset writes them: {raw}")
    out += ["", f"Context the reader saw ({len(order)} lines, best rank first):", "",
            "| rank | dia ids | date | text |", "|---|---|---|---|"]
    for m in order:
        row = mems.loc[m] if m in mems.index else None
        ids = ", ".join(row["source_ids"] or []) if row is not None else "?"
        text = str(row["text"]) if row is not None else "(memory not in the trace)"
        kind = "" if row is None or is_turn(text) else " (observation)"
        date = _day(row["event_time"]) if row is not None else ""
        out.append(f"| {rank_of(m)} | {ids}{kind} | {date} | {text.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def write_blind(tr, att: pd.DataFrame, data, name: str, sample: pd.DataFrame, out: Path,
                definitions: Path | None) -> list[Path]:
    """The blind labelling sheet of sample ``name``: ``sheet.md`` (the label definitions, then every question),
    one ``sheet-cat<N>.md`` per category, and ``labels.csv`` with qid and category filled and hand_label, reason
    blank. No rule label, reason, ceiling or answer-bearing is written."""
    out.mkdir(parents=True, exist_ok=True)
    defs = definitions.read_text() if definitions is not None else ""
    head = (f"# Blind labelling sheet: sample `{name}` ({len(sample)} failed questions of {tr.run_dir.name})\n\n"
            "Label each question with one label from the definitions below, in `labels.csv` (hand_label, and a "
            "reason naming the line(s) you decided on). Commit each category before moving to the next.\n\n")
    sample = sample.sort_values(["category", "qid"])
    blocks = {qid: blind_question(tr, data, qid) for qid in sample.qid}
    written = []
    for c, g in sample.groupby("category"):
        p = out / f"sheet-cat{int(c)}.md"
        p.write_text(head + f"## Category {int(c)}\n\n" + "\n".join(blocks[q] for q in g.qid))
        written.append(p)
    body = "\n".join(f"## Category {int(c)}\n\n" + "\n".join(blocks[q] for q in g.qid)
                      for c, g in sample.groupby("category"))
    (out / "sheet.md").write_text(head + defs + "\n\n---\n\n" + body)
    blank = sample[["qid", "category"]].assign(hand_label="", reason="")
    blank.to_csv(out / "labels.csv", index=False)
    return [out / "sheet.md", *written, out / "labels.csv"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="a finished offline run folder")
    ap.add_argument("--handcheck", default=str(HANDCHECK))
    ap.add_argument("--dump", choices=[*SAMPLES, "stale"],
                    help="print one sample's drawn questions for labelling, without the rules' labels "
                         f"(per category and seed: {SAMPLES}); 'stale': the CSV's still-failed questions "
                         "whose run prediction is not the labelled one")
    ap.add_argument("--blind", choices=list(SAMPLES), metavar="NAME",
                    help="write the blind labelling sheet of sample NAME (no rule output) under --out")
    ap.add_argument("--out", help="--blind: the folder for sheet.md, sheet-cat<N>.md and labels.csv")
    ap.add_argument("--definitions", help="--blind: a markdown file of the label definitions, put atop sheet.md")
    ap.add_argument("--markdown", action="store_true",
                    help="print only the docs' tables (per sample, held out pooled, held-out confusion)")
    ap.add_argument("--sample", action="append", choices=list(SAMPLES),
                    help="compare only the CSV rows of this sample (repeat to pool several)")
    args = ap.parse_args(argv)
    from memlab import attribution
    from memlab.data import load_locomo
    from memlab.trace import load

    tr = load(args.run_dir)
    data = load_locomo()
    att = attribution.attribute(tr, data)
    hand = pd.read_csv(args.handcheck, keep_default_na=False)
    if args.blind:
        if not args.out:
            raise SystemExit("--blind needs --out FOLDER (where the sheet and labels.csv are written)")
        defs = Path(args.definitions) if args.definitions else None
        if defs is not None and not defs.is_file():
            raise SystemExit(f"--definitions {defs}: no such file (expected the label definitions, markdown)")
        for p in write_blind(tr, att, data, args.blind, samples(att, hand)[args.blind], Path(args.out), defs):
            print(p)
        return 0
    if args.dump and args.dump != "stale":
        print(dump(tr, att, data, samples(att, hand)[args.dump]))
        return 0
    want = {"qid", "category", "hand_label", "reason", "prediction"}
    if not want <= set(hand.columns):
        raise SystemExit(f"{args.handcheck}: columns {list(hand.columns)}; expected {sorted(want)}")
    bad = sorted(set(hand.hand_label) - set(attribution.LABELS))
    if bad:
        raise SystemExit(f"{args.handcheck}: unknown hand_label(s) {bad}; expected one of {attribution.LABELS}")
    if args.sample:
        hand = hand[hand["sample"].isin(args.sample)]
    predictions = tr.questions.set_index("qid")["prediction"]
    if args.dump == "stale":
        redo = set(stale(hand, predictions)) & set(att.qid)
        print(dump(tr, att, data, att[att.qid.isin(redo)].sort_values(["category", "qid"])))
        return 0
    both, table, left_out = agreement(att, hand, predictions)
    if args.markdown:
        print(markdown(both, left_out), end="")
        return 0
    print(f"{len(hand)} hand labels, {len(both)} compared")
    for why, qids in left_out.items():
        if qids:
            print(f"left out, {why} ({len(qids)}): {qids}")
    def line(g: pd.DataFrame) -> str:
        lo, hi = kappa_interval(g.hand_label, g.rule_label)
        return (f"n {len(g)}, agreement {float((g.hand_label == g.rule_label).mean()):.3f}, Cohen's kappa "
                f"{cohen_kappa(g.hand_label, g.rule_label):.3f} [{lo:.2f}, {hi:.2f}]")

    print(f"all: {line(both)}")
    if "sample" in both.columns:
        for name, g in both.groupby("sample", sort=False):
            print(f"  sample {name}: {line(g)}")
        held = both[both["sample"] != "dev"]
        if len(held):
            print(f"  every sample but dev (see SAMPLES for which rule each was labelled before): {line(held)}")
            print(f"  every sample but dev, categories 1-4: {line(held[held.category != 5])}")
    for c, g in both.groupby("category"):
        print(f"  category {c}: n {len(g)}, agree {int((g.hand_label == g.rule_label).sum())}, "
              f"kappa {cohen_kappa(g.hand_label, g.rule_label):.3f}")
    print("\nconfusion (rows: hand, columns: rules)")
    print(table.to_string())
    print("\ndisagreements")
    for r in both[both.hand_label != both.rule_label].to_dict("records"):
        print(f"  {r['qid']} cat {r['category']}: hand {r['hand_label']} ({r['reason']}) / rules {r['rule_label']} "
              f"({r['rule_reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
