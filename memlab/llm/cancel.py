"""Cancelling model calls in flight when a run is interrupted.

A model call blocks its thread in a socket read until the server has generated the whole reply; on a slow local
model that is minutes. When a run is stopped (Ctrl-C, SIGTERM) those calls must end at once and the server
must stop generating: closing the connection does both (llama.cpp cancels a request whose client went away).
So the HTTP clients memlab hands litellm open their connections through `TrackingBackend`, which remembers each
socket; `cancel_calls` shuts every remembered socket down (a blocked read returns at once, the server sees the
connection closed) and makes every later call fail with `Cancelled` before it is sent, until `allow_calls`.
"""

from __future__ import annotations

import logging
import socket
import threading
import weakref
from typing import Any

from memlab.llm.errors import ModelError

log = logging.getLogger("memlab.llm")

_SOCKETS: weakref.WeakSet[socket.socket] = weakref.WeakSet()
_LOCK = threading.Lock()
_CANCELLED = threading.Event()
_REASON: list[str] = [""]


class Cancelled(ModelError):
    """The run was interrupted: this call was cut off (or never sent)."""


def cancelled() -> bool:
    return _CANCELLED.is_set()


def cancel_calls(reason: str = "the run was interrupted") -> int:
    """Refuse every new model call and close the connection of every call in flight (the server stops its
    work); returns how many open connections were shut down."""
    _REASON[0] = reason
    _CANCELLED.set()
    with _LOCK:
        socks = list(_SOCKETS)
    n = 0
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:  # already closed
            pass
    if n:
        log.info("cancelled %d model call connection(s): %s", n, reason)
    return n


def allow_calls() -> None:
    """Let model calls through again (a new run in the same process)."""
    _CANCELLED.clear()
    _REASON[0] = ""


def _track(stream: Any) -> Any:
    sock = stream.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        with _LOCK:
            _SOCKETS.add(sock)
    if _CANCELLED.is_set():  # connected while a cancel ran: cut it too
        cancel_calls(_REASON[0])
    return stream


def tracking_backend() -> Any:
    """An httpcore network backend that opens connections as the default one does and remembers their sockets."""
    import httpcore

    class TrackingBackend(httpcore.NetworkBackend):
        def __init__(self) -> None:
            self.inner = httpcore.SyncBackend()

        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            return _track(self.inner.connect_tcp(host, port, timeout=timeout, local_address=local_address,
                                                 socket_options=socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
            return _track(self.inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options))

        def sleep(self, seconds: float) -> None:
            self.inner.sleep(seconds)

    return TrackingBackend()


def cancellable_http_client() -> Any:
    """An ``httpx.Client`` whose connections `cancel_calls` can cut. httpx takes no network backend, so the
    transport's connection pool is given one; an httpx without that pool gets a plain client (calls then
    finish before the run stops, said in the log)."""
    import httpx

    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    if pool is not None and hasattr(pool, "_network_backend"):
        pool._network_backend = tracking_backend()
    else:
        log.warning("httpx %s: its connection pool takes no network backend; model calls in flight cannot be "
                    "cancelled when a run is interrupted", httpx.__version__)
    return httpx.Client(transport=transport, timeout=None)
