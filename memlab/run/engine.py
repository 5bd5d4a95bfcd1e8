"""The stage engine: the units of a run (or of a grid of runs) planned once, the cached ones skipped once, mapped by
an executor and collected once, whichever executor runs them.

A unit is a conversation's extraction (a LongMemEval question's haystack is a conversation here), its index build,
or a conversation's questions still to do (each answered, then judged). An executor is a ``map`` over units
(`memlab.run.executors`: in this process or forked processes; `memlab.run.ray_executor`: Ray tasks). A unit does
the same work under each, so the same fault ends the same way (`Failure`):

- a *fatal* error (an endpoint that cannot be reached, the spend cap, a storage error) stops the run at once,
  under every executor (Ray does not retry it);
- any other failure of a unit (its exception, a Ray worker lost past its retries) is that unit's: an extraction
  unit's conversation counts as failed extraction (the run stops before answering, `ExtractionFailed`, unless
  ``run.allow_failed_extraction``, and then its questions are recorded as errors), an answering unit's questions
  are recorded as errors (``--resume`` answers them again).

The plan is a list of waves of conversations (`Engine.waves`). A staged run is one wave: every key extracted,
indexed, then answered. A streamed run (`memlab.run.streaming.streams`: every LongMemEval question has its own
haystack) takes the keys in waves of ``executor.width`` and releases each key's index after its last question, so
memory holds a wave's haystacks, not the dataset's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from memlab.data import Conversation, Question
from memlab.extract.pipeline import conversation_key
from memlab.memory.capabilities import extraction_log
from memlab.memory.shipping import export_index, import_index
from memlab.progress import progress_bar
from memlab.run.answering import RecordLog, Records, StopFlag, answer_batch, error_records, load_done
from memlab.run.executors import Executor, Failure, Guarded, add_counts, answers_without_model
from memlab.run.extraction import (
    BUILD_LOG,
    ExtractionFailed,
    build_indexes,
    build_rows,
    extract_here,
    extraction_cache_key,
    extraction_done,
    extraction_info,
    extraction_row,
    extraction_table,
    failure_message,
    open_store,
    trace_lines,
    write_jsonl,
)
from memlab.run.streaming import key_index_path, release_key, resident_keys, save_key_index, streams
from memlab.run.units import AnswerUnit, Cell, ExtractUnit, Store
from memlab.threads import peak_rss_mb


class Engine:
    """Plan → map → collect for ``cells`` on ``executor``; `run` leaves each cell ready to score."""

    def __init__(self, cells: list[Cell], executor: Executor, cache_root: Path, stop: StopFlag,
                 progress: bool = True, ship: Any = None):
        self.cells, self.executor, self.cache_root, self.stop = cells, executor, cache_root, stop
        self.progress = progress
        self.ship = ship
        """A shipping executor's side of its units (`memlab.run.ray_executor.RayShip`): the task bodies, what each
        is sent (``extract_args``/``answer_args``) and where its results land (``land``/``land_answer``)."""
        self.stores: dict[str, Store] = {}
        self.seen: set[tuple[str, str]] = set()
        self.ran: set[tuple[str, str]] = set()  # extraction units that ran in this session
        self.bar: Any = None  # the answering progress bar of the wave being answered

    # ------------------------------------------------------------------------------------------------ plan
    def open(self) -> None:
        """Per cell: the questions still to do (one place for every executor), its extraction key and store, and
        its trace files started empty (each wave appends)."""
        for cell in self.cells:
            done = load_done(cell.run_dir)
            cell.done = len(done)
            ids = {r.qid for r in done}
            cell.todo = [(c, q) for c, q in cell.p.picks if q.qid not in ids]
            if not cell.extracts:
                continue
            assert cell.comps.extractor is not None and cell.comps.extractor_id is not None
            key = extraction_cache_key(cell.cfg, cell.p.dataset_sha, cell.comps.extractor_id, cell.comps.extractor)
            cell.ext_key = key
            if key not in self.stores:
                cdir = self.cache_root / "extract" / key
                cdir.mkdir(parents=True, exist_ok=True)
                durable = cell.cfg.store.backend == "sqlite"
                if not durable:
                    (cdir / BUILD_LOG).unlink(missing_ok=True)  # an in-memory store is extracted afresh every run
                svc = open_store(cell.cfg, cdir, self.cache_root, cell.clients, cell.comps.searcher,
                                 cell.comps.embedder)
                self.stores[key] = Store(svc, cdir, durable, streams(cell.p.data))
            traces = cell.run_dir / "traces"
            traces.mkdir(exist_ok=True)
            for name in ("extraction", "memories", "build_cost"):
                write_jsonl(traces / f"{name}.jsonl", [])

    def waves(self) -> list[list[Conversation]]:
        """The plan: every conversation of the cells, in order, as one wave, or in waves of ``executor.width`` keys
        where a store streams (each key released after its last question)."""
        convs = list({c.sample_id: c for cell in self.cells for c in cell.p.convs}.values())
        if not any(s.streamed for s in self.stores.values()):
            return [convs]
        w = max(1, self.executor.width)
        return [convs[i:i + w] for i in range(0, len(convs), w)]

    def run(self) -> None:
        self.open()
        waves = self.waves()
        bar = progress_bar(waves, desc="extract, index, answer" + (" (per key)" if len(waves) > 1 else ""),
                           disable=not self.progress or len(waves) == 1)
        for wave in bar:
            self.extract(wave)
            for cell in self.cells:  # run.json says what was extracted, before answering (a failure keeps it)
                self.record_extraction(cell, streamed=len(waves) > 1)
            self.index(wave)
            self.answer(wave, bar=len(waves) == 1)

    def raise_failed(self) -> None:
        """Raise the failed extraction of the cells that stopped (the others are scored first)."""
        failed = [c for c in self.cells if c.failed is not None]
        if len(self.cells) == 1 and failed:
            raise failed[0].failed  # type: ignore[misc]
        if failed:
            raise ExtractionFailed("\n".join(f"{c.run_dir}: {c.failed}" for c in failed))

    def close(self) -> None:
        for st in self.stores.values():
            st.svc.close()

    # ------------------------------------------------------------------------------------------------ extract
    def extract(self, wave: list[Conversation]) -> None:
        """Extract the wave's conversations the cache lacks (the one cache skip), then per cell the failure rule
        and the wave's trace lines."""
        t0 = time.perf_counter()
        units: list[ExtractUnit] = []
        for cell in self.cells:
            if not cell.extracts or cell.failed is not None:
                continue
            st = self.stores[cell.ext_key or ""]
            mine = {c.sample_id for c in cell.p.convs}
            for conv in wave:
                if conv.sample_id not in mine or (cell.ext_key, conv.sample_id) in self.seen:
                    continue
                self.seen.add((cell.ext_key or "", conv.sample_id))
                state = extraction_log(st.svc).extraction_state(conv.sample_id) if st.durable else None
                if extraction_done(conv, state) and st.svc.count(conversation_key(conv)) > 0:
                    continue  # cached: its row is read from the store when the cell collects
                units.append(ExtractUnit(cell, conv, cell.ext_key or ""))
        results: dict[tuple[str, str], Any] = {}
        ship = self.ship
        if self.executor.ships:
            pairs = self.executor.map(Guarded(ship.extract_task), units, prepare=lambda u: ship.extract_args(self, u))
        else:
            pairs = ((u, Guarded(self._extract_here)(u)) for u in units)
        for u, res in pairs:
            if self.executor.ships and not isinstance(res, Failure):
                res = ship.land(self, u, res)
            results[(u.key, u.conv.sample_id)] = (u.cell.index, res)
            self.ran.add((u.key, u.conv.sample_id))
            self.stop.stop()
        if self.executor.ships:  # a killed driver keeps the extraction: the merged index is saved now
            for st in self.stores.values():
                if st.svc.searcher is not None:
                    st.svc.searcher.close()
        for cell in self.cells:
            if cell.extracts and cell.failed is None:
                self.collect_extraction(cell, wave, results)
        for cell in self.cells:
            cell.timings["extraction_s"] = cell.timings.get("extraction_s", 0.0) + time.perf_counter() - t0
            cell.peak["extraction"] = peak_rss_mb()

    def _extract_here(self, u: ExtractUnit) -> dict[str, Any]:
        """An extraction unit in this process, into the driver's store."""
        return extract_here(u.cell.cfg, self.stores[u.key].svc, u.cell.p.data, u.cell.comps.extractor, u.conv)

    def collect_extraction(self, cell: Cell, wave: list[Conversation], results: dict[tuple[str, str], Any]) -> None:
        """The one place extraction results land for a cell: its table rows and failures, the failure rule, and the
        wave's extraction, build-cost and memory trace lines."""
        st = self.stores[cell.ext_key or ""]
        mine = {c.sample_id for c in cell.p.convs}
        convs = [c for c in wave if c.sample_id in mine]
        failed_here: list[dict[str, str]] = []
        for conv in convs:
            owner, res = results.get((cell.ext_key or "", conv.sample_id), (None, None))
            if isinstance(res, Failure):
                failed_here.append({"conversation": conv.sample_id, "reason": res.error})
                cell.units.append({"unit": f"extract {conv.sample_id}", "error": res.error})
                continue
            if owner == cell.index:  # the cell that caused an extraction reports its jobs; later ones see the cache
                cell.table += res["table"]
                failed_here += res["failures"]
                if "models" in res:
                    add_counts(cell.models, res["models"])
                    cell.units.append({"unit": f"extract {conv.sample_id}", **res["where"], "seconds": res["seconds"]})
            else:
                cell.table.append(extraction_row(conv, st.svc.count(conversation_key(conv))))
            cell.extracted.append(conv)
        cell.failures += list({(f["conversation"], f["reason"]): f for f in failed_here}.values())
        ok = [c for c in convs if all(f["conversation"] != c.sample_id for f in failed_here)]
        empty = [c.sample_id for c in ok if c.turns and st.svc.count(conversation_key(c)) == 0]
        if (failed_here or empty) and not cell.cfg.run.allow_failed_extraction:
            cell.failed = ExtractionFailed(failure_message(failed_here, empty, kept=bool(cell.answered)))
            return
        traces = cell.run_dir / "traces"
        done = {c.sample_id for c in cell.extracted}
        extracted = [c for c in convs if c.sample_id in done]
        write_jsonl(traces / "extraction.jsonl", trace_lines(st.svc, extracted, st.cdir), mode="a")
        write_jsonl(traces / "build_cost.jsonl", build_rows(st.svc, extracted, st.cdir), mode="a")
        from memlab.run.records import MemoryRecord

        mem = [MemoryRecord.of(c.sample_id, e).to_dict() for c in extracted for e in st.svc.list(conversation_key(c))]
        write_jsonl(traces / "memories.jsonl", mem, mode="a")
        cell.memories += len(mem)

    def record_extraction(self, cell: Cell, streamed: bool) -> None:
        """run.json's ``extraction`` section of a cell, from what its waves collected."""
        if not cell.extracts:
            cell.info.setdefault("extraction", {})
            return
        st = self.stores[cell.ext_key or ""]
        table = extraction_table(cell.table)
        info = extraction_info(table, cell.failures, [c for c in cell.p.convs if c.sample_id in table.index],
                               cell.ext_key or "", st.cdir, cell.comps.extractor_id or "", cell.cfg.extraction.policy)
        info["memories"] = cell.memories
        if self.executor.ships:
            info["tasks_failed"] = sorted(u["unit"].removeprefix("extract ") for u in cell.units
                                          if u.get("error") and u["unit"].startswith("extract "))
        if streamed:
            info.update(streamed=True, max_resident_keys=cell.most)
        cell.info["extraction"] = info

    # ------------------------------------------------------------------------------------------------ index
    def index(self, wave: list[Conversation]) -> None:
        """Build the wave's keys before answering, so answering latency excludes it (a shipping executor's units
        built theirs where they ran); a streamed key's fit is read from, or saved to, its own file."""
        t0 = time.perf_counter()
        for key, st in self.stores.items():
            cells = [c for c in self.cells if c.ext_key == key and c.failed is None]
            if not cells or self.executor.ships:
                continue
            done = {c.sample_id for cell in cells for c in cell.extracted}
            convs = [c for c in wave if c.sample_id in done]
            if st.streamed:
                asked = {c.sample_id for cell in cells for c, _ in cell.todo}
                for conv in convs:
                    ck = conversation_key(conv)
                    saved = key_index_path(st.cdir, ck)
                    if conv.sample_id in asked:
                        if st.durable and ck not in st.svc.searcher.keys() and saved.is_file():
                            import_index(st.svc, ck, saved.read_bytes())  # the fit this key's extraction built
                        st.svc.searcher.ensure_built(ck, lambda k=ck, svc=st.svc: svc.list(k))
                    if st.durable and ((key, conv.sample_id) in self.ran or not saved.is_file()):
                        blob = export_index(st.svc, ck)  # None where the key was not built
                        if blob is not None:
                            save_key_index(st.cdir, ck, blob)
                    for cell in cells:
                        cell.most = max(cell.most, resident_keys(st.svc))
            else:
                rows = {conversation_key(c): st.svc.list(conversation_key(c)) for c in convs}
                for cell in cells:
                    cell.info["executor"]["index_threads"] = build_indexes(st.svc, rows, cell.cfg.run.threads)
        for cell in self.cells:
            cell.timings["indexing_s"] = cell.timings.get("indexing_s", 0.0) + time.perf_counter() - t0
            cell.peak["indexing"] = peak_rss_mb()

    # ------------------------------------------------------------------------------------------------ answer
    def service(self, cell: Cell) -> Any:
        if cell.service is not None:
            return cell.service
        return self.stores[cell.ext_key].svc if cell.ext_key is not None else None

    def answer(self, wave: list[Conversation], bar: bool = True) -> None:
        """Answer the wave's questions still to do, one unit per (cell, conversation), collected in one place; then
        release a streamed wave's keys."""
        t0 = time.perf_counter()
        ids = {c.sample_id for c in wave}
        units: list[AnswerUnit] = []
        for cell in self.cells:
            if cell.failed is not None:
                continue
            lost = {f["conversation"]: f["reason"] for f in cell.failures}
            by_conv: dict[str, list[Question]] = {}
            convs = {c.sample_id: c for c, _ in cell.todo}
            for c, q in cell.todo:
                if c.sample_id in ids:
                    by_conv.setdefault(c.sample_id, []).append(q)
            for cid, qs in by_conv.items():
                if cid in lost and cell.extracts:  # extraction failed and the run goes on: its questions are errors
                    with RecordLog(cell.run_dir) as log:
                        log.write([error_records(q, f"extraction failed: {lost[cid]}") for q in qs])
                    continue
                units.append(AnswerUnit(cell, convs[cid], qs))
        logs = {cell.index: RecordLog(cell.run_dir) for cell in self.cells}
        arms = ", ".join(dict.fromkeys(c.cfg.answer.name for c in self.cells))
        self.bar = progress_bar(total=sum(len(u.questions) for u in units), desc=f"answer ({arms})",
                                disable=not (self.progress and bar), leave=False)
        try:
            self._answer_units(units, logs)
        finally:
            self.bar.close()
            for log in logs.values():
                log.close()
            for cell in self.cells:
                cell.timings["answering_s"] = cell.timings.get("answering_s", 0.0) + time.perf_counter() - t0
                cell.peak["answering"] = peak_rss_mb()
        for st in self.stores.values():
            if st.streamed:
                for conv in wave:
                    release_key(st.svc, conversation_key(conv))

    def _answer_units(self, units: list[AnswerUnit], logs: dict[int, RecordLog]) -> None:
        ex = self.executor
        order = {c.sample_id: i for cell in self.cells for i, c in enumerate(cell.p.convs)}
        units.sort(key=lambda u: (order[u.conv.sample_id], u.cell.index))  # the cells sharing a key, together
        if ex.ships:
            ship = self.ship
            ship.expect(self, units)
            pairs: Iterable[tuple[AnswerUnit, Any]] = ex.map(Guarded(ship.answer_task), units,
                                                             prepare=lambda u: ship.answer_args(self, u))
        elif self.forkable(units):
            pairs = self._forked(units, logs)
        else:
            pairs = ((u, Guarded(self._answer_here(logs))(u)) for u in units)
        for u, res in pairs:
            cell = u.cell
            if isinstance(res, Failure):
                logs[cell.index].write([error_records(q, res.error) for q in u.questions])
                cell.units.append({"unit": f"answer {u.conv.sample_id}", "questions": len(u.questions),
                                   "error": res.error})
            elif isinstance(res, dict):  # what a shipped unit returned
                self.ship.land_answer(u, res)
                logs[cell.index].write(res["records"])
                add_counts(cell.models, res["models"])
                cell.units.append({"unit": f"answer {u.conv.sample_id}", "questions": len(u.questions),
                                   **res["where"], "seconds": res["seconds"]})
            cell.answered += len(u.questions)
            if not isinstance(res, int):  # in this process each question was counted as it finished
                self.bar.update(len(u.questions))
            self.stop.stop()

    def _answer_here(self, logs: dict[int, RecordLog]) -> Callable[[AnswerUnit], int]:
        from memlab.run.answering import prepare_queries

        def run(u: AnswerUnit) -> int:
            cell = u.cell
            svc = self.service(cell)
            prepare_queries(svc, [(u.conv, q) for q in u.questions], progress=False)

            def emit(recs: Records) -> None:
                self.stop.stop()  # an answer made while Ctrl-C was swallowed is not kept
                logs[cell.index].write([recs])
                self.bar.update()

            answer_batch(cell.cfg, cell.comps.answerer, cell.comps.judge, svc, u.conv, u.questions, emit)
            return len(u.questions)
        return run

    def forkable(self, units: list[AnswerUnit]) -> bool:
        """Answer in forked processes: one cell's units, calling no model, more than one chunk of questions."""
        from memlab.run import answering

        if not units or any(u.cell is not units[0].cell for u in units):
            return False
        cell = units[0].cell
        return sum(len(u.questions) for u in units) // answering.ANSWER_CHUNK > 1 and \
            answers_without_model(cell.clients, cell.comps.answerer, self.service(cell))

    def _forked(self, units: list[AnswerUnit], logs: dict[int, RecordLog]) -> Iterator[tuple[AnswerUnit, Any]]:
        """Model-free answering in forked processes, in chunks; records cross the pipe as JSON lines."""
        from memlab.run import answering

        cell = units[0].cell
        svc = self.service(cell)
        answering.prepare_queries(svc, [(u.conv, q) for u in units for q in u.questions], progress=False)
        size = answering.ANSWER_CHUNK
        chunks = [AnswerUnit(cell, u.conv, u.questions[i:i + size]) for u in units
                  for i in range(0, len(u.questions), size)]

        def lines(u: AnswerUnit) -> list[tuple[str, str, str]]:
            out: list[tuple[str, str, str]] = []
            answer_batch(cell.cfg, cell.comps.answerer, cell.comps.judge, svc, u.conv, u.questions,
                         lambda r: out.append(answering.json_lines(r)))
            return out

        in_child = svc.after_fork if svc is not None else (lambda: None)
        for u, res in self.executor.map(Guarded(lines), chunks, in_child=in_child):
            if not isinstance(res, Failure):
                logs[cell.index].write_lines(res)
            yield u, (None if not isinstance(res, Failure) else res)

