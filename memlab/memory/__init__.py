"""Memory model and storage: typed entries per `UserKey`, one `MemoryService` interface, two backends, and the
optional abilities of a searcher or store as small protocols (`memlab.memory.capabilities`)."""

from memlab.memory.capabilities import (
    EncodesAhead,
    ExportsKeys,
    ExtractionLog,
    MemoryView,
    PlansBuilds,
    PreparesQueries,
    ReleasesKeys,
    TimesQueryEncoding,
    extraction_log,
)
from memlab.memory.entry import KINDS, MemoryEntry, MemoryValidationError, UserKey, content_id
from memlab.memory.in_memory import InMemoryMemoryService
from memlab.memory.search_types import (
    DEDUPE_JACCARD,
    KIND_FALLBACK_MIN_HITS,
    RRF_K_DEFAULT,
    Searcher,
    SearchHit,
    SearchOptions,
    SearchResult,
)
from memlab.memory.service import (
    MemoryService,
    OpRecord,
    SearchUnavailableError,
    UpdateResult,
)
from memlab.memory.sqlite import SCHEMA_VERSION, SchemaVersionError, SQLiteMemoryService

__all__ = [
    "DEDUPE_JACCARD", "EncodesAhead", "ExportsKeys", "ExtractionLog", "MemoryView", "PlansBuilds", "PreparesQueries",
    "ReleasesKeys", "TimesQueryEncoding", "extraction_log", "KINDS", "KIND_FALLBACK_MIN_HITS", "RRF_K_DEFAULT",
    "SCHEMA_VERSION", "InMemoryMemoryService",
    "MemoryEntry", "MemoryService", "MemoryValidationError", "OpRecord", "SQLiteMemoryService", "SchemaVersionError",
    "SearchHit", "SearchOptions", "SearchResult", "SearchUnavailableError", "Searcher", "UpdateResult", "UserKey",
    "content_id",
]
