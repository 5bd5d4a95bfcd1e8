"""Auto-memory extraction: checker-gated incremental jobs, extractors, reconcile before write."""

from memlab.extract.checkers import CheckContext, checks_all, checks_any, message_threshold, time_interval
from memlab.extract.extractors import (
    ExtractionRequest,
    Extractor,
    LLMExtractor,
    ObservationsExtractor,
    TurnsAndLLM,
    TurnsExtractor,
    extraction_tools,
    parse_tool_call,
)
from memlab.extract.messages import CURSOR_KEY, ChatSession, Message, locomo_messages, replay_locomo
from memlab.extract.ops import ExtractionResult, MemoryOp
from memlab.extract.reconcile import Decision, ReconcileConfig, decide, reconcile, reconcile_score
from memlab.extract.worker import AutoMemoryWorker, Counters, JobResult, worker_index
from memlab.prompts import available_prompts, load_prompt, render

__all__ = [
    "CURSOR_KEY", "AutoMemoryWorker", "ChatSession", "CheckContext", "Counters", "Decision", "ExtractionRequest",
    "ExtractionResult", "Extractor", "JobResult", "LLMExtractor", "MemoryOp", "Message", "ObservationsExtractor",
    "ReconcileConfig", "TurnsAndLLM", "TurnsExtractor", "available_prompts", "checks_all", "checks_any", "decide",
    "extraction_tools", "load_prompt", "locomo_messages", "message_threshold", "parse_tool_call", "reconcile",
    "reconcile_score", "render", "replay_locomo", "time_interval", "worker_index",
]
