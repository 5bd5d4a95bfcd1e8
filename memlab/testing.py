"""A scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests (no outside network, ever).

Each request to ``/v1/chat/completions`` takes the next step of the script; ``/v1/embeddings``
returns deterministic hashed vectors (or a scripted fault). A step is a `Reply`: plain text,
tool calls, usage numbers (prompt / completion / cached), a delay, an HTTP error status, a
malformed body, or a hang past the client's timeout. Every request body is recorded so a test can
check what the model was shown.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
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


class ScriptedServer:
    """Start with ``with ScriptedServer([...]) as srv:``; point litellm at ``srv.api_base``."""

    def __init__(self, script: list[Reply] | None = None, default: Reply | None = None, embed_dim: int = 16,
                 responder: Callable[[dict[str, Any]], Reply] | None = None):
        self.script: deque[Reply] = deque(script or [])
        self.default = default
        self.responder = responder
        """Called with the request body when the script is empty (a scripted 'model' that reads its prompt)."""
        self.embed_dim = embed_dim
        self.requests: list[dict[str, Any]] = []
        self.embed_requests: list[dict[str, Any]] = []
        self.embed_faults: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    # -------------------------------------------------------------------------------- life
    def start(self) -> ScriptedServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path.rstrip("/").endswith("/embeddings"):
                    server._embeddings(self, body)
                elif self.path.rstrip("/").endswith("/chat/completions"):
                    server._chat(self, body)
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _send(self, status: int, obj: Any, raw: bytes | None = None) -> None:
                data = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
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

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

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

    def _fault(self, h: Any, r: Reply) -> bool:
        if r.hang:
            time.sleep(r.hang)
        if r.delay:
            time.sleep(r.delay)
        if r.malformed:
            h._send(200, None, raw=b'{"id": "x", "choices": [ {not json')
            return True
        if r.status != 200:
            h._send(r.status, {"error": {"message": r.text or f"scripted {r.status}", "type": "scripted",
                                         "code": r.status}})
            return True
        return False

    def _chat(self, h: Any, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)
        r = self._next(body)
        if self._fault(h, r):
            return
        msg: dict[str, Any] = {"role": "assistant", "content": r.text}
        if r.tool_calls:
            msg["tool_calls"] = [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": tc["name"], "arguments": tc["arguments"] if isinstance(tc["arguments"], str)
                              else json.dumps(tc["arguments"])}}
                for i, tc in enumerate(r.tool_calls)
            ]
        usage: dict[str, Any] | None = None
        if r.prompt_tokens is not None:
            usage = {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens or 0,
                     "total_tokens": r.prompt_tokens + (r.completion_tokens or 0)}
            if r.cached_tokens is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": r.cached_tokens}
        out = {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if r.tool_calls else "stop"}],
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
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        data = [{"object": "embedding", "index": i, "embedding": self.embed_vector(t)} for i, t in enumerate(inputs)]
        n = sum(len(str(t).split()) for t in inputs)
        h._send(200, {"object": "list", "data": data, "model": body.get("model"),
                      "usage": {"prompt_tokens": n, "total_tokens": n}})
