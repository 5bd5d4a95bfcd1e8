"""The ``models`` section of an experiment config: where each model role's requests go and how (endpoint, key
variable, timeout, retries, concurrency, context window, reply cap, structured output), with one role's settings
falling back to the shared ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memlab.run.config_sections import ConfigError, integer, one_of, positive


@dataclass
class RoleConfig:
    """One role's endpoint (``models.extractor``, ``.reader``, ``.judge``, ``.embedder``); unset keys
    fall back to ``models.*``. The role's model name stays where it was (``extraction.model``,
    ``answer.model``, ``judge.model``, ``index.embedder: litellm:<model>``)."""

    api_base: str | None = None
    api_key_env: str | None = None
    timeout: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None
    context_window: int | None = None
    max_tokens: int | None = None
    structured_output: str | None = None


ROLES = ("extractor", "reader", "judge", "embedder")
_ROLE_KEYS = ("api_base", "api_key_env", "timeout", "max_retries", "concurrency", "context_window", "max_tokens",
              "structured_output")
#: Each role's reply cap when neither ``models.<role>.max_tokens`` nor ``models.max_tokens`` is set: room for a
#: session's memories as JSON, a short answer (or a memory-tool round), a verdict with its one-sentence reason.
ROLE_MAX_TOKENS: dict[str, int | None] = {"extractor": 2048, "reader": 256, "judge": 128, "embedder": None}


@dataclass
class ModelsConfig:
    """Where model names resolve: a local OpenAI-compatible server (``api_base``) or a provider.

    ``concurrency``: requests in flight per endpoint, shared by its roles (None: 1 for a local ``api_base``, 4
    for a hosted one or a provider's own API; `memlab.llm.retry` states the retry and rate-limit policy);
    ``context_window``: tokens, checked before each call (None: what the server's
    ``/models`` states, else unchecked); ``max_tokens``: each reply's cap (None: the role's default,
    `ROLE_MAX_TOKENS`; a reply cut off there is an error, never an answer); ``structured_output``: how the
    endpoint gives a reply of a set form (extraction ops, a memory-tool round, a judge verdict): ``tools``
    (OpenAI tool calls, a call written as text parsed or re-asked) or ``json_schema`` (``response_format``
    with a JSON schema: llama.cpp, vLLM, OpenAI; what a small model without a tool-call template needs).
    Each role may override any of these.
    """

    api_base: str | None = None
    api_key_env: str | None = None
    timeout: float = 60.0
    max_retries: int = 3
    concurrency: int | None = None
    context_window: int | None = None
    max_tokens: int | None = None
    structured_output: str = "tools"
    extractor: RoleConfig = field(default_factory=RoleConfig)
    reader: RoleConfig = field(default_factory=RoleConfig)
    judge: RoleConfig = field(default_factory=RoleConfig)
    embedder: RoleConfig = field(default_factory=RoleConfig)

    def resolve(self, role: str) -> dict[str, Any]:
        """The role's endpoint settings, each from ``models.<role>`` when set, else from ``models``."""
        if role not in ROLES:
            raise ConfigError(f"models: unknown role {role!r}; roles: {', '.join(ROLES)}")
        r = getattr(self, role)
        out = {k: getattr(r, k) if getattr(r, k) is not None else getattr(self, k) for k in _ROLE_KEYS}
        if out["max_tokens"] is None:
            out["max_tokens"] = ROLE_MAX_TOKENS[role]
        return out

    def check(self, where: str) -> None:
        """The shared settings; each role's, and one limit per endpoint, are `ExperimentConfig._validate_models`."""
        from memlab.llm import STRUCTURED_OUTPUTS

        integer(where, "models.max_retries", self.max_retries, 0)
        positive(where, "models.timeout", self.timeout)
        for role in ("", *ROLES):
            sec = getattr(self, role) if role else self
            key = f"models.{role + '.' if role else ''}"
            integer(where, key + "max_tokens", sec.max_tokens, 1, optional=True)
            if sec.structured_output is not None:
                one_of(where, key + "structured_output", sec.structured_output, STRUCTURED_OUTPUTS)
