"""The answering stage: one `PredictionRecord` plus its retrieval and answer trace lines per
question, appended to the run's resume log as each question finishes.

A question whose arm raised is recorded with its error (every field present, ``error`` set) and is
never scored; ``--resume`` answers it again. A model endpoint that cannot be reached is not a
question's error: it stops the run (`EndpointUnreachable`) so that nothing is recorded against it.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from memlab.answer import AnswerContext, Answerer
from memlab.answer.base import evidence_ranks
from memlab.atomic import write_text
from memlab.data import Conversation, Question
from memlab.eval.ceiling import answer_bearing, answer_ceiling, asked_of, context_lines
from memlab.extract.pipeline import conversation_key
from memlab.llm import BadReply, EndpointUnreachable, ModelError, SpendCapReached, redact
from memlab.memory import MemoryService, MemoryView, PreparesQueries
from memlab.progress import progress_bar
from memlab.run.config import ExperimentConfig
from memlab.run.records import AnswerRecord, PredictionRecord, RecordSchemaError, RetrievalRecord

log = logging.getLogger(__name__)

PREDICTIONS_LOG = "predictions.jsonl"
TRACE_FILES = ("retrieval", "answers")
#: Questions per unit of a forked answering process (small enough to balance the processes and show progress).
ANSWER_CHUNK = 24


def error_text(e: BaseException) -> str:
    """The stored text of a failure: its type and message, with any key it echoes redacted (an arm's own
    exception may carry a server's reply that repeats the Authorization header)."""
    return redact(f"{type(e).__name__}: {e}")


def is_connection_error(exc: BaseException) -> bool:
    """Whether an exception (or one it was raised from) is a failure to reach the endpoint at all."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        name = type(e).__name__
        if isinstance(e, ConnectionError) or name in ("APIConnectionError", "ConnectError", "ConnectTimeout"):
            return True
        e = e.__cause__ or e.__context__
    return False


def stop_if_unreachable(e: BaseException, who: str, what: str = "model") -> None:
    """Raise `EndpointUnreachable` (naming ``who`` and the ``what`` endpoint) when ``e`` is a failure to reach the
    endpoint at all: that stops the run rather than record a failure against a question."""
    if is_connection_error(e):
        raise EndpointUnreachable(f"{who}: the {what} endpoint could not be reached: {e}") from e


Records = tuple[PredictionRecord, RetrievalRecord, AnswerRecord]


def question_row(q: Question) -> PredictionRecord:
    """A question's prediction row before it is answered (what it asks, its gold answer and evidence)."""
    return PredictionRecord(qid=q.qid, conversation_id=q.conversation_id, q_index=q.index, category=q.category,
                            question=q.question, answer=q.answer, evidence=list(q.evidence_ids),
                            evidence_raw=list(q.evidence))


def error_records(q: Question, message: str, row: PredictionRecord | None = None) -> Records:
    """The three records of a question that failed with ``message`` (scored as an error, answered again on
    resume); ``row``: its prediction row when it has usage to keep."""
    row = row if row is not None else question_row(q)
    row.error, row.rule = message, "error"
    return row, RetrievalRecord(qid=q.qid, evidence=row.evidence, error=message), AnswerRecord(qid=q.qid, error=message)


def json_lines(recs: Records) -> tuple[str, str, str]:
    """One question's prediction, retrieval and answer records as the lines `RecordLog` writes."""
    return recs[0].to_json(), recs[1].to_json(), recs[2].to_json()


class RecordLog:
    """Appends finished questions to a run folder (thread-safe): trace lines first, then the resume log, so a
    logged question has its traces. Both executors write through it."""

    def __init__(self, run_dir: Path):
        (run_dir / "traces").mkdir(exist_ok=True)
        self._files = {n: open(run_dir / "traces" / f"{n}.jsonl", "a", encoding="utf-8") for n in TRACE_FILES}
        self._log = open(run_dir / PREDICTIONS_LOG, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.written = 0

    def write(self, recs: list[Records]) -> None:
        self.write_lines([json_lines(r) for r in recs])

    def write_lines(self, lines: list[tuple[str, str, str]]) -> None:
        """Write `json_lines` of finished questions (a forked process sends these: strings cross a pipe
        cheaply, records' objects do not)."""
        with self._lock:
            for _, retr, ans in lines:
                self._files["retrieval"].write(retr + "\n")
                self._files["answers"].write(ans + "\n")
            for f in self._files.values():
                f.flush()
            for row, _, _ in lines:
                self._log.write(row + "\n")
            self._log.flush()
            self.written += len(lines)

    def close(self) -> None:
        self._log.close()
        for f in self._files.values():
            f.close()

    def __enter__(self) -> RecordLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def answer_one(cfg: ExperimentConfig, answerer: Answerer, judge: Any, svc: MemoryView | None,
               conv: Conversation, q: Question) -> tuple[PredictionRecord, RetrievalRecord, AnswerRecord]:
    """Answer, judge and trace one question; an arm's exception becomes the record's ``error``."""
    ctx = AnswerContext(service=svc, key=conversation_key(conv), conversation=conv,
                        search=cfg.retrieval.search_options(), preload_budget=cfg.retrieval.preload,
                        context_tokens=cfg.retrieval.context_tokens)
    row = question_row(q)
    try:
        a = answerer.timed(q, ctx)
    except Exception as e:  # one failed question is recorded and the run goes on
        stop_if_unreachable(e, q.qid)
        if isinstance(e, ModelError):  # usage of the rounds that succeeded before the failure
            _copy_usage(row, e.partial)
        return error_records(q, error_text(e), row)
    _copy_usage(row, a)
    row.prediction = a.prediction
    row.rule = a.rule
    row.context_tokens = a.context_tokens
    if svc is not None and q.category != 5:  # reader-independent: what the context offered
        lines, sources = context_lines(a.context), [list(e.source_ids) for e in a.context]
        asked = asked_of(conv, q.question, q.evidence_ids)  # the lines about the question support it
        row.answer_ceiling = answer_ceiling(q.answer, q.category, lines, sources, asked)
        row.answer_bearing = answer_bearing(q.answer, q.category, lines, sources, asked)
    row.retrieved_ids = a.context_source_ids
    first = a.queries[0].hits if a.queries else []
    row.first_query_ids = [list(h["source_ids"]) for h in first]
    if judge is not None:
        try:
            verdicts, usage, row.judge_replies = judge.judge_recorded(q, a.prediction)  # J = the verdicts' mean
            if verdicts:
                row.j, row.j_repeats = float(sum(verdicts) / len(verdicts)), list(verdicts)
            row.judge_prompt_tokens = usage.prompt_tokens
            row.judge_completion_tokens = usage.completion_tokens
            row.judge_cached_tokens = usage.cached_tokens
        except Exception as e:
            stop_if_unreachable(e, q.qid, "judge")
            row.judge_error = error_text(e)
            row.judge_replies = list(e.replies) if isinstance(e, BadReply) else []  # an unreadable verdict stays
    queries = [_trace_dict(t) for t in a.queries]
    ev = set(q.evidence_ids)
    recovered = None if svc is None else svc.recovered_ids(ctx.key)  # a memory system's (None: all exact)
    for t in queries:
        for h in t["hits"]:
            h["evidence_hit"] = bool(set(h["source_ids"]) & ev)
            if recovered is not None:
                h["provenance"] = "recovered" if h["id"] in recovered else "exact"
    retrieval = RetrievalRecord(qid=q.qid, evidence=row.evidence, preload=a.preload, queries=queries,
                                context_ids=[e.id for e in a.context])
    if svc is not None:  # evidence memories' ranks in each query's full ranking (trace only, after answering)
        try:
            deep = evidence_ranks(ctx, a.queries, ev, set(retrieval.context_ids))
            retrieval.rank_depth = deep["depth"]
            retrieval.evidence_memories = deep["evidence_memories"]
            for t, d in zip(queries, deep["queries"]):
                t.update(d or {})
        except Exception as e:
            retrieval.rank_error = error_text(e)
    prompt = a.prompt if len(a.prompt) < 4000 else a.prompt[:4000] + f"... [{len(a.prompt)} chars]"
    answer = AnswerRecord(qid=q.qid, prediction=a.prediction, rule=a.rule, prompt_hash=a.prompt_hash, prompt=prompt,
                          response=a.response, tool_calls=a.tool_calls, usage=asdict(a.usage), calls=a.calls,
                          latency_s=a.latency_s, reading=a.reading)
    return row, retrieval, answer


def _trace_dict(t: Any) -> dict[str, Any]:
    """A query trace as the dict ``asdict`` makes, one level deep: its hits are flat dicts of plain values, and a
    deep copy of every field was ~14 % of the offline answering time (cProfile)."""
    d = {f.name: getattr(t, f.name) for f in fields(t)}
    d["hits"] = [dict(h) for h in d["hits"]]  # each hit gets its own ``evidence_hit``
    return d


def _copy_usage(row: PredictionRecord, a: Any) -> None:
    row.calls = a.calls
    row.cached_calls = a.cached_calls
    row.prompt_tokens = a.usage.prompt_tokens
    row.completion_tokens = a.usage.completion_tokens
    row.cached_tokens = a.usage.cached_tokens
    row.tokens_estimated = a.usage.estimated
    row.latency_s = a.latency_s
    row.malformed_tool_calls = a.malformed_tool_calls


def load_done(run_dir: Path) -> list[PredictionRecord]:
    """The finished, error-free questions of a (killed or errored) run; everything else is redone.

    The resume log is cut at the first unreadable line (a kill mid-write), errored questions are
    dropped from it, and trace lines of questions not kept are removed, so each kept question has
    exactly one prediction and one line per trace file.
    """
    logp = run_dir / PREDICTIONS_LOG
    kept: list[PredictionRecord] = []
    if logp.is_file():
        for i, line in enumerate(logp.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rec = PredictionRecord.from_dict(json.loads(line), where=f"{logp}:{i}")
            except json.JSONDecodeError:
                break  # a line cut by the kill: everything after it is redone
            if rec.error is None:
                kept.append(rec)
    latest = {r.qid: r for r in kept}
    kept = list(latest.values())
    write_text(logp, "".join(r.to_json() + "\n" for r in kept))
    done = set(latest)
    for name in TRACE_FILES:
        p = run_dir / "traces" / f"{name}.jsonl"
        if not p.is_file():
            continue
        lines, seen = [], set()
        for ln in p.read_text(encoding="utf-8").splitlines():
            try:
                qid = json.loads(ln)["qid"]
            except (json.JSONDecodeError, KeyError):
                break
            if qid in done and qid not in seen:
                seen.add(qid)
                lines.append(ln)
        write_text(p, "".join(x + "\n" for x in lines))
    return kept


def read_log(run_dir: Path) -> list[PredictionRecord]:
    """Every record of a finished run's resume log (the last one per question)."""
    logp = run_dir / PREDICTIONS_LOG
    recs: dict[str, PredictionRecord] = {}
    for i, line in enumerate(logp.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = PredictionRecord.from_dict(json.loads(line), where=f"{logp}:{i}")
        except json.JSONDecodeError as e:
            raise RecordSchemaError(f"{logp}:{i}: not JSON ({e.msg})") from None
        recs[rec.qid] = rec
    return list(recs.values())


class Terminated(KeyboardInterrupt):
    """The run got SIGTERM: it stops as on Ctrl-C (marked ``interrupted``, the resume command printed)."""


class StopFlag(threading.Event):
    """Set when SIGINT or SIGTERM arrived (``signum`` says which: the first one). ``on_signal`` registers what the
    handler records before anything else (a run's status ``interrupted`` in its run.json)."""

    signum: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self._records: list[Callable[[], None]] = []

    def on_signal(self, record: Callable[[], None]) -> None:
        """Call ``record`` first in the signal handler, for every signal that arrives (it must be idempotent)."""
        self._records.append(record)

    def record(self) -> None:
        for rec in list(self._records):
            try:
                rec()
            except Exception as e:  # a full disk must not hide the signal: the run still stops
                log.warning("recording the interrupt failed: %s", e)

    def stop(self) -> None:
        """Raise what the signal means here (a no-op while no signal arrived)."""
        if self.is_set():
            raise Terminated if self.signum == signal.SIGTERM else KeyboardInterrupt


@contextlib.contextmanager
def remembered_interrupts() -> Iterator[StopFlag]:
    """Ctrl-C (and SIGTERM, as from ``kill`` or a batch system) is raised as a ``KeyboardInterrupt`` *and*
    remembered: a library that swallows it (a broad ``except`` deep in an HTTP client) cannot make the run carry
    on and finish as if nothing happened; the answering loop checks the flag after every question. Only in the
    main thread, and a signal is taken over only where it has its default action (not where it is ignored, as
    SIGINT in a background job, or already customised by the host).

    The handler first records the state (`StopFlag.on_signal`: run.json says ``interrupted``), then raises. A
    second signal while the first is being handled (Ctrl-C twice, a ``timeout`` wrapper forwarding one) records
    again but is not raised again: the first one is already stopping the run, and raising anew in the middle of
    its cleanup would cut the writing of run.json short."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    defaults = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))
    taken = {sig: signal.getsignal(sig) for sig, default in defaults if signal.getsignal(sig) is default}

    def on_signal(signum: int, frame: Any) -> None:
        first = not flag.is_set()
        if first:
            flag.signum = signum
            flag.set()
        flag.record()
        if first:
            flag.stop()

    for sig in taken:
        signal.signal(sig, on_signal)
    try:
        yield flag
    finally:
        for sig, old in taken.items():
            signal.signal(sig, old)


def prepare_queries(svc: MemoryView | None, todo: list[tuple[Conversation, Question]], progress: bool = True
                    ) -> int:
    """Encode every question of ``todo`` ahead, one batched pass per conversation (dense embedder and a
    model-encoded lexical scorer), where the service's index supports it (`memlab.memory.PreparesQueries`);
    the arms' searches then find their query vectors made. Returns how many questions were encoded."""
    if not isinstance(svc, MemoryService) or not isinstance(svc.searcher, PreparesQueries):
        return 0  # no store, a memory system's (its own search), or a searcher with nothing to encode ahead
    searcher = svc.searcher
    by_conv: dict[str, tuple[Conversation, list[str]]] = {}
    for c, q in todo:
        by_conv.setdefault(c.sample_id, (c, []))[1].append(q.question)
    n = 0
    for c, qs in progress_bar(list(by_conv.values()), desc="encode questions", disable=not progress, leave=False):
        key = conversation_key(c)
        n += searcher.prepare_queries(key, qs, lambda k=key: svc.list(k))
    return n


def answer_batch(cfg: ExperimentConfig, answerer: Any, judge: Any, svc: Any, conv: Conversation,
                 questions: list[Question], emit: Callable[[Records], None]) -> None:
    """Answer and judge ``questions`` of ``conv`` (``run.concurrency`` in flight), handing each question's records
    to ``emit`` as it finishes; an unreachable endpoint stops it (the questions in flight still finish)."""
    try:
        answerer.prepare([q.question for q in questions])
    except Exception as e:  # only a saving: each question then does its own work and records its own failure
        stop_if_unreachable(e, conv.sample_id)
        log.warning("%s: preparing %d questions failed (%s); each is answered on its own", conv.sample_id,
                    len(questions), error_text(e))
    if cfg.run.concurrency <= 1:
        for q in questions:
            emit(answer_one(cfg, answerer, judge, svc, conv, q))
        return
    pool = cf.ThreadPoolExecutor(max_workers=cfg.run.concurrency)
    try:
        futs = [pool.submit(answer_one, cfg, answerer, judge, svc, conv, q) for q in questions]
        fatal: BaseException | None = None
        for f in cf.as_completed(futs):
            try:
                emit(f.result())
            except (EndpointUnreachable, SpendCapReached) as e:  # what is in flight finishes and is kept
                fatal = fatal or e
        if fatal is not None:
            raise fatal
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
