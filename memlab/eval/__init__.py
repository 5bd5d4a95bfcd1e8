"""Scoring: the official LoCoMo QA metric, BLEU-1, exact match, evidence recall and summary tables."""

from memlab.eval.scoring import (
    ABSTAIN_PHRASES,
    bleu1,
    evidence_recall,
    exact_match,
    is_abstention,
    multi_answer_f1,
    normalize_answer,
    score_answer,
    token_f1,
)
from memlab.eval.summary import OVERALL_GROUPS, category_summary, format_summary, score_frame

__all__ = [
    "ABSTAIN_PHRASES", "OVERALL_GROUPS", "bleu1", "category_summary", "evidence_recall", "exact_match",
    "format_summary", "is_abstention", "multi_answer_f1", "normalize_answer", "score_answer", "score_frame",
    "token_f1",
]
