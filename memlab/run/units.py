"""What the stage engine (`memlab.run.engine`) plans and tallies: the runs it executes (`Cell`), the stores they
extract into (`Store`) and its units of work (`ExtractUnit`, `AnswerUnit`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memlab.data import Conversation, Question
from memlab.memory import MemoryService
from memlab.run.clients import Clients
from memlab.run.config import ExperimentConfig
from memlab.run.steps import Components, Prepared


@dataclass
class Store:
    """One extraction cache key's store (shared by the cells that extract alike)."""

    svc: MemoryService
    cdir: Path
    durable: bool
    streamed: bool


@dataclass
class Cell:
    """One run the engine executes (a grid has several): its validated inputs, components, folder and tallies."""

    index: int
    p: Prepared
    comps: Components
    run_dir: Path
    info: dict[str, Any]
    clients: Clients
    timings: dict[str, float] = field(default_factory=dict)
    service: Any = None
    """The memories the arms read when not memlab's extraction (a `memlab.systems` service)."""
    done: int = 0
    todo: list[tuple[Conversation, Question]] = field(default_factory=list)
    ext_key: str | None = None
    failed: BaseException | None = None
    units: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, Any] = field(default_factory=dict)
    answered: int = 0
    table: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    extracted: list[Conversation] = field(default_factory=list)
    memories: int = 0
    most: int = 0
    t_start: float = 0.0
    peak: dict[str, float] = field(default_factory=dict)
    """This process's peak RSS (MB) after each stage (`memlab.threads.peak_rss_mb`)."""

    @property
    def cfg(self) -> ExperimentConfig:
        return self.p.cfg

    @property
    def extracts(self) -> bool:
        """Its memories come from memlab's extraction stage (an arm that reads memory, not on a system)."""
        return bool(self.comps.answerer.needs_memory) and not self.comps.on_system


@dataclass
class ExtractUnit:
    """Extract one conversation into the store of extraction cache key ``key`` (for the first ``cell`` needing it)."""

    cell: Cell
    conv: Conversation
    key: str


@dataclass
class AnswerUnit:
    """Answer (and judge) ``questions`` of one conversation for one ``cell``."""

    cell: Cell
    conv: Conversation
    questions: list[Question]
