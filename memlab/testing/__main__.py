"""``python -m memlab.testing serve``: the scripted OpenAI-compatible server on 127.0.0.1, for dry runs.

It prints its ``api_base`` (the first line on standard output: ``api_base: http://127.0.0.1:PORT/v1``) and
serves until SIGINT or SIGTERM. Point a config at it (``--set models.api_base=... --set answer.model=openai/
scripted``) to run every role without a model or a key. Replies: ``--script FILE`` (a JSON or YAML list of
replies, `memlab.testing.models.load_script`) first, then the ``--mode``: ``model`` (reads its prompt as a model
would: memories per message, the first memory as the answer, CORRECT as the verdict), ``echo`` (the last user
message) or ``fixed`` (``--reply TEXT``), or ``none`` (HTTP 500 once the script is spent).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from memlab.testing import QUIRKS, ScriptedServer
from memlab.testing.models import MODES, fixed, load_script


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m memlab.testing")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve scripted replies on 127.0.0.1 until SIGINT/SIGTERM")
    s.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: a free one)")
    s.add_argument("--mode", choices=[*MODES, "fixed", "none"], default="model",
                   help="how requests are answered once the script is spent (default: model)")
    s.add_argument("--reply", help="the text of every reply (--mode fixed)")
    s.add_argument("--script", help="a JSON or YAML list of replies sent first, in order")
    s.add_argument("--imitate", choices=sorted(QUIRKS), help="a real server's quirks (memlab.testing.QUIRKS)")
    s.add_argument("--delay", type=float, default=0.0, help="seconds every reply of the mode takes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "fixed" and args.reply is None:
        print("python -m memlab.testing serve: --mode fixed needs --reply TEXT", file=sys.stderr)
        return 2
    if args.reply is not None and args.mode != "fixed":
        print(f"python -m memlab.testing serve: --reply goes with --mode fixed (not {args.mode})", file=sys.stderr)
        return 2
    try:
        script = load_script(args.script) if args.script else []
    except ValueError as e:
        print(f"python -m memlab.testing serve: {e}", file=sys.stderr)
        return 2
    base = None if args.mode == "none" else fixed(args.reply) if args.mode == "fixed" else MODES[args.mode]
    responder = base
    if base is not None and args.delay:
        def responder(body, _base=base):  # type: ignore[no-untyped-def]
            r = _base(body)
            r.delay = args.delay
            return r
    kw = {"responder": responder, "port": args.port}
    srv = ScriptedServer.imitating(args.imitate, script, **kw) if args.imitate else ScriptedServer(script, **kw)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        srv.start()
    except OSError as e:
        print(f"python -m memlab.testing serve: cannot listen on 127.0.0.1:{args.port} ({e.strerror or e})",
              file=sys.stderr)
        return 2
    print(f"api_base: {srv.api_base}", flush=True)
    print(f"serving scripted replies ({len(script)} scripted, then mode {args.mode}); stop with Ctrl-C or SIGTERM",
          file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.5):  # woken by the signal handler
            pass
    finally:
        srv.stop()
    print(f"stopped after {len(srv.requests)} chat and {len(srv.embed_requests)} embedding request(s)",
          file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
