"""Model clients of a run: one `ModelClient` per model role, all sharing the response cache.

Roles: ``extractor`` (extraction.model), ``reader`` (answer.model), ``judge`` (judge.model) and
``embedder`` (the model of a ``litellm:<model>`` embedder). Each role resolves its model and
endpoint here, so a component asks for its role and never reads the config's model section.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from memlab.llm import ModelClient
from memlab.run.config import ExperimentConfig

ROLES = ("extractor", "reader", "judge", "embedder")


def role_model(cfg: ExperimentConfig, role: str) -> str | None:
    """The model name a role uses in this config (None: the role makes no model call)."""
    if role == "extractor":
        return cfg.extraction.model
    if role == "reader":
        return cfg.answer.model
    if role == "judge":
        return cfg.judge.model
    if role == "embedder":
        emb = cfg.index.embedder
        return emb.split(":", 1)[1] if emb.startswith("litellm:") else None
    raise ValueError(f"model role: expected one of {ROLES}, got {role!r}")


class Clients:
    """`for_role(role)` gives the role's client; clients of the same model and endpoint are shared."""

    def __init__(self, cfg: ExperimentConfig, cache_path: Path):
        self.cfg = cfg
        self.cache_path = cache_path
        self._clients: dict[tuple[Any, ...], ModelClient] = {}
        self._lock = threading.Lock()

    def endpoint(self, role: str) -> dict[str, Any]:
        """The endpoint settings of a role (``models.<role>`` over ``models``): api_base, api key, timeout,
        retries, concurrency (None: 1 for a local api_base), context window."""
        m = self.cfg.models.resolve(role)
        key = os.environ.get(m["api_key_env"]) if m["api_key_env"] else None
        if m["api_base"] and key is None:
            key = "memlab-local"
        return {"api_base": m["api_base"], "api_key": key, "timeout": m["timeout"], "max_retries": m["max_retries"],
                "concurrency": m["concurrency"], "context_window": m["context_window"]}

    def for_role(self, role: str) -> ModelClient:
        model = role_model(self.cfg, role)
        if not model:
            raise ValueError(f"model role {role!r} has no model in this config")
        ep = self.endpoint(role)
        with self._lock:
            k = (model, ep["api_base"], ep["timeout"], ep["max_retries"], ep["concurrency"], ep["context_window"])
            if k not in self._clients:
                self._clients[k] = ModelClient(model, cache_path=self.cache_path, **ep)
            return self._clients[k]

    def all(self) -> list[ModelClient]:
        with self._lock:
            return list(self._clients.values())

    def totals(self) -> dict[str, int]:
        cs = self.all()
        return {"model_calls": sum(c.calls for c in cs), "cache_hits": sum(c.cache_hits for c in cs),
                "failures": sum(c.failures for c in cs),
                "malformed_tool_calls": sum(c.malformed_tool_calls for c in cs)}


class EndpointCheckFailed(ConnectionError):
    """A model endpoint did not answer before the run started (the message names it)."""


def check_endpoints(cfg: ExperimentConfig, clients: Clients, roles: tuple[str, ...] = ROLES,
                    timeout: float = 5.0) -> list[str]:
    """One cheap ``GET <api_base>/models`` per local endpoint the given roles use; an endpoint that
    does not answer stops the run at once, naming it (rather than each question waiting out its
    retries). Providers without ``api_base`` are not probed. Returns the endpoints checked."""
    import urllib.error
    import urllib.request

    checked: list[str] = []
    for role in roles:
        if not role_model(cfg, role):
            continue
        base = clients.endpoint(role)["api_base"]
        if not base or base in checked:
            continue
        url = base.rstrip("/") + "/models"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (a configured endpoint)
                resp.read(1)
        except urllib.error.HTTPError:
            pass  # it answered (some servers have no /models): reachable
        except (OSError, urllib.error.URLError) as e:
            raise EndpointCheckFailed(
                f"the {role} endpoint {base} does not answer ({getattr(e, 'reason', e)}); start the server or fix "
                f"models.api_base (a fully cached rerun can skip this check with --set run.check_endpoint=false)"
            ) from None
        checked.append(base)
    return checked
