"""Model clients of a run: one `ModelClient` per model role (counted apart), all sharing the response cache and,
per endpoint, its request slots.

Roles: ``extractor`` (extraction.model), ``reader`` (answer.model), ``judge`` (judge.model) and
``embedder`` (the model of a ``litellm:<model>`` embedder). Each role resolves its model and
endpoint here, so a component asks for its role and never reads the config's model section.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from memlab.breaker import breaker
from memlab.index.machine_cache import embeddings_path
from memlab.llm import ModelClient, is_local
from memlab.llm.endpoints import http_get_json, served_model_id
from memlab.run.config import ExperimentConfig
from memlab.run.config_models import ROLES

log = logging.getLogger(__name__)


def role_model(cfg: ExperimentConfig, role: str) -> str | None:
    """The model name a role uses in this config (None: the role makes no model call)."""
    if role == "extractor":
        return cfg.extraction.model
    if role == "reader":
        return cfg.answer.model
    if role == "judge":
        return cfg.judge.model
    if role == "embedder":
        return cfg.index.embedder_model()
    raise ValueError(f"model role: expected one of {ROLES}, got {role!r}")


class Clients:
    """`for_role(role)` gives the role's client (one per role, so calls, tokens and cut-off replies are counted per
    role; roles on one endpoint share its concurrency slots, `memlab.llm.endpoints.endpoint`)."""

    def __init__(self, cfg: ExperimentConfig, cache_path: Path, embedding_cache: Path | None = None):
        self.cfg = cfg
        self.cache_path = cache_path
        self._embedding_cache = embedding_cache  # a Ray task's private copy; None: the machine cache
        self._clients: dict[str, ModelClient] = {}
        self._requested: set[str] = set()
        self._lock = threading.Lock()

    def endpoint(self, role: str) -> dict[str, Any]:
        """The endpoint settings of a role (``models.<role>`` over ``models``): api_base, api key, timeout,
        retries, concurrency (None: 1 for a local api_base), context window, reply cap, structured output."""
        m = self.cfg.models.resolve(role)
        key = os.environ.get(m["api_key_env"]) if m["api_key_env"] else None
        if m["api_base"] and key is None:
            key = "memlab-local"
        return {"api_base": m["api_base"], "api_key": key, "timeout": m["timeout"], "max_retries": m["max_retries"],
                "concurrency": m["concurrency"], "context_window": m["context_window"], "max_tokens": m["max_tokens"],
                "structured_output": m["structured_output"]}

    @property
    def embedding_cache(self) -> Path:
        """The machine cache's vector file (``run.cache_dir``; `memlab.index.machine_cache`), shared by every
        results root on this machine (a Ray task's private copy where it was given one)."""
        return self._embedding_cache or embeddings_path(self.cfg.run.cache_dir)

    def embedder_params(self) -> dict[str, Any]:
        """The embedder's settings (``index.embedder.params``) plus, for a model-backed one, its endpoint (the
        ``embedder`` role's api_base, key and timeout)."""
        out = dict(self.cfg.index.embedder.params)
        if self.cfg.index.embedder_model() is not None:
            ep = self.endpoint("embedder")
            out.update(api_base=ep["api_base"], api_key=ep["api_key"], timeout=ep["timeout"])
        return out

    def for_role(self, role: str) -> ModelClient:
        model = role_model(self.cfg, role)
        if not model:
            raise ValueError(f"model role {role!r} has no model in this config")
        ep = self.endpoint(role)
        with self._lock:
            self._requested.add(role)
            if role not in self._clients:  # one client per role (its own counts); endpoint slots are shared
                self._clients[role] = ModelClient(model, cache_path=self.cache_path, **ep)
                self._clients[role].role = role
            return self._clients[role]

    def roles_in_use(self, answerer: Any) -> tuple[str, ...]:
        """The roles the run's components asked a client for, plus the embedder when the run builds an
        index (``answerer`` needs memory or indexes turns itself) with ``index.embedder: litellm:<model>``."""
        with self._lock:
            used = set(self._requested)
        if (answerer.needs_memory or answerer.own_index) and role_model(self.cfg, "embedder"):
            used.add("embedder")
        return tuple(r for r in ROLES if r in used)

    def all(self) -> list[ModelClient]:
        with self._lock:
            return list(self._clients.values())

    def totals(self) -> dict[str, Any]:
        """The run's model counts (run.json ``models``): summed, and ``by_role`` (each role's calls, replies served
        from the cache, failed calls, malformed tool calls, replies cut off at max_tokens, and the tokens of
        every reply the endpoint gave)."""
        with self._lock:
            by_role = dict(self._clients)
        per = {role: {"model": c.model, "calls": c.calls, "cache_hits": c.cache_hits, "failures": c.failures,
                      "malformed_tool_calls": c.malformed_tool_calls, "truncated": c.truncated,
                      "prompt_tokens": c.usage.prompt_tokens, "completion_tokens": c.usage.completion_tokens,
                      "cached_tokens": c.usage.cached_tokens}
               for role, c in by_role.items()}
        out: dict[str, Any] = {"model_calls": 0, "cache_hits": 0, "failures": 0, "malformed_tool_calls": 0,
                               "truncated": 0}
        for role in per.values():
            for k, src in (("model_calls", "calls"), ("cache_hits", "cache_hits"), ("failures", "failures"),
                           ("malformed_tool_calls", "malformed_tool_calls"), ("truncated", "truncated")):
                out[k] += role[src]
        out["by_role"] = per
        return out


class EndpointCheckFailed(ConnectionError):
    """A model endpoint did not answer, or does not serve the model, before the run started (the message names
    each role, model and address)."""


def _probe(base: str, api_key: str | None, timeout: float) -> tuple[str, Any]:
    """``GET <base>/models``: ("listing", json), ("answered", HTTP status) or ("down", reason)."""
    import urllib.error

    try:
        return "listing", http_get_json(base.rstrip("/") + "/models", api_key, timeout)
    except urllib.error.HTTPError as e:
        return "answered", e.code  # it answered (some servers have no /models)
    except TimeoutError:
        return "down", f"no answer within {timeout:g} s"
    except urllib.error.URLError as e:
        r = e.reason
        return "down", getattr(r, "strerror", None) or str(r)
    except ValueError:
        return "answered", "not JSON"  # something answers, but not with a model listing
    except OSError as e:
        return "down", getattr(e, "strerror", None) or str(e)


def check_endpoints(cfg: ExperimentConfig, clients: Clients, roles: tuple[str, ...] = ROLES,
                    timeout: float = 5.0) -> list[str]:
    """Before any work: one ``GET <api_base>/models`` per endpoint the given roles use, all at once.

    A refused connection (or no answer within ``timeout``) fails at once, naming every role, model and
    address that depends on it, instead of each extraction job and question waiting out its retries; a
    listing without the role's model fails too, unless it lists one model and is not vLLM's (llama.cpp
    answers to any name; vLLM, naming ``max_model_len``, does not); 401/403 is a rejected key; a key
    variable (``api_key_env``) of a hosted endpoint that is not set is named. Returns the endpoints checked.
    """
    from concurrent.futures import ThreadPoolExecutor

    by_base: dict[str, list[tuple[str, str]]] = {}
    problems: list[str] = []
    for role in roles:
        model = role_model(cfg, role)
        if not model:
            continue
        m = cfg.models.resolve(role)
        ep = clients.endpoint(role)
        if m["api_key_env"] and m["api_key_env"] not in os.environ and not is_local(ep["api_base"]):
            problems.append(f"{role} {model}: the key variable {m['api_key_env']} (models.api_key_env) is not set")
        if ep["api_base"]:
            by_base.setdefault(ep["api_base"], []).append((role, model))
    if by_base:
        with ThreadPoolExecutor(max_workers=len(by_base)) as pool:
            probes = dict(zip(by_base, pool.map(
                lambda b: _probe(b, clients.endpoint(by_base[b][0][0])["api_key"], timeout), by_base)))
    else:
        probes = {}
    for base, users in by_base.items():
        kind, got = probes[base]
        who = ", ".join(f"{r} {m}" for r, m in users) if len(users) > 1 else f"model {users[0][1]}"
        if kind == "down":
            problems.append(f"{'/'.join(r for r, _ in users)} endpoint {base} does not answer ({got}; {who}): "
                            f"start the server or fix models.api_base (or models.<role>.api_base)")
            continue
        breaker(base).reset()  # it answers now: calls go through even if an earlier run saw it down
        if kind == "answered" and got in (401, 403):
            problems.append(f"{'/'.join(r for r, _ in users)} endpoint {base} rejects the key (HTTP {got}; {who}): "
                            f"check models.api_key_env")
        if kind != "listing":
            continue
        data = got.get("data") if isinstance(got, dict) else None
        entries = [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
        ids = [d.get("id") for d in entries]
        for role, model in users:
            if not ids or model in ids or served_model_id(model) in ids or f"{served_model_id(model)}:latest" in ids:
                continue  # (Ollama lists `local:latest` for a model asked for as `local`)
            if len(ids) == 1 and "max_model_len" not in entries[0]:  # one model, not vLLM: it may answer to any name
                log.info("%s %s: %s lists only %r (a one-model server that answers to any name is fine)",
                         role, model, base, ids[0])
                continue
            problems.append(f"{role} {model}: not served at {base} (its /models lists "
                            f"{', '.join(map(str, ids[:8]))}{' …' if len(ids) > 8 else ''}); set the role's model to "
                            f"openai/<one of them>")
    if problems:
        raise EndpointCheckFailed("model endpoints checked before the run:\n  " + "\n  ".join(problems) +
                                  "\n(a fully cached rerun can skip this check with --set run.check_endpoint=false)")
    return list(by_base)
