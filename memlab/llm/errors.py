"""Model errors, and redaction of secrets from every error text memlab stores."""

from __future__ import annotations

import re
import threading

from memlab.llm.types import CallStats

#: API keys the model clients of this process send: redacted from every error text (`redact`).
_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_SECRET_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[^\s'\",;}()\[\]]+"),  # an echoed Authorization header, whatever the token
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),  # OpenAI-style keys (sk-..., sk-proj-...)
    re.compile(r"(?i)((?:api[_-]?key|authorization|x-api-key)[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?)"  # key: value
               r"(?!bearer\s)[^\s'\",;}()\[\]]{6,}"),
)
REDACTED = "[redacted]"


def register_secret(value: str | None) -> None:
    """Remember a key this process sends, so `redact` removes it from error texts (short values are
    not keys worth hiding and would blank ordinary words)."""
    if value and len(value) >= 8:
        with _SECRETS_LOCK:
            _SECRETS.add(value)


def redact(text: str) -> str:
    """``text`` with every registered key, bearer token and ``sk-...``-like token replaced by ``[redacted]``.

    A server may echo the request's ``Authorization`` header in an error body; that body becomes an
    error text stored in predictions, traces and run.json."""
    with _SECRETS_LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for s in secrets:
        text = text.replace(s, REDACTED)
    text = _SECRET_PATTERNS[0].sub(lambda m: m.group(1) + REDACTED, text)
    text = _SECRET_PATTERNS[1].sub(REDACTED, text)
    return _SECRET_PATTERNS[2].sub(lambda m: m.group(1) + REDACTED, text)


class ModelError(RuntimeError):
    """A model call gave no usable result: an error for its question or job, never an answer.

    ``partial`` carries what the failed work already cost (tokens, calls, latency, malformed tool
    calls), so a run can record it; nothing that raised a `ModelError` is written to the response cache.
    Its message is redacted (`redact`): it is stored as the question's or job's error.
    """

    def __init__(self, message: str, partial: CallStats | None = None):
        super().__init__(redact(message))
        self.partial = partial if partial is not None else CallStats()


class ModelCallError(ModelError):
    """A model call failed after its retries (the message says which model and why)."""


class EndpointUnreachable(ModelCallError, ConnectionError):
    """Nothing answers at the endpoint (connection refused, closed port, wrong host). The one such error: a
    client's failed call, and the run stopping on it (a `ConnectionError`, never a question's error)."""


class EmptyReply(ModelError):
    """The model answered with neither text nor a tool call."""


class MalformedToolCall(ModelError):
    """The model wrote a tool call as text (``functions.memory_search:``) or with unusable arguments."""


class ToolLoopExhausted(ModelError):
    """The agent was still calling tools after its last round."""


class PromptTooLong(ModelError):
    """The prompt does not fit the model's context window (checked before sending)."""


class TruncatedReply(ModelError):
    """The reply was cut off at ``max_tokens`` (``finish_reason: length``): whatever it says is unfinished."""


class BadReply(ModelError):
    """The reply has text, but not the form the caller asked for (e.g. a judge verdict)."""

    def __init__(self, message: str, partial: CallStats | None = None, reply: str | None = None):
        super().__init__(message, partial)
        self.reply = reply
        """The reply's text, so a run can keep it on record (a LongMemEval verdict the strict rule cannot read
        is still the official rule's verdict: `memlab.eval.profiles.judge_rule_columns`)."""
        self.replies: list[str] = []
        """A judge's replies so far, this one last (`memlab.eval.profiles.ScoringProfile.judge_recorded`)."""
