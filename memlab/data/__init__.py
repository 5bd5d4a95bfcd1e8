"""Data layer: LoCoMo-10 records, the validating loader and the verified download."""

from memlab.data.fetch import (
    HOW_TO_GET,
    LOCOMO_SHA256,
    LOCOMO_URL,
    ChecksumMismatchError,
    DataNotFoundError,
    default_cache_path,
    fetch_locomo,
    resolve_locomo_path,
    sha256_file,
)
from memlab.data.locomo import (
    CATEGORY_LABELS,
    Conversation,
    EvidenceIssue,
    LoadReport,
    LoCoMo,
    LoCoMoFormatError,
    Observation,
    Question,
    Session,
    Turn,
    format_day,
    load_locomo,
    parse_session_date,
    recover_evidence_ids,
)

__all__ = [
    "CATEGORY_LABELS", "HOW_TO_GET", "LOCOMO_SHA256", "LOCOMO_URL", "ChecksumMismatchError", "Conversation",
    "DataNotFoundError", "EvidenceIssue", "LoCoMo", "LoCoMoFormatError", "LoadReport", "Observation",
    "Question", "Session", "Turn", "default_cache_path", "fetch_locomo", "format_day", "load_locomo",
    "parse_session_date",
    "recover_evidence_ids", "resolve_locomo_path", "sha256_file",
]
