"""Sweeps that need more than one run (kept out of the runner so it stays one experiment at a time)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from memlab.attribution import LABELS, attribute
from memlab.index.text import jaccard, word_set
from memlab.run import ExperimentConfig, run_experiment
from memlab.run.clients import Clients
from memlab.run.components import build_extractor
from memlab.run.extraction import extraction_cache_key, index_file
from memlab.run.report import ci_frame
from memlab.trace import load, load_extraction, load_memories

NEAR_DUPLICATE = 0.80


def near_duplicates(texts: Sequence[str], threshold: float = NEAR_DUPLICATE) -> int:
    """Pairs of memories whose word sets have Jaccard >= ``threshold`` (what reconcile should prevent)."""
    sets = [word_set(t) for t in texts]
    n = 0
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            a, b = sets[i], sets[j]
            if threshold * len(b) <= len(a) <= len(b) / threshold and jaccard(a, b) >= threshold:
                n += 1
    return n


def reconcile_sweep(base: ExperimentConfig, settings: Sequence[tuple[float, float, float, float]],
                    results: str | Path | None = None, include_off: bool = True,
                    policies: Sequence[str] | None = None, reuse: bool = False) -> pd.DataFrame:
    """One row per reconcile setting (skip score, skip Jaccard, update score, update Jaccard) and update
    policy (``policies``; default: the base config's): ops proposed / rewritten to updates / skipped,
    memories stored (all, and current = not superseded), near-duplicate pairs left, recall and F1 over
    categories 1-4 with their 95 % clustered-bootstrap intervals (``_lo`` / ``_hi``). ``reuse``: a setting already
    run with the same config, data and code under ``results`` is read back, not run again (`run_experiment`). A
    cell that stores the same memories as an earlier one (`same_memories_key`: e.g. every policy with reconcile
    off, and append-only at every setting, for an add-only extractor) gets that cell's measures without a run."""
    rows = []
    grid: list[tuple[str, dict]] = []
    if include_off:
        grid.append(("off", {"extraction.reconcile.enabled": False}))
    for s in settings:
        grid.append((f"{s[0]:.2f}/{s[1]:.2f}/{s[2]:.2f}/{s[3]:.2f}", {
            "extraction.reconcile.enabled": True, "extraction.reconcile.skip_score": s[0],
            "extraction.reconcile.skip_jaccard": s[1], "extraction.reconcile.update_score": s[2],
            "extraction.reconcile.update_jaccard": s[3]}))
    done: dict[str, dict[str, Any]] = {}  # extraction key -> the row of the cell that ran with it
    for policy in policies or [base.extraction.policy]:
        for label, over in grid:
            cfg = base.with_overrides({**over, "extraction.policy": policy, "name": f"{base.name}-reconcile"})
            same = same_memories_key(cfg)  # cells storing the same memories answer alike: one run for them
            if same not in done:
                done[same] = _sweep_row(run_experiment(cfg, results=results, progress=False, reuse=reuse))
            rows.append({"policy": policy, "setting": label, **done[same]})
    return pd.DataFrame(rows)


def same_memories_key(cfg: ExperimentConfig) -> str:
    """The extraction cache key of ``cfg`` without its dataset (`memlab.run.extraction.extraction_cache_key`):
    two configs of one dataset with the same key store the same memories, e.g. the update policies of an
    add-only extractor with reconcile off. The extractor is built as a run builds it; no model is called."""
    extractor = build_extractor(cfg, Clients(cfg, Path(os.devnull)))
    return extraction_cache_key(cfg, "", extractor.cache_id(), extractor)


def _sweep_row(run: Any) -> dict[str, Any]:
    """A reconcile-sweep cell's measures from its run (`reconcile_sweep`); reads only the extraction and memory
    traces, not the retrieval trace."""
    ext, mems = load_extraction(run.run_dir), load_memories(run.run_dir)
    rec = ext["reconcile"].apply(lambda r: r or {})
    sup = mems["superseded_at"].notna() if "superseded_at" in mems else pd.Series(False, index=mems.index)
    dups = sum(near_duplicates(g.text.tolist()) for _, g in mems[~sup].groupby("conversation"))
    s = run.summary.loc["overall 1-4"]
    ci = ci_frame(run, ["recall@10", "f1"]).loc["overall 1-4"]
    return {"proposed": len(ext), "rewritten": int(rec.apply(
        lambda r: r.get("tier") == "update" and r.get("rewritten", False)).sum()),
        "skipped": int((ext.result == "skipped").sum()), "memories": len(mems),
        "current": int((~sup).sum()), "superseded": int(sup.sum()), "near_duplicates": dups,
        "n": int(s["n"]), "recall@10": float(s["recall@10"]),
        "recall@10_lo": float(ci.get("recall@10_lo", float("nan"))),
        "recall@10_hi": float(ci.get("recall@10_hi", float("nan"))),
        "context_recall": float(s["context_recall"]), "f1": float(s["f1"]),
        "f1_lo": float(ci.get("f1_lo", float("nan"))), "f1_hi": float(ci.get("f1_hi", float("nan")))}


def label_shift(run_a: Any, run_b: Any, data: Any = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a difference between two runs comes from, by failure label (`memlab.attribution`).

    Returns (counts, transitions): ``counts`` has one row per outcome (``correct`` or a failure label) with the
    number of questions in A, in B and the change; ``transitions`` cross-tabulates each question's outcome in
    A (rows) against B (columns) on the questions both answered, so the off-diagonal cells are the questions
    that moved, e.g. from ``retrieval-miss`` in A to ``correct`` in B.
    """
    outcomes = []
    for run in (run_a, run_b):
        tr = load(getattr(run, "run_dir", run))
        labels = attribute(tr, data).set_index("qid")["label"]
        outcomes.append(pd.Series(tr.questions.qid.map(labels).fillna("correct").to_numpy(), index=tr.questions.qid))
    a, b = outcomes
    both = a.index.intersection(b.index)
    order = ["correct", *LABELS]
    counts = pd.DataFrame({"A": a.loc[both].value_counts(), "B": b.loc[both].value_counts()}).reindex(
        order, fill_value=0).fillna(0).astype(int)
    counts["change"] = counts.B - counts.A
    counts.loc["total"] = counts.sum()
    trans = pd.crosstab(pd.Categorical(a.loc[both], order), pd.Categorical(b.loc[both], order),
                        rownames=["A"], colnames=["B"], dropna=False)
    return counts, trans


def store_bytes(run: Any) -> int | None:
    """What a run's memory store takes on disk: a system's own figure (its folder in the run folder for a run
    that predates it); a memlab run's SQLite store and its index files in the extraction cache (None in memory)."""
    sysinfo = run.info.get("system")
    if sysinfo:
        if sysinfo.get("store_bytes") is not None:
            return int(sysinfo["store_bytes"])
        folder = run.run_dir / sysinfo["name"]
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else None
    cache = (run.info.get("extraction") or {}).get("cache_dir")
    if run.config.store.backend != "sqlite" or not cache or not (Path(cache) / "store.db").is_file():
        return None
    stem = index_file(run.config).removesuffix(".npz")
    return sum(p.stat().st_size for p in Path(cache).iterdir() if p.name == "store.db" or p.name.startswith(stem))


def system_table(runs: Sequence[Any]) -> pd.DataFrame:
    """Per run and conversation: the memory system, how its provenance is known, memories stored, ingest seconds and
    the bytes its ingest added to the store on disk (a system's conversations share one store: each row is its
    growth; None for a run recorded before memlab measured it per conversation). A memlab run is one row, ``(all)``:
    its extraction stage's memories and seconds, and its store and index files (`store_bytes`), for all its
    conversations together."""
    rows = []
    for run in runs:
        info = run.info
        sysinfo = info.get("system")
        if sysinfo:
            for c in sysinfo.get("per_conversation", []):
                rows.append({"run": run.run_dir.name, "system": sysinfo["name"], "provenance": sysinfo["provenance"],
                             "features": ", ".join(k for k, v in sysinfo.get("features", {}).items() if v is True),
                             "conversation": c["conversation"], "memories": c["memories"],
                             "ingest_s": c["ingest_s"], "store_bytes": c.get("store_bytes")})
        else:
            ext = info.get("extraction") or {}
            t = info.get("timings", {})
            rows.append({"run": run.run_dir.name, "system": "memlab", "provenance": "exact",
                         "features": "hybrid" if run.config.retrieval.hybrid else "dense",
                         "conversation": "(all)", "memories": ext.get("memories"),
                         "ingest_s": (t.get("extraction_s") or 0.0) + (t.get("indexing_s") or 0.0),
                         "store_bytes": store_bytes(run)})
    return pd.DataFrame(rows)
