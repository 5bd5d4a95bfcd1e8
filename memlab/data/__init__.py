"""Data layer: LoCoMo-10 and LongMemEval records, validating loaders, format detection, verified downloads."""

from memlab.data.cut import cut_locomo
from memlab.data.dataset import FORMATS, dataset_name, dataset_sha256, detect_format, load_dataset
from memlab.data.fetch import (
    HOW_TO_GET,
    LOCOMO_SHA256,
    LOCOMO_URL,
    LONGMEMEVAL_FILES,
    ChecksumMismatchError,
    ChecksumNotPinnedError,
    DataNotFoundError,
    default_cache_path,
    fetch_locomo,
    fetch_longmemeval,
    resolve_locomo_path,
    sha256_file,
)
from memlab.data.locomo import (
    CATEGORY_LABELS,
    Conversation,
    Dataset,
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
from memlab.data.longmemeval import (
    LONGMEMEVAL_LABELS,
    QUESTION_TYPES,
    LongMemEval,
    LongMemEvalFormatError,
    LongMemEvalQuestion,
    load_longmemeval,
)

__all__ = [
    "CATEGORY_LABELS", "HOW_TO_GET", "LOCOMO_SHA256", "LOCOMO_URL", "ChecksumMismatchError", "Conversation", "Dataset",
    "DataNotFoundError", "EvidenceIssue", "LoCoMo", "LoCoMoFormatError", "LoadReport", "Observation",
    "Question", "Session", "Turn", "default_cache_path", "fetch_locomo", "format_day", "load_locomo",
    "parse_session_date",
    "recover_evidence_ids", "resolve_locomo_path", "sha256_file",
    "FORMATS", "dataset_name", "dataset_sha256", "detect_format", "load_dataset", "LONGMEMEVAL_FILES",
    "ChecksumNotPinnedError",
    "fetch_longmemeval", "LONGMEMEVAL_LABELS", "QUESTION_TYPES", "LongMemEval", "LongMemEvalFormatError",
    "LongMemEvalQuestion", "load_longmemeval", "cut_locomo",
]
