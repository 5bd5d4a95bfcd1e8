"""``memlab`` command line: data fetch/info and the demo (heavy imports stay inside commands)."""

from __future__ import annotations

import argparse
import sys


def _cmd_fetch(args: argparse.Namespace) -> int:
    from memlab.data import fetch_locomo

    kw = {"dest": args.dest, "force": args.force}
    if args.url:
        kw["url"] = args.url
    path = fetch_locomo(**kw)
    print(f"LoCoMo-10 ready at {path} (sha256 verified)")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from memlab.data import load_locomo

    data = load_locomo(args.path)
    print(f"{data.report.path}")
    print(", ".join(f"{k} {v:,}" for k, v in data.counts().items()))
    print(data.stats().to_string())
    print("load report:", data.report.summary())
    for issue in data.report.evidence_issues:
        rec = f" -> recovered {list(issue.recovered)}" if issue.recovered else ""
        print(f"  {issue.kind:9s} {issue.sample_id} qa[{issue.question_index}] {issue.raw!r}{rec}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from memlab.demo import run_demo

    run_demo(args.path, args.results)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memlab", description="Long-term conversational memory lab (LoCoMo-10).")
    sub = p.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="get or inspect the LoCoMo-10 file")
    dsub = data.add_subparsers(dest="data_command", required=True)
    f = dsub.add_parser("fetch", help="download LoCoMo-10 and verify its sha256")
    f.add_argument("--dest", help="target file (default ~/.cache/memlab/locomo10.json)")
    f.add_argument("--url", help="alternative source URL (a mirror)")
    f.add_argument("--force", action="store_true", help="download even if a verified copy exists")
    f.set_defaults(func=_cmd_fetch)
    i = dsub.add_parser("info", help="validate a LoCoMo file and print its statistics and load report")
    i.add_argument("path", nargs="?")
    i.set_defaults(func=_cmd_info)
    d = sub.add_parser("demo", help="the README demo on the embedded offline default")
    d.add_argument("--path", help="LoCoMo file (default: $MEMLAB_LOCOMO, then the user cache)")
    d.add_argument("--results", help="results root (default ./results)")
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    from memlab.data import ChecksumMismatchError, DataNotFoundError, LoCoMoFormatError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (DataNotFoundError, ChecksumMismatchError, LoCoMoFormatError, ConnectionError) as e:
        print(f"memlab: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
