"""How well recovered provenance matches the truth, on memlab's own pipeline (where every memory's dialog ids
are known): each memory's text is aligned to the turns of the session it was ingested from, as a black-box
system's memories are (`memlab.systems.provenance`), and the recovered ids are compared with the true ones.

    python benchmarks/provenance_recovery.py [--extractor turns+observations] [--conversations conv-26,conv-30]
        [--turn-style speaker-context] [--max-ids 2] [--ratio 0.8] [--scope session|conversation]

Precision = share of recovered ids that are true, recall = share of true ids recovered (micro-averaged over
memories). Rows: by memory type (verbatim turn records, which are trivially found, vs rewritten notes such as
LoCoMo's observations, the case that matters for mem0's rewritten facts), and by question category: the
memories that cite the evidence of that category's questions.
"""

from __future__ import annotations

import argparse
import os
import time

import pandas as pd

from memlab.data import load_locomo
from memlab.extract.extractors import EXTRACTORS
from memlab.extract.pipeline import conversation_key
from memlab.index import open_service
from memlab.run.config import ExperimentConfig
from memlab.systems import MemlabSystem, ProvenanceAligner
from memlab.systems.base import session_messages


def _prf(rows: list[tuple[tuple[str, ...], set[str]]]) -> dict[str, float]:
    """Micro precision/recall of recovered ids (best first) against the true ones, and the best id's accuracy."""
    tp = sum(len(set(r) & t) for r, t in rows)
    nr, nt = sum(len(r) for r, _ in rows), sum(len(t) for _, t in rows)
    return {"memories": len(rows), "precision": tp / nr if nr else float("nan"),
            "recall": tp / nt if nt else float("nan"),
            "top1_correct": sum(bool(r) and r[0] in t for r, t in rows) / max(len(rows), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extractor", default="turns+observations")
    ap.add_argument("--conversations", default=None, help="comma-separated sample ids (default: all)")
    ap.add_argument("--turn-style", default="speaker-context",
                    help="the turn records' text (speaker-context adds the turn replied to: two turns in one text)")
    ap.add_argument("--max-ids", type=int, default=2)
    ap.add_argument("--ratio", type=float, default=0.8)
    ap.add_argument("--scope", choices=("session", "conversation"), default="session")
    ap.add_argument("--data", default=os.environ.get("MEMLAB_LOCOMO"))
    args = ap.parse_args()
    data = load_locomo(args.data)
    wanted = set(args.conversations.split(",")) if args.conversations else None
    convs = [c for c in data if wanted is None or c.sample_id in wanted]
    cfg = ExperimentConfig.from_dict({"extraction": {"name": args.extractor, "turn_style": args.turn_style}})
    aligner = ProvenanceAligner(max_ids=args.max_ids, ratio=args.ratio)
    rows: list[dict] = []
    t0 = time.process_time()
    for conv in convs:
        svc = open_service("memory", **cfg.index.hybrid_params())
        system = MemlabSystem(svc, EXTRACTORS.get(args.extractor).from_config(cfg.extraction, lambda role: None))
        key = conversation_key(conv)
        system.ingest_conversation(key, conv)
        sessions = {s.index: session_messages(s) for s in conv.sessions}
        every = [m for s in sessions.values() for m in s]
        by_scope: dict[int | None, list] = {}
        for h in system.memories(key):
            if not h.source_ids:
                continue
            sess = int(h.source_ids[0].split(":")[0][1:]) if args.scope == "session" else None
            by_scope.setdefault(sess if sess in sessions else None, []).append(h)
        cited: dict[str, set[int]] = {}
        for q in conv.questions:
            for e in q.evidence_ids:
                cited.setdefault(e, set()).add(q.category)
        for sess, hits in by_scope.items():
            turns = sessions[sess] if sess is not None else every
            for h, a in zip(hits, aligner.align([h.text for h in hits], turns)):
                verbatim = len(h.source_ids) == 1 and any(h.text.startswith(f"{sp}: ") for sp in conv.speakers)
                cats = set().union(*(cited.get(s, set()) for s in h.source_ids))
                rows.append({"conversation": conv.sample_id, "type": "turn" if verbatim else "note",
                             "recovered": a.source_ids, "true": set(h.source_ids), "categories": cats})
        system.close()
    cpu = time.process_time() - t0
    table = []
    for typ in ("turn", "note"):
        table.append({"rows": f"type={typ}", **_prf([(r["recovered"], r["true"]) for r in rows if r["type"] == typ])})
    for cat in (1, 2, 3, 4, 5):
        for typ in ("turn", "note"):
            sel = [(r["recovered"], r["true"]) for r in rows if cat in r["categories"] and r["type"] == typ]
            table.append({"rows": f"category {cat}, {typ}", **_prf(sel)})
    table.append({"rows": "all", **_prf([(r["recovered"], r["true"]) for r in rows])})
    df = pd.DataFrame(table).set_index("rows")
    print(f"provenance recovery: {len(convs)} conversation(s), extractor {args.extractor} ({args.turn_style}), "
          f"scope {args.scope}, max_ids {args.max_ids}, ratio {args.ratio}; {len(rows)} memories; {cpu:.1f} s CPU")
    print(df.to_string(float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()
