"""The one door to models: every call (extract, answer, judge, embed) goes through `ModelClient` and litellm.

- litellm is imported lazily (7-8 s) and never allowed to fetch remote config at import;
- retries on rate limits (Retry-After honoured), server errors and timeouts, with exponential backoff and
  jitter, a bounded number of times, then the error is raised to the caller (`memlab.llm.retry`);
- an optional on-disk response cache keyed by what answers (the normalised endpoint) and the full
  request (model, messages with the rendered prompt, tools, params): a rerun makes zero model calls,
  and the client counts calls made vs served from cache; a reply its caller rejects (``check``) is
  never cached;
- error texts are redacted (`redact`): the keys clients send and ``sk-...``-like tokens never reach
  a stored error;
- token usage from the provider's ``usage`` (cached prompt tokens included); where a provider
  gives none, counted with litellm's token counter and marked ``estimated``.

The package, one module per job: `imports` (litellm, token counting), `errors` (model errors, redaction),
`types` (usage, tool calls, completions), `cache` (the response cache), `toolcalls` (tool calls written as
text), `endpoints` (the endpoint registry), `retry` (the retry, rate-limit and concurrency policy), `spend` (the
run's spend cap), `client` (`ModelClient`), `cancel` (cutting calls in flight when a run is interrupted), `serve`
(llama.cpp serving a GGUF file on this machine). Every public name is re-exported here.
"""

from __future__ import annotations

from memlab.llm.cache import RESPONSE_CACHE_FORMAT, ResponseCache
from memlab.llm.cancel import Cancelled, allow_calls, cancel_calls
from memlab.llm.client import STRUCTURED_OUTPUTS, ModelClient
from memlab.llm.endpoints import context_window_from_models, endpoint, prompt_tokens_estimate, registered_endpoint
from memlab.llm.errors import (
    REDACTED,
    BadReply,
    EmptyReply,
    EndpointUnreachable,
    MalformedToolCall,
    ModelCallError,
    ModelError,
    PromptTooLong,
    ToolLoopExhausted,
    TruncatedReply,
    redact,
    register_secret,
)
from memlab.llm.imports import count_tokens, import_litellm
from memlab.llm.retry import (
    HOSTED_CONCURRENCY,
    LOCAL_CONCURRENCY,
    MAX_BACKOFF_S,
    MAX_RETRY_AFTER_S,
    default_concurrency,
    is_local,
    retry_wait,
)
from memlab.llm.spend import SpendCap, SpendCapReached, capped, current_cap
from memlab.llm.toolcalls import calls_from_json, explicit_content, tool_call_text, tools_as_schema
from memlab.llm.types import CallStats, Completion, ToolCall, Usage, normalise_endpoint, request_hash

__all__ = [
    "BadReply", "CallStats", "Cancelled", "Completion", "EmptyReply", "EndpointUnreachable", "HOSTED_CONCURRENCY",
    "LOCAL_CONCURRENCY", "MAX_BACKOFF_S", "MAX_RETRY_AFTER_S", "SpendCap", "SpendCapReached", "capped",
    "current_cap", "default_concurrency", "retry_wait",
    "MalformedToolCall", "ModelCallError", "ModelClient", "ModelError", "PromptTooLong", "REDACTED",
    "RESPONSE_CACHE_FORMAT", "ResponseCache", "STRUCTURED_OUTPUTS", "ToolCall", "ToolLoopExhausted",
    "TruncatedReply", "Usage", "allow_calls", "cancel_calls",
    "context_window_from_models", "count_tokens", "endpoint", "explicit_content", "import_litellm", "is_local",
    "normalise_endpoint", "prompt_tokens_estimate", "redact", "register_secret", "registered_endpoint",
    "request_hash", "tool_call_text", "tools_as_schema", "calls_from_json",
]
