"""A scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests (no outside network, ever).

Each request to ``/v1/chat/completions`` takes the next step of the script; ``/v1/embeddings``
returns deterministic hashed vectors (or a scripted fault). A step is a `Reply`: plain text,
tool calls, usage numbers (prompt / completion / cached), a delay, an HTTP error status, a
malformed body, a hang past the client's timeout, or an error with ``Retry-After``. Every request
body is recorded so a test can check what the model was shown.

Real servers' quirks are switches (``ScriptedServer.imitating("llama-cpp-python")`` sets them as
measured; see `QUIRKS`): tool calls written as text, HTTP 500 on a tool-call message without
``content``, no or per-token embeddings, a ``/v1/models`` listing with or without a context length,
and one request at a time (``serial``: a request that arrives while another runs waits, and is
counted in ``busy_arrivals``). `closed_port_api_base` gives an endpoint that is down.

Scripted 'models' (functions of the request that read their prompt) are in `memlab.testing.models`; ``python -m
memlab.testing serve`` starts a server for a dry run of a config from the shell (`memlab.testing.__main__`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np


@dataclass
class Reply:
    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Each ``{"name": ..., "arguments": dict or raw str}``; a raw string is sent as is (malformed JSON)."""
    prompt_tokens: int | None = 11
    completion_tokens: int | None = 7
    cached_tokens: int | None = None
    delay: float = 0.0
    status: int = 200
    malformed: bool = False
    hang: float = 0.0
    """Sleep this long before answering (set past the client's timeout)."""
    retry_after: float | None = None
    """With an error ``status`` (429, 503): sent as the ``Retry-After`` header."""
    echo_auth: bool = False
    """With an error ``status``: the request's ``Authorization`` header is echoed in the error body (as some
    proxies do), so a test can check that no stored error text keeps the key."""
    finish_reason: str | None = None
    """Sent as is (None: ``tool_calls`` with tool calls, else ``stop``; ``length`` when the request's
    ``max_tokens`` is below ``completion_tokens``, as a real server cuts the reply there)."""


#: Quirks of real OpenAI-compatible servers, as measured (issue 13; llama-server: issue 34, against llama.cpp's
#: own server serving SmolLM2-135M-Instruct, `benchmarks/real_vs_scripted.py`) or documented by each server.
#: ``tools_as_text``: with ``tool_choice="auto"`` a tool call comes back as the text ``functions.<name>:``
#: (a forced ``tool_choice`` gives a well-formed call); ``require_content``: HTTP 500 when an assistant
#: message with tool calls has no ``content``; ``embeddings``: "ok", "per-token" (one vector per token,
#: no pooling), "error" (HTTP 500) or "unsupported" (HTTP 501, llama-server without ``--embeddings``);
#: ``serial``: one request at a time, ``/models`` included; ``models``: the ``/v1/models`` listing;
#: ``ignore_tool_choice``: a forced tool is not honoured; ``n_ctx``: a prompt over this many tokens (about four
#: characters each) is refused with HTTP 400 ``exceed_context_size_error`` naming both sizes, as llama-server
#: does; ``any_model``: every model name is answered by the one model served (llama-server), named in the reply;
#: ``prompt_cache``: the prompt's tokens shared with the previous request (its common prefix, four characters a
#: token) are reported as cached (``prompt_tokens_details.cached_tokens``), as llama-server's slot cache does.
QUIRKS: dict[str, dict[str, Any]] = {
    "llama-cpp-python": {"tools_as_text": True, "require_content": True, "embeddings": "error", "serial": True,
                         "models": [{"id": "local", "object": "model", "owned_by": "me"}]},
    "llama-server": {"require_content": True, "embeddings": "unsupported", "serial": True, "n_ctx": 8192,
                     "any_model": "local", "prompt_cache": True,
                     "models": [{"id": "local", "object": "model", "owned_by": "llamacpp",
                                 "meta": {"n_ctx_train": 8192, "n_ctx": 8192}}]},
    "ollama": {"ignore_tool_choice": True,
               "models": [{"id": "qwen2.5:0.5b-instruct", "object": "model", "owned_by": "library"}]},
    "vllm": {"models": [{"id": "Qwen/Qwen2.5-0.5B-Instruct", "object": "model", "max_model_len": 32768}]},
}


