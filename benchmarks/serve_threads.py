"""The local model server's threads on a shared machine: one thread against every core, quiet and beside busy work.

    python benchmarks/serve_threads.py [--rounds 3] [--hogs 2] [--cap 120]     # ~3 min on 2 cores

Starts `memlab serve` (`LocalServer`, SmolLM2-135M on llama.cpp) with ``--threads 1`` and with every core, first
on a quiet machine, then beside ``--hogs`` single-threaded busy loops (what the test suite's other workers, or a
second job, are to the server). Each round sends one prefill request (about 750 prompt tokens, one token out,
its prompt new to the server's cache) and one generation request (128 tokens, ``ignore_eos``). Prints the
server's own prompt and generation rates (its ``timings``), each request's wall time, and the server process's CPU
seconds; then, per condition, the ratios of one thread to every core. A request cut at ``--cap`` seconds is
counted as a stall (its rate shown as ``stall``), never waited out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

from real_vs_scripted import post  # a sibling script (run from the repository root as benchmarks/...)

from memlab.llm.serve import LocalServer
from memlab.threads import resolve_threads

HOG = "import time\nwhile True:\n    sum(range(10_000))\n"


def server_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request(api_base: str, content: str, max_tokens: int, cap: float, **extra: object) -> tuple[dict | None, float]:
    """(the server's ``timings``, or None when cut at ``cap`` s; wall seconds)."""
    body = {"model": "local", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    t0 = time.perf_counter()
    try:
        status, reply = post(api_base, "/chat/completions", body, timeout=cap)
    except TimeoutError:
        return None, time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"{api_base}: HTTP {status}: {reply}")
    return reply["timings"], time.perf_counter() - t0


def measure(threads: int, rounds: int, cap: float) -> dict[str, float]:
    pp, tg, walls, stalls = [], [], 0.0, 0
    with LocalServer(ctx=4096, threads=threads) as srv:
        cpu0 = server_cpu_s(srv.proc.pid)
        for _ in range(rounds):
            words = " ".join(f"word{i}" for i in range(200))
            for content, n, extra, rates, key in (
                    (f"{uuid.uuid4().hex} Read this and reply with one word. {words}", 1, {}, pp, "prompt_per_second"),
                    (f"{uuid.uuid4().hex} Tell a long story.", 128, {"ignore_eos": True}, tg, "predicted_per_second")):
                timings, wall = request(srv.api_base, content, n, cap, **extra)
                walls += wall
                if timings is None:
                    stalls += 1
                else:
                    rates.append(timings[key])
        cpu = server_cpu_s(srv.proc.pid) - cpu0
    return {"pp": min(pp) if pp else 0.0, "tg": min(tg) if tg else 0.0, "wall": walls, "cpu": cpu,
            "stalls": stalls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=2, help="busy single-threaded processes beside the server")
    ap.add_argument("--cap", type=float, default=120.0, help="seconds after which a request counts as a stall")
    args = ap.parse_args()
    cores = resolve_threads(None)
    rows = []
    for label, hogs in (("quiet", 0), (f"beside {args.hogs} busy loops", args.hogs)):
        procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        try:
            got = {t: measure(t, args.rounds, args.cap) for t in sorted({1, cores})}
        finally:
            for p in procs:
                p.kill()
                p.wait()
        for t, m in got.items():
            rows.append((label, t, m))
        one, every = got[1], got[cores]
        rows.append((label, "ratio 1 / every core", {k: (one[k] / every[k] if every[k] else float("nan"))
                                                      for k in ("pp", "tg", "wall", "cpu")} | {"stalls": None}))
    print(f"{cores} cores; {args.rounds} rounds; the slowest round's rates (tokens/s); a request over "
          f"{args.cap:.0f} s is a stall\n")
    print("| machine | threads | prompt tok/s | generated tok/s | requests' wall s | server CPU s | stalls |")
    print("|---|---|---|---|---|---|---|")
    for label, t, m in rows:
        stalls = "" if m["stalls"] is None else str(m["stalls"])
        if isinstance(t, str):
            print(f"| {label} | {t} | ×{m['pp']:.2f} | ×{m['tg']:.2f} | ×{m['wall']:.2f} | ×{m['cpu']:.2f} | |")
        else:
            tg = f"{m['tg']:.0f}" if m["tg"] else "stall"
            print(f"| {label} | {t} | {m['pp']:.0f} | {tg} | {m['wall']:.1f} | {m['cpu']:.1f} | {stalls} |")


if __name__ == "__main__":
    main()
