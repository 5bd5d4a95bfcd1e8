"""The ingest stage of a run on a `MemorySystem` other than the configured memlab pipeline (see
`memlab.systems`): each selected conversation ingested session by session, what the system stored traced, and
turn ids recovered for memories that have none.

Traces: ``traces/memories.jsonl`` (every stored memory, with ``provenance`` ``exact``, ``recovered`` (and its
top candidates with scores) or ``none``) and ``traces/system.jsonl`` (per conversation: ingest seconds, memories,
recovered). run.json's ``system`` section names the system, its active retrieval features, its cost counters and
the top-k every arm used.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from memlab.data import Conversation
from memlab.extract.pipeline import conversation_key
from memlab.memory.entry import UserKey
from memlab.run.config import ExperimentConfig
from memlab.run.extraction import ExtractionFailed, ExtractionOutcome, write_jsonl
from memlab.run.records import MemoryRecord
from memlab.systems import MemorySystem, ProvenanceAligner, SystemHit, SystemService
from memlab.systems.base import session_id, session_messages


def build_system(cfg: ExperimentConfig, clients: Any, run_dir: Path) -> MemorySystem:
    from memlab.systems import SYSTEMS

    return SYSTEMS.get(cfg.system.name).from_config(dict(cfg.system.params or {}),
                                                    {"config": cfg, "clients": clients, "run_dir": run_dir})


def recover(svc: SystemService, key: UserKey, conv: Conversation, mems: list[SystemHit],
            aligner: ProvenanceAligner) -> dict[str, dict[str, Any]]:
    """Align every memory without turn ids to the turns of the session it was ingested from (all of the
    conversation's sessions when the system does not say); fills ``svc.recovered`` and returns the alignments."""
    sessions = {session_id(conv, s): session_messages(s) for s in conv.sessions}
    every = [m for s in sessions.values() for m in s]
    groups: dict[str | None, list[SystemHit]] = {}
    for h in mems:
        if not h.source_ids:
            groups.setdefault(h.session if h.session in sessions else None, []).append(h)
    out: dict[str, dict[str, Any]] = {}
    rec = svc.recovered.setdefault(key, {})
    who = svc.speakers.setdefault(key, {})
    speaker = {m.turn_id: m.speaker for m in every}
    for sess, hits in groups.items():
        turns = sessions[sess] if sess is not None else every
        for h, a in zip(hits, aligner.align([h.text for h in hits], turns)):
            rec[h.memory_id] = a.source_ids
            who[h.memory_id] = tuple(dict.fromkeys(speaker[t] for t in a.source_ids))
            out[h.memory_id] = a.to_dict()
    return out


def run_system(cfg: ExperimentConfig, convs: list[Conversation], system: MemorySystem, run_dir: Path,
               aligner: ProvenanceAligner | None = None) -> ExtractionOutcome:
    """Ingest ``convs`` into ``system``, trace what it stored, recover missing provenance (`ExtractionOutcome`
    with the service view the arms search). A conversation with text that left no memory stops the run
    (`ExtractionFailed`) unless ``run.allow_failed_extraction``."""
    aligner = aligner or ProvenanceAligner()
    svc = system.as_service()
    t_all = time.perf_counter()
    mem_rows: list[dict[str, Any]] = []
    per_conv: list[dict[str, Any]] = []
    empty: list[str] = []
    for conv in convs:
        key = conversation_key(conv)
        size0, t0 = system.store_bytes(), time.perf_counter()
        system.ingest_conversation(key, conv)
        ingest_s = time.perf_counter() - t0
        size1 = system.store_bytes()  # what this conversation added to the store on disk (one shared store)
        mems = system.memories(key)
        aligned = recover(svc, key, conv, mems, aligner) if isinstance(svc, SystemService) else {}
        for h in mems:
            prov = "exact" if h.source_ids else "recovered" if h.memory_id in aligned else "none"
            mem_rows.append(MemoryRecord(
                conversation=conv.sample_id, id=h.memory_id, text=h.text, kind="unknown",  # a black box: no kind
                event_time=h.time.isoformat() if h.time else None,
                source_ids=list(h.source_ids) or aligned.get(h.memory_id, {}).get("source_ids", []),
                provenance=prov, session=h.session,
                candidates=aligned[h.memory_id]["candidates"] if prov == "recovered" else None).to_dict())
        if conv.turns and not mems:
            empty.append(conv.sample_id)
        per_conv.append({"conversation": conv.sample_id, "ingest_s": round(ingest_s, 3), "memories": len(mems),
                         "recovered": len(aligned), "sessions": len(conv.sessions), "turns": len(conv.turns),
                         "store_bytes": None if size1 is None else size1 - (size0 or 0)})
    if empty and not cfg.run.allow_failed_extraction:
        svc.close()
        raise ExtractionFailed(f"system {system.name!r} stored no memory for {len(empty)} conversation(s) with "
                               f"text: {', '.join(empty)}; not answering (set run.allow_failed_extraction=true "
                               f"to answer anyway)")
    traces = run_dir / "traces"
    traces.mkdir(exist_ok=True)
    write_jsonl(traces / "memories.jsonl", mem_rows)
    write_jsonl(traces / "system.jsonl", per_conv)
    kinds = {r["provenance"] for r in mem_rows}
    info = {"name": system.name, "id": system.cache_id(), "features": system.features(), "costs": system.costs(),
            "top_k": cfg.retrieval.top_k, "memories": len(mem_rows), "store_bytes": system.store_bytes(),
            "provenance": "exact" if kinds <= {"exact"} else "recovered" if kinds == {"recovered"} else "mixed",
            "recovered": sum(r["provenance"] == "recovered" for r in mem_rows), "empty_conversations": empty,
            "per_conversation": per_conv}
    return ExtractionOutcome(svc, info, {"ingest_s": time.perf_counter() - t_all})