def closed_port_api_base() -> str:
    """An ``api_base`` on 127.0.0.1 where nothing listens (an endpoint that is down)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class ScriptedServer:
    """Start with ``with ScriptedServer([...]) as srv:``; point litellm at ``srv.api_base``."""

    def __init__(self, script: list[Reply] | None = None, default: Reply | None = None, embed_dim: int = 16,
                 responder: Callable[[dict[str, Any]], Reply] | None = None, tools_as_text: bool = False,
                 require_content: bool = False, embeddings: str = "ok", serial: bool = False,
                 models: list[dict[str, Any]] | None = None, ignore_tool_choice: bool = False,
                 models_delay: float = 0.0, n_ctx: int | None = None, any_model: str | None = None,
                 prompt_cache: bool = False, port: int = 0):
        if embeddings not in ("ok", "per-token", "error", "unsupported"):
            raise ValueError(f"embeddings = {embeddings!r}; expected ok, per-token, error or unsupported")
        self.n_ctx = n_ctx
        self.port = port
        """The port on 127.0.0.1 (0: a free one)."""
        self.any_model = any_model
        self.prompt_cache = prompt_cache
        self._last_prompt = ""
        self.tools_as_text = tools_as_text
        self.require_content = require_content
        self.embeddings_mode = embeddings
        self.serial = serial
        self.ignore_tool_choice = ignore_tool_choice
        self.models_delay = models_delay
        """Seconds a ``/models`` answer takes (a busy local server answers its probe late too)."""
        self.models = models if models is not None else [{"id": "scripted", "object": "model"}]
        self._busy = threading.Lock()
        self._local = threading.local()
        self.in_flight = 0
        self.max_in_flight = 0
        self.busy_arrivals = 0
        """Requests that arrived while a serial server was still working on another one."""
        self.arrivals: list[float] = []
        self.script: deque[Reply] = deque(script or [])
        self.default = default
        self.responder = responder
        """Called with the request body when the script is empty (a scripted 'model' that reads its prompt)."""
        self.embed_dim = embed_dim
        self.requests: list[dict[str, Any]] = []
        self.embed_requests: list[dict[str, Any]] = []
        self.embed_faults: deque[Reply] = deque()
        self.forced_arguments: dict[str, dict[str, Any]] = {}
        """Arguments of the well-formed call a forced ``tool_choice`` gets when the script has no tool call."""
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    # -------------------------------------------------------------------------------- life
    @classmethod
    def imitating(cls, server: str, script: list[Reply] | None = None, **kw: Any) -> ScriptedServer:
        """A scripted server with the quirks of a real one (`QUIRKS`: llama-cpp-python, llama-server,
        ollama, vllm); ``kw`` overrides single quirks or passes ``responder``/``default``."""
        if server not in QUIRKS:
            raise ValueError(f"no quirks known for {server!r}; known: {', '.join(QUIRKS)}")
        return cls(script, **{**QUIRKS[server], **kw})

    def start(self) -> ScriptedServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                with server._serving(work=False):
                    if self.path.rstrip("/").endswith("/models"):
                        time.sleep(server.models_delay)
                        self._send(200, {"object": "list", "data": server.models})
                    else:
                        self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                with server._serving():
                    if self.path.rstrip("/").endswith("/embeddings"):
                        server._embeddings(self, body)
                    elif self.path.rstrip("/").endswith("/chat/completions"):
                        server._chat(self, body)
                    else:
                        self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _send(self, status: int, obj: Any, raw: bytes | None = None,
                      headers: dict[str, str] | None = None) -> None:
                data = raw if raw is not None else json.dumps(obj).encode()
                server._finished()  # no longer in flight once the answer is on its way
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        from memlab.breaker import breaker

        breaker(self.api_base).reset()  # a port reused from a test's dead endpoint: this server answers
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def api_base(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @contextlib.contextmanager
    def _serving(self, work: bool = True) -> Iterator[None]:
        """Count requests in flight; a ``serial`` server handles one at a time (the others wait).

        ``work``: a chat or embedding request (counted in ``arrivals``/``busy_arrivals``); a ``/models``
        probe waits like them but is not counted."""
        with self._lock:
            if work:
                self.arrivals.append(time.monotonic())
            if work and self.serial and self._busy.locked():
                self.busy_arrivals += 1
        if self.serial:
            self._busy.acquire()
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self._local.counted = True
        try:
            yield
        finally:
            self._finished()
            if self.serial:
                self._busy.release()

    def _finished(self) -> None:
        if getattr(self._local, "counted", False):
            self._local.counted = False
            with self._lock:
                self.in_flight -= 1

    # ---------------------------------------------------------------------------- answers
    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self.script:
                return self.script.popleft()
        if self.responder is not None:
            return self.responder(body)
        if self.default is not None:
            return self.default
        return Reply(status=500, text="script exhausted")

    @staticmethod
    def _work(h: Any, seconds: float) -> bool:
        """Spend ``seconds`` 'generating'; stop early (False) when the client closed its connection, as llama-server
        cancels a request whose client went away (measured: its slot is free at once)."""
        import select
        import socket

        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([h.connection], [], [], min(left, 0.05))
            if ready:
                try:
                    if h.connection.recv(1, socket.MSG_PEEK) == b"":
                        return False
                except OSError:
                    return False
        return True

    def _fault(self, h: Any, r: Reply) -> bool:
        for wait in (r.hang, r.delay):
            if wait and not self._work(h, wait):
                h.close_connection = True
                self._finished()
                return True  # the client went away: nothing to answer
        if r.malformed:
            h._send(200, None, raw=b'{"id": "x", "choices": [ {not json')
            return True
        if r.status != 200:
            message = r.text or f"scripted {r.status}"
            if r.echo_auth:
                message += f" (request headers: Authorization: {h.headers.get('Authorization')})"
            h._send(r.status, {"error": {"message": message, "type": "scripted", "code": r.status}},
                    headers={"Retry-After": f"{r.retry_after:g}"} if r.retry_after is not None else None)
            return True
        return False

    def _chat(self, h: Any, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)
        if self.require_content:
            bad = [i for i, m in enumerate(body.get("messages", []))
                   if m.get("role") == "assistant" and m.get("tool_calls") and "content" not in m]
            if bad:  # what llama-cpp-python's chat template did: a server error, every attempt
                h._send(500, {"error": {"message": f"chat template error: messages[{bad[0]}] has tool_calls "
                                                   "but no 'content'", "type": "server_error", "code": 500}})
                return
        if self.n_ctx is not None:
            n = len(json.dumps(body.get("messages", []))) // 4
            if n > self.n_ctx:  # llama-server's refusal, as measured
                h._send(400, {"error": {"code": 400, "message": f"request ({n} tokens) exceeds the available "
                                        f"context size ({self.n_ctx} tokens), try increasing it",
                                        "type": "exceed_context_size_error", "n_prompt_tokens": n,
                                        "n_ctx": self.n_ctx}})
                return
        r = self._next(body)
        if self._fault(h, r):
            return
        forced = isinstance(body.get("tool_choice"), dict) and not self.ignore_tool_choice
        if forced and not r.tool_calls:
            name = body["tool_choice"].get("function", {}).get("name", "")
            r = Reply(tool_calls=[{"name": name, "arguments": self.forced_arguments.get(name, {})}],
                      prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens)
        if self.tools_as_text and r.tool_calls and not forced:
            r = Reply(text=f"functions.{r.tool_calls[0]['name']}:", prompt_tokens=r.prompt_tokens,
                      completion_tokens=r.completion_tokens)
        finish = r.finish_reason or ("tool_calls" if r.tool_calls else "stop")
        cap = body.get("max_tokens")
        if isinstance(cap, int) and r.completion_tokens is not None and r.completion_tokens > cap:
            # a real server stops at the cap: the reply is cut (its text, and its tool calls' JSON)
            r = Reply(text=(r.text or "")[: 4 * cap], prompt_tokens=r.prompt_tokens, completion_tokens=cap,
                      cached_tokens=r.cached_tokens)
            finish = "length"
        msg: dict[str, Any] = {"role": "assistant", "content": r.text}
        if r.tool_calls:
            msg["tool_calls"] = [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": tc["name"], "arguments": tc["arguments"] if isinstance(tc["arguments"], str)
                              else json.dumps(tc["arguments"])}}
                for i, tc in enumerate(r.tool_calls)
            ]
        cached = r.cached_tokens
        if self.prompt_cache and cached is None and r.prompt_tokens is not None:
            prompt = json.dumps(body.get("messages", []))
            with self._lock:
                last, self._last_prompt = self._last_prompt, prompt
            shared = len(os.path.commonprefix([last, prompt]))
            cached = min(r.prompt_tokens, shared // 4)
        usage: dict[str, Any] | None = None
        if r.prompt_tokens is not None:
            usage = {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens or 0,
                     "total_tokens": r.prompt_tokens + (r.completion_tokens or 0)}
            if cached is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
        out = {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": self.any_model or body.get("model", "scripted"),
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        }
        if usage is not None:
            out["usage"] = usage
        h._send(200, out)

    def embed_vector(self, text: str) -> list[float]:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(self.embed_dim)
        return (v / np.linalg.norm(v)).tolist()

    def _embeddings(self, h: Any, body: dict[str, Any]) -> None:
        with self._lock:
            self.embed_requests.append(body)
            fault = self.embed_faults.popleft() if self.embed_faults else None
        if fault is not None and self._fault(h, fault):
            return
        if self.embeddings_mode == "unsupported":  # llama-server without --embeddings, as measured
            h._send(501, {"error": {"code": 501, "message": "This server does not support embeddings. Start it "
                                                           "with `--embeddings`", "type": "not_supported_error"}})
            return
        if self.embeddings_mode == "error":  # llama.cpp without --embedding
            h._send(500, {"error": {"message": "embedding is not enabled on this server (start it with "
                                               "--embedding)", "type": "server_error", "code": 500}})
            return
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        if self.embeddings_mode == "per-token":  # --embedding without pooling: one vector per token
            data = [{"object": "embedding", "index": i,
                     "embedding": [self.embed_vector(w) for w in (str(t).split() or [""])]}
                    for i, t in enumerate(inputs)]
        else:
            data = [{"object": "embedding", "index": i, "embedding": self.embed_vector(t)}
                    for i, t in enumerate(inputs)]
        n = sum(len(str(t).split()) for t in inputs)
        h._send(200, {"object": "list", "data": data, "model": body.get("model"),
                      "usage": {"prompt_tokens": n, "total_tokens": n}})


from memlab.testing.models import dry_run_model, echo, fixed, load_script, scripted_model  # noqa: E402,F401
