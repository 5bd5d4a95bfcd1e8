"""`ModelClient`: the retrying, caching, usage-counting client of one model."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memlab.breaker import CircuitOpen, breaker
from memlab.llm.cache import ResponseCache
from memlab.llm.cancel import Cancelled, cancellable_http_client, cancelled
from memlab.llm.endpoints import (
    _connection_error,
    _Endpoint,
    _is_timeout,
    context_window_from_models,
    endpoint,
    http_get_json,
    prompt_tokens_estimate,
)
from memlab.llm.errors import (
    BadReply,
    EmptyReply,
    EndpointUnreachable,
    MalformedToolCall,
    ModelCallError,
    ModelError,
    PromptTooLong,
    TruncatedReply,
    redact,
    register_secret,
)
from memlab.llm.imports import count_tokens, import_litellm
from memlab.llm.retry import default_concurrency, retry_wait, retryable
from memlab.llm.spend import billed_tokens, spending
from memlab.llm.toolcalls import explicit_content, tool_call_text
from memlab.llm.types import CallStats, Completion, ToolCall, Usage, normalise_endpoint, request_hash

log = logging.getLogger("memlab.llm")
#: What an endpoint can do for a reply of a given form (``models.structured_output``): OpenAI tool calls, or a
#: JSON schema in ``response_format``.
STRUCTURED_OUTPUTS = ("tools", "json_schema")


class ModelClient:
    """A model by litellm name (``gpt-4o-mini``, ``openai/<name>`` + ``api_base`` for local servers).

    Local endpoints (``api_base`` on this machine) get ``concurrency`` = 1 by default, hosted ones 4 (`retry`):
    requests in flight per endpoint, shared by every client of that ``api_base`` in the process. After a timeout
    the client waits (holding the slot, up to ``busy_wait`` s) until the endpoint's ``/models``
    answers again, so a one-request server is not handed a new request while it still computes the
    old one. ``context_window`` (or the one ``/models`` states) is checked before every call.

    ``max_tokens`` caps every reply (a small local model otherwise runs on into its timeout); a reply the cap
    cut off (``finish_reason: length``) is a `TruncatedReply`, never read as an answer. ``structured_output``
    is what the endpoint can do for a reply of a given form: ``tools`` (OpenAI tool calls; a call written as
    text is parsed or re-asked) or ``json_schema`` (``response_format`` with a JSON schema, as llama.cpp,
    vLLM and OpenAI constrain the output): the components that need a form read it here.
    """

    def __init__(
        self,
        model: str,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        temperature: float | None = 0.0,
        cache_path: str | os.PathLike[str] | None = None,
        concurrency: int | None = None,
        context_window: int | None = None,
        busy_wait: float | None = None,
        max_tokens: int | None = None,
        structured_output: str = "tools",
    ):
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        register_secret(api_key)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.temperature = temperature
        self.cache_path = None if cache_path is None else str(cache_path)
        if concurrency is None:  # never unlimited (`memlab.llm.retry`): 1 on this machine, 4 hosted
            concurrency = default_concurrency(api_base)
        if concurrency < 1:
            raise ValueError(f"{model}: concurrency = {concurrency}; expected an integer >= 1 (or None: the default)")
        self.concurrency = concurrency
        self.context_window = context_window
        self.busy_wait = 4 * timeout if busy_wait is None else busy_wait
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ValueError(f"{model}: max_tokens = {max_tokens!r}; expected an integer >= 1 (or None: no cap)")
        self.max_tokens = max_tokens
        if structured_output not in STRUCTURED_OUTPUTS:
            raise ValueError(f"{model}: structured_output = {structured_output!r}; expected one of "
                             f"{', '.join(STRUCTURED_OUTPUTS)}")
        self.structured_output = structured_output
        self._http: Any = None
        self.role = ""
        """The run's role it serves (set by the run's clients): named when the spend cap refuses a request."""
        if concurrency is not None:
            endpoint(api_base or f"provider:{model}", concurrency)  # registered now: a conflict fails early
        self._cache: ResponseCache | None = None
        self._lock = threading.Lock()
        #: the server's window, asked once per client (a run's role): a server restarted on its address is asked again
        self._window: tuple[int | None, str] | None = None
        self._window_lock = threading.Lock()
        self.calls = 0
        self.cache_hits = 0
        self.failures = 0
        self.malformed_tool_calls = 0
        self.truncated = 0
        """Replies cut off by ``max_tokens`` (each an error for its question or job)."""
        self.usage = Usage()
        """Tokens of every reply the endpoint gave this client (truncated and rejected ones included; cached
        replies not): what the endpoint computed."""

    @property
    def cache(self) -> ResponseCache | None:
        if self.cache_path and self._cache is None:
            self._cache = ResponseCache(self.cache_path)
        return self._cache

    @property
    def endpoint(self) -> _Endpoint:
        return endpoint(self.api_base or f"provider:{self.model}", self.concurrency)

    # ------------------------------------------------------------------------ context window
    def resolved_context_window(self) -> tuple[int | None, str]:
        """The context window and where it came from (config, the server's /models, or unknown)."""
        if self.context_window:
            return self.context_window, "config"
        if not self.api_base:
            return None, "unknown"
        if self._window is None:
            # the probe is a request too: it takes an endpoint slot (a one-request server sees one at a time),
            # and one thread asks while the others wait for its answer
            ep = self.endpoint
            if ep is not None:
                ep.slots.acquire()
            try:
                with self._window_lock:
                    if self._window is None:
                        self._window = self._probe_context_window()
            finally:
                if ep is not None:
                    ep.slots.release()
        return self._window

    def _probe_context_window(self) -> tuple[int | None, str]:
        base = (self.api_base or "").rstrip("/")
        try:
            n = context_window_from_models(http_get_json(base + "/models", self.api_key, min(self.timeout, 10.0)),
                                           self.model)
        except Exception as e:
            log.info("%s: context window unknown (GET /models failed: %s: %s)", self.model, type(e).__name__, e)
            return None, "unknown"
        return (n, f"{base}/models") if n else (None, "unknown")

    def check_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     reserve: int = 0) -> int:
        """Raise `PromptTooLong` naming both sizes when the prompt cannot fit; returns the estimate."""
        window, source = self.resolved_context_window()
        if not window:
            return 0
        n = prompt_tokens_estimate(messages, tools)
        if n + reserve > window:
            raise PromptTooLong(f"{self.model}: the prompt is ~{n} tokens (o200k estimate)"
                                f"{f' + {reserve} for the reply' if reserve else ''}, over the model's context "
                                f"window of {window} tokens (from {source}); shorten the prompt or use a "
                                f"longer-context model")
        return n

    # ------------------------------------------------------------------------------- calls
    def cache_key(self, payload: dict[str, Any], cache_tag: str | None = None) -> str:
        """The response-cache key of a request: everything sent that decides the reply (model, messages,
        which carry the rendered prompt, tools, tool_choice, temperature and every other parameter),
        the normalised endpoint that answers it, and ``cache_tag``. Two servers never share replies."""
        key = dict(payload)
        ep = normalise_endpoint(self.api_base)
        if ep is not None:  # a provider's own API (no api_base) is named by the model: keys stay as they were
            key["_memlab_endpoint"] = ep
        if cache_tag is not None:
            key["_memlab_cache_tag"] = cache_tag
        return request_hash(key)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                 tool_choice: str | dict[str, Any] | None = None, cache_tag: str | None = None,
                 check: Callable[[Completion], Any] | None = None, **params: Any) -> Completion:
        """One completion. Raises `EmptyReply` (no text, no tool call), `MalformedToolCall` (a tool
        call written as text that neither parses nor comes back well-formed when re-asked with the
        tool forced), `PromptTooLong` or `ModelCallError`; none of these is cached. ``cache_tag`` is
        part of the response-cache key only (not sent), so repeated samples of one request (judge
        repeats) are cached apart.

        ``check(completion)`` is the caller's reading of the reply (a judge verdict, the last round
        of a tool loop): when it raises (a `ModelError`, or ValueError, raised as `BadReply`) the reply
        is not cached, so a rerun asks again; a cached reply it rejects is dropped and asked again."""
        messages = explicit_content(messages)
        payload: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            payload["tools"] = tools
            if tool_choice is not None:
                payload["tool_choice"] = tool_choice
        if self.temperature is not None:
            payload.setdefault("temperature", self.temperature)
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        payload.update(params)
        h = self.cache_key(payload, cache_tag)
        cache = self.cache
        if cache is not None:
            hit = cache.get(h)
            if hit is not None:
                comp = Completion.from_json(hit, h)
                try:
                    self._checked(comp, check)
                except ModelError as e:  # written by an older memlab that cached rejected replies
                    log.info("%s: cached reply %s rejected (%s); asking again", self.model, h[:12], e)
                    cache.delete(h)
                else:
                    with self._lock:
                        self.cache_hits += 1
                    return comp
        self.check_prompt(messages, tools, reserve=int(payload.get("max_tokens") or 0))
        comp = self._call(payload, messages)
        comp.request_hash = h
        if comp.finish_reason == "length":
            with self._lock:
                self.truncated += 1
            raise TruncatedReply(f"{self.model}: the reply was cut off at max_tokens = {payload.get('max_tokens')} "
                                 f"(finish_reason: length; {comp.usage.completion_tokens} completion tokens): raise "
                                 f"the role's models.<role>.max_tokens, or shorten what the prompt asks for",
                                 replace(comp.stats(), truncated=1))
        if not comp.tool_calls and tools and tool_choice != "none":
            comp = self._recover_tool_text(comp, payload, messages, tools)
        elif not comp.tool_calls and tools:
            name, _ = tool_call_text(comp.text, [t["function"]["name"] for t in tools])
            if name is not None:
                self._count_malformed(1)
                raise MalformedToolCall(f"{self.model}: asked for no tool (tool_choice=none) but wrote a "
                                        f"{name} call as text: {comp.text[:80]!r}",
                                        replace(comp.stats(), malformed_tool_calls=1))
        if not comp.tool_calls and not comp.text.strip():
            raise EmptyReply(f"{self.model}: empty reply (no text, no tool call)", comp.stats())
        self._checked(comp, check)
        if cache is not None:
            cache.put(h, self.model, comp.to_json())
        return comp

    def _checked(self, comp: Completion, check: Callable[[Completion], Any] | None) -> None:
        """Run the caller's ``check``; its rejection is a `ModelError` carrying this reply's cost."""
        if check is None:
            return
        try:
            check(comp)
        except ModelError as e:
            e.partial = comp.stats()
            raise
        except ValueError as e:
            raise BadReply(f"{self.model}: {e}", comp.stats(), reply=comp.text) from e

    def _count_malformed(self, n: int) -> None:
        with self._lock:
            self.malformed_tool_calls += n

    def _recover_tool_text(self, comp: Completion, payload: dict[str, Any], messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]]) -> Completion:
        """A tool call written as text: parse it when unambiguous, else re-ask once with that tool forced."""
        names = [t["function"]["name"] for t in tools]
        name, calls = tool_call_text(comp.text, names)
        if name is None:
            return comp
        self._count_malformed(1)
        comp.malformed_tool_calls += 1
        if calls is not None:
            comp.tool_calls, comp.text = calls, ""
            return comp
        forced = dict(payload, tool_choice={"type": "function", "function": {"name": name}})
        try:
            again = self._call(forced, messages)
        except ModelError as e:
            e.partial = comp.stats() + e.partial
            raise
        total = comp.stats() + again.stats()
        if again.tool_calls and all(tc.name in names for tc in again.tool_calls):
            again.usage, again.calls, again.latency_s = total.usage, total.calls, total.latency_s
            again.malformed_tool_calls, again.attempts = total.malformed_tool_calls, comp.attempts + again.attempts
            again.request_hash = comp.request_hash
            return again
        raise MalformedToolCall(f"{self.model}: wrote the tool call as text ({comp.text[:80]!r}) and, re-asked "
                                f"with tool_choice forced to {name}, replied {again.text[:80]!r} without a "
                                f"tool call", total)

    def _call(self, payload: dict[str, Any], messages: list[dict[str, Any]]) -> Completion:
        litellm = import_litellm()
        kw = self._endpoint_kw(payload)
        resp, attempts, spent = self._retrying(lambda: litellm.completion(**kw),
                                               prompt_tokens_estimate(messages, payload.get("tools")),
                                               int(payload.get("max_tokens") or 0))
        comp = self._parse(resp, messages)
        with self._lock:
            self.usage = self.usage + comp.usage
        comp.latency_s = spent
        comp.attempts = comp.calls = attempts
        return comp

    def embed(self, texts: list[str]) -> tuple[list[Any], Usage, CallStats]:
        """Embedding vectors of ``texts`` (one request), with the chat calls' retries, endpoint slots
        and accounting; usage is the provider's, else counted (``estimated``)."""
        litellm = import_litellm()
        kw = self._endpoint_kw({"model": self.model, "input": list(texts)})
        resp, attempts, spent = self._retrying(lambda: litellm.embedding(**kw), sum(count_tokens(t) for t in texts), 0)
        data = sorted(resp.data, key=lambda d: d["index"] if isinstance(d, dict) else d.index)
        vecs = [d["embedding"] if isinstance(d, dict) else d.embedding for d in data]
        u = getattr(resp, "usage", None)
        n = int(getattr(u, "prompt_tokens", 0) or 0) if u is not None else 0
        usage = Usage(n, 0, 0, False) if n else Usage(sum(count_tokens(t) for t in texts), 0, 0, True)
        return vecs, usage, CallStats(usage=usage, calls=attempts, latency_s=spent)

    def _endpoint_kw(self, payload: dict[str, Any]) -> dict[str, Any]:
        kw = dict(payload, timeout=self.timeout, num_retries=0)
        if self.api_base:
            kw["api_base"] = self.api_base
        if self.api_key:
            kw["api_key"] = self.api_key
        if self.api_base and self.model.startswith("openai/"):
            kw["client"] = self._openai_client()  # its connections can be cut when the run is interrupted
        return kw

    def _openai_client(self) -> Any:
        """The OpenAI SDK client litellm sends an ``openai/<name>`` model's requests through: no retries of its
        own (`_retrying` does them) and connections `memlab.llm.cancel.cancel_calls` can close."""
        with self._lock:
            if self._http is None:
                import openai

                self._http = openai.OpenAI(api_key=self.api_key or "memlab-local", base_url=self.api_base,
                                           max_retries=0, http_client=cancellable_http_client())
            return self._http

    def _retrying(self, send: Any, prompt_tokens: int = 0, max_tokens: int = 0) -> tuple[Any, int, float]:
        """``send()`` with bounded retries (backoff, Retry-After, the endpoint's slots, the busy wait
        after a timeout); returns (response, attempts, seconds) or raises `ModelCallError` /
        `EndpointUnreachable` carrying the attempts as partial cost. Each attempt is first admitted by the
        run's spend cap (`memlab.llm.spend`; ``prompt_tokens``/``max_tokens``: its worst case), which may stop
        the run with `SpendCapReached` before it is sent."""
        last: Exception | None = None
        spent = 0.0
        ep = self.endpoint
        br = breaker(self.api_base or f"provider:{self.model}")
        attempt = 0
        for attempt in range(1, self.max_retries + 2):
            if cancelled():
                last, attempt = None, attempt - 1
                break
            try:
                br.before()  # a few calls in a row could not connect: fail now, not after every retry
            except CircuitOpen as e:
                last, attempt = e, attempt - 1
                break
            t0 = time.perf_counter()
            if ep is not None:
                ep.slots.acquire()
            try:
                with spending(self.role, self.model, self.api_base, prompt_tokens, max_tokens) as paid:
                    with self._lock:
                        self.calls += 1
                    try:
                        resp = send()
                    except Exception as e:
                        if _is_timeout(e):  # the provider may have computed (and billed) it
                            paid(worst=True)
                        raise
                    billed = billed_tokens(resp)
                    paid(billed, worst=billed is None)
                br.record(True)
                return resp, attempt, spent + time.perf_counter() - t0
            except Exception as e:  # litellm maps provider errors to its own exception classes
                last = e
                br.record(not _connection_error(e), f"{type(e).__name__}: {e}")
                if _is_timeout(e) and ep is not None:
                    self._wait_until_idle()  # still holding the slot: nothing new reaches a busy server
            finally:
                if ep is not None:
                    ep.slots.release()
                spent += time.perf_counter() - t0
            if not retryable(last) or attempt > self.max_retries or cancelled():
                break
            wait = retry_wait(last, attempt, self.backoff)  # Retry-After, else backoff with jitter
            time.sleep(wait)
            spent += wait
        with self._lock:
            self.failures += 1
        if cancelled():  # the connection was cut on purpose: not the endpoint's fault, and no retry
            raise Cancelled(f"{self.model}: call cancelled after {attempt} attempt(s) (the run was interrupted)",
                            CallStats(calls=attempt, latency_s=spent))
        cls = EndpointUnreachable if last is not None and _connection_error(last) else ModelCallError
        where = f" at {self.api_base}" if self.api_base else ""
        raise cls(f"{self.model}{where}: call failed after {attempt} attempt(s): "
                  f"{type(last).__name__}: {redact(str(last))[:300]}",
                  CallStats(calls=attempt, latency_s=spent)) from last

    def _wait_until_idle(self) -> None:
        """After a timeout: wait until the endpoint answers ``/models`` (a one-request server answers
        only when it has finished the abandoned request), at most ``busy_wait`` seconds."""
        if not self.api_base:
            return
        deadline = time.monotonic() + self.busy_wait
        while time.monotonic() < deadline:
            try:
                http_get_json(self.api_base.rstrip("/") + "/models", self.api_key,
                               max(0.1, deadline - time.monotonic()))
                return
            except Exception:
                time.sleep(0.05)

    def _parse(self, resp: Any, messages: list[dict[str, Any]]) -> Completion:
        choice = resp.choices[0]
        msg = choice.message
        calls = []
        for i, tc in enumerate(getattr(msg, "tool_calls", None) or []):
            fn = tc.function
            args = fn.arguments if isinstance(fn.arguments, str) else json.dumps(fn.arguments)
            calls.append(ToolCall(id=getattr(tc, "id", None) or f"call_{i}", name=fn.name or "", arguments=args))
        text = msg.content or ""
        billed = billed_tokens(resp)
        usage = Usage(*billed, False) if billed is not None else self.estimate_usage(messages, text)
        return Completion(text=text, tool_calls=calls, usage=usage,
                          finish_reason=str(getattr(choice, "finish_reason", "") or ""))

    def estimate_usage(self, messages: list[dict[str, Any]], text: str) -> Usage:
        litellm = import_litellm()
        try:
            p = litellm.token_counter(model=self.model, messages=messages)
            c = litellm.token_counter(model=self.model, text=text) if text else 0
        except Exception as e:
            log.debug("%s: no tokenizer (%s); estimating with gpt-4o-mini's", self.model, type(e).__name__)
            p = litellm.token_counter(model="gpt-4o-mini", messages=messages)
            c = litellm.token_counter(model="gpt-4o-mini", text=text) if text else 0
        return Usage(int(p), int(c), 0, True)

