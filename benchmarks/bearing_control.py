"""Answer-bearing@k beside the same measure for a random context of the same size: the chance control.

Per question of categories 1-4 of a finished run, at each k: the reader's context cut to the memories whose
best hit rank is at most k (k = the run's top_k is its whole context; a smaller k is the top of the same
ranking, near-duplicates aside), and ``draws`` random contexts of the same size drawn from the memories the
conversation held when answering (seeded by question and k). Each is scored two ways: **supported**
(`memlab.eval.ceiling.answer_bearing`: the gold's content words in lines about the question, each person's for a
two-person question) and the **former** definition (every stemmed gold token anywhere in the context). A measure
that a random context of the same size also meets says little about retrieval. Shares with 95 % intervals from
the conversation-clustered bootstrap (`memlab.eval.bootstrap`).

    python benchmarks/bearing_control.py RUN_DIR [--k 5 10] [--draws 5] [--markdown]
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

import pandas as pd


def former_bearing(answer: Any, category: int, lines: list[str]) -> float:
    """The definition before issue 36: every normalised, stemmed gold token somewhere in the context."""
    from memlab.eval.ceiling import gold_parts
    from memlab.eval.scoring import stemmed_tokens

    gold = set(stemmed_tokens(" ".join(gold_parts(answer, int(category)))))
    return float(bool(gold) and gold <= {t for s in lines for t in stemmed_tokens(s)})


def measure(run_dir: str, ks: list[int], draws: int = 5, seed: int = 0) -> pd.DataFrame:
    """One row per (question of categories 1-4, k): the context's size and the four shares (see the module doc)."""
    from memlab.data import load_dataset
    from memlab.eval.ceiling import answer_bearing, asked_of, memory_line
    from memlab.run.results import read_run_json
    from memlab.trace import as_list, load

    tr = load(run_dir)
    data = load_dataset((read_run_json(tr.run_dir / "run.json") or {}).get("dataset"))
    mems = tr.memories.set_index("id")
    line = {i: memory_line(t, e) for i, t, e in zip(mems.index, mems.text, mems.event_time)}
    src = {i: list(s) for i, s in zip(mems.index, mems.source_ids)}
    pool = {c: list(g.index) for c, g in mems.groupby("conversation")}
    best = tr.retrieval.groupby(["qid", "id"])["rank"].min().to_dict()
    rows = []
    for q in tr.questions[tr.questions.category != 5].to_dict("records"):
        conv = data[q["conversation_id"]]
        asked = asked_of(conv, q["question"], as_list(q["evidence"]))
        ctx = [i for i in tr.contexts.get(q["qid"], []) if i in line]
        ids = pool.get(q["conversation_id"], [])
        for k in ks:
            cut = [i for i in ctx if (r := best.get((q["qid"], i))) is not None and not pd.isna(r) and r <= k]
            lines, sources = [line[i] for i in cut], [src[i] for i in cut]
            rng = random.Random(f"{seed}/{q['qid']}/{k}")
            rand = [rng.sample(ids, min(len(cut), len(ids))) for _ in range(draws)]
            rows.append({
                "qid": q["qid"], "conversation_id": q["conversation_id"], "category": int(q["category"]), "k": k,
                "size": len(cut),
                "supported": answer_bearing(q["answer"], q["category"], lines, sources, asked),
                "supported_random": sum(answer_bearing(q["answer"], q["category"], [line[i] for i in r],
                                                       [src[i] for i in r], asked) for r in rand) / draws,
                "former": former_bearing(q["answer"], q["category"], lines),
                "former_random": sum(former_bearing(q["answer"], q["category"], [line[i] for i in r])
                                     for r in rand) / draws})
    return pd.DataFrame(rows)


MEASURES = ("supported", "supported_random", "former", "former_random")


def table(per_q: pd.DataFrame, n_boot: int = 2000) -> pd.DataFrame:
    """Per k and group (categories 1-4, overall 1-4): n, mean context size and each share with its interval."""
    from memlab.eval.bootstrap import ci_columns, groups_of

    out = []
    for k, g in per_q.groupby("k"):
        ci = ci_columns(g, list(MEASURES), n_boot=n_boot, mdd_metrics=())
        for name, label, rows in groups_of(g):
            if name == "overall 1-5":
                continue
            r = {"k": k, "group": f"{name} {label}".strip(), "n": len(rows), "size": rows["size"].mean()}
            for m in MEASURES:
                r[m], r[f"{m}_lo"], r[f"{m}_hi"] = rows[m].mean(), ci.loc[name, f"{m}_lo"], ci.loc[name, f"{m}_hi"]
            out.append(r)
    return pd.DataFrame(out)


def markdown(t: pd.DataFrame) -> str:
    """`table` as the guide's markdown table."""

    def ci(r: Any, m: str) -> str:
        return f"{r[m]:.3f} [{r[f'{m}_lo']:.3f}, {r[f'{m}_hi']:.3f}]"

    rows = ["| k | group | n | lines | answer-bearing (supported) | random context, same size | former definition | "
            "former, random context |", "|---|---|---|---|---|---|---|---|"]
    rows += [f"| {int(r['k'])} | {r['group']} | {int(r['n']):,} | {r['size']:.1f} | "
             + " | ".join(ci(r, m) for m in MEASURES) + " |" for r in t.to_dict("records")]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--draws", type=int, default=5, help="random contexts per question and k (default 5)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    if args.draws < 1 or any(k < 1 for k in args.k):
        raise SystemExit(f"--draws {args.draws} / --k {args.k}: expected positive integers")
    t = table(measure(args.run_dir, args.k, args.draws))
    print(markdown(t) if args.markdown else t.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
