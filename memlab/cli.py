"""``memlab`` command line: data fetch/info and the demo (heavy imports stay inside commands)."""

from __future__ import annotations

import argparse
import sys


def _cmd_fetch(args: argparse.Namespace) -> int:
    from memlab.data import fetch_locomo

    if args.dataset != "locomo":  # longmemeval-s|-m|-oracle
        from memlab.data import LONGMEMEVAL_FILES, fetch_longmemeval, sha256_file

        mirror = {"base_url": args.url.rstrip("/") + "/"} if args.url else {}
        path = fetch_longmemeval(args.dataset, dest=args.dest, sha256=args.sha256, unpinned=args.unpinned,
                                 force=args.force, **mirror)
        digest = sha256_file(path)
        if args.sha256:
            how = "matches the --sha256 given"
        elif not args.unpinned:
            how = "matches the pinned digest"
        else:
            pinned = LONGMEMEVAL_FILES[args.dataset][1]
            how = ("NOT verified (--unpinned); it is the pinned release" if digest == pinned else
                   f"NOT verified (--unpinned): differs from the pinned {pinned}; results on it are not comparable")
        print(f"{args.dataset} ready at {path}\n  sha256 {digest} ({how})\n  run with --set dataset.path={path} "
              f"(run.json records this sha256)")
        return 0
    kw = {"dest": args.dest, "force": args.force}
    if args.url:
        kw["url"] = args.url
    path = fetch_locomo(**kw)
    print(f"LoCoMo-10 ready at {path} (sha256 verified)")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from memlab.data import LongMemEval, dataset_name, load_dataset

    data = load_dataset(args.path)  # LoCoMo or LongMemEval, told by the file's fields
    print(f"{data.report.path}")
    print(f"format {dataset_name(data)}, " + ", ".join(f"{k} {v:,}" for k, v in data.counts().items()))
    if isinstance(data, LongMemEval):
        print("questions per type (abstention ones also counted in their type): "
              + ", ".join(f"{k} {v}" for k, v in data.type_counts().items()))
    rows = data.category_stats()
    cols = list(rows[0]) if rows else []
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    for line in [cols, *[[str(r[c]) for c in cols] for r in rows]]:  # a plain table: pandas takes seconds to import
        print("  ".join(v.rjust(width[c]) if i else v.ljust(width[c]) for i, (c, v) in enumerate(zip(cols, line))))
    print("load report:", data.report.summary())
    for issue in data.report.evidence_issues:
        rec = f" -> recovered {list(issue.recovered)}" if issue.recovered else ""
        print(f"  {issue.kind:9s} {issue.sample_id} qa[{issue.question_index}] {issue.raw!r}{rec}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from memlab.demo import run_demo

    run_demo(args.path, args.results)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from memlab.eval import format_summary
    from memlab.run import ExperimentConfig
    from memlab.run.executors import run_grid
    from memlab.run.steps import over_budget

    if args.resume:
        if args.config:
            raise SystemExit("memlab run: give either a CONFIG or --resume RUN_DIR, not both")
        if args.reuse:
            raise SystemExit("memlab run: --reuse starts from a CONFIG; --resume finishes its own folder")
        runs = run_grid(resume=args.resume, executor=args.executor, address=args.address, overrides=args.set or None,
                        force_config=args.force_config, trust_run_config=args.trust_run_config)
    else:
        if not args.config:
            raise SystemExit("memlab run: give a CONFIG (a file or a shipped config name) or --resume RUN_DIR")
        cfg = ExperimentConfig.from_yaml(args.config)
        if args.set:
            cfg = cfg.with_overrides(args.set)
        if args.plan:
            from memlab.run.plan import format_plan, plan_config

            for c in cfg.expand():
                print(f"{c.name}: " + format_plan(plan_config(c, probe=not args.no_probe)))
            return 0
        if args.reuse and (args.executor or cfg.run.executor) == "ray":
            raise SystemExit("memlab run: --reuse works with the local executor only")
        runs = run_grid(cfg, results=args.results, executor=args.executor, address=args.address, reuse=args.reuse)
    rc = 0
    for run in runs:
        judged = ("j", "j_lo", "j_hi", "j_sd", "judge_errors") if run.config.judge.model else ()
        if judged:  # J under the profile's other verdict rule (LongMemEval's official one), where it differs
            from memlab.eval.longmemeval_tables import differs_from_j

            judged += tuple(f"{c}{s}" for c in ("j_strict", "j_official") if differs_from_j(run.predictions, c)
                            for s in ("", "_lo", "_hi"))
        called = "calls_qa" in run.summary and bool((run.summary["calls_qa"].fillna(0) > 0).any())
        # an offline reader sends nothing to a model: its prompt tokens and calls are not printed
        cols = [c for c in ("label", "n", "n_scored", "errors", "f1", "f1_lo", "f1_hi", "bleu1", *judged, "recall@10",
                            *(("prompt_tokens_qa",) if called else ()), "context_tokens_qa", "embedding_tokens_qa",
                            *(("calls_qa",) if called else ()), "latency_p50_s")
                if c in run.summary.columns]
        m = run.info.get("models", {})
        ext = run.info.get("extraction") or {}
        by_role = (run.info.get("role_errors") or {}).items()  # every role's errors, the judge's too
        errs = ", ".join(f"{role} {r['errors']} of {r['of']}" for role, r in by_role)
        print(f"\n{run.run_dir}  [{run.status}]  ({run.info['timings']['total_s']:.1f} s; model calls "
              f"{m.get('model_calls', 0)}, served from cache {m.get('cache_hits', 0)}, malformed tool calls "
              f"{m.get('malformed_tool_calls', 0)}; " + (f"errors: {errs}; " if errs else "") + "extraction "
              f"{'from cache' if ext.get('from_cache') else 'ran'}, ops failed {ext.get('ops_failed', 0)}, "
              f"malformed {ext.get('malformed_tool_calls', 0)})")
        from memlab.run.plan import format_plan_vs_actual

        line = format_plan_vs_actual(run.info)
        if line:
            print("  " + line)
        roles = run.info.get("model_roles", [])
        if len(roles) > 1 or any(not r.startswith("embedder:") for r in roles):
            print("  " + "\n  ".join(roles))  # which endpoint each role used, and the local embedder
        print(format_summary(run.summary[cols]))
        for line in over_budget(run.info, run.config.run.max_error_rate):
            print(f"memlab: {line}; they are not scored. See predictions.parquet (columns error, judge_error) "
                  f"and traces/extraction.jsonl; retry them with: memlab run --resume {run.run_dir}", file=sys.stderr)
            rc = 3
    return rc


def _cmd_report(args: argparse.Namespace) -> int:
    import warnings

    from memlab.run.report import DEFAULT_METRICS, format_report, format_wide, report_table, write_report

    if args.profiles:
        from memlab.run.rescore import profile_table

        for run in args.runs:
            print(f"{run}: one run under the scoring profiles {args.profiles}")
            print(format_wide(profile_table(run, [p.strip() for p in args.profiles.split(",") if p.strip()],
                                            trust_run_config=args.trust_run_config)))
        return 0
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else DEFAULT_METRICS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = report_table(args.runs, metrics=metrics, compare=True,
                             questions="intersection" if args.intersection else "same")
    for w in caught:
        print(f"memlab report: warning: {w.message}", file=sys.stderr)
    if args.out:
        print(f"wrote {write_report(table, args.out, args.format)}")
    else:
        print(format_report(table, args.format or "text"))
        from pathlib import Path

        from memlab.run.plan import format_plan_vs_actual
        from memlab.run.results import read_run_json

        for d in table.run_dir.unique():  # what each run planned to ask of its models, beside what it asked
            line = format_plan_vs_actual(read_run_json(Path(d) / "run.json"))
            if line:
                print(f"{d}: {line}")
    if args.html:
        from memlab.report_html import write_html

        print(f"wrote {write_html(args.html, [d for d in table.run_dir.unique()], table=table)}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from memlab.run.compare import compare
    from memlab.run.labels import legend_lines, run_legend
    from memlab.run.results import load_run

    runs = list(args.runs)
    if args.baseline:
        runs = [args.baseline] + [r for r in runs if r != args.baseline]
    if len(runs) < 2:
        raise SystemExit("memlab compare: give at least two runs (the first, or --baseline, is the baseline)")
    metrics = args.metrics.split(",") if args.metrics else None
    kw = {"metrics": metrics} if metrics else {}
    loaded = [load_run(r) for r in runs]
    cmp = compare(*loaded, questions="intersection" if args.intersection else "same",
                  threshold_metric=args.threshold_metric, threshold=args.threshold, token_matched=args.token_matched,
                  **kw)
    print(cmp)
    print("Runs (label: folder (config values that differ between the runs)):")
    print("\n".join(legend_lines(run_legend(loaded))))
    for name in cmp.runs:
        fl = cmp.flipped[cmp.flipped["run"] == name] if len(cmp.flipped) else cmp.flipped
        if len(fl):
            fixed = int(fl.direction.str.startswith("fixed").sum())
            print(f"{name}: {len(fl)} questions flipped ({fixed} fixed, {len(fl) - fixed} broken)")
    return 0


def _cmd_rescore(args: argparse.Namespace) -> int:
    from memlab.eval import format_summary
    from memlab.run.rescore import explain, rescore

    res = rescore(args.run, args.profile, allow_model_calls=args.allow_model_calls, errata=args.errata,
                  trust_run_config=args.trust_run_config)
    print(f"{args.run} under the {res.profile} profile -> {res.path}")
    print(format_summary(res.summary))
    print(explain(res))
    if res.info.get("errata_corrected") or res.info.get("errata_excluded"):
        print(f"errata: {res.info['errata_corrected']} corrected, {res.info['errata_excluded']} excluded")
    return 0


def _shipped() -> str:
    from importlib import resources

    return ", ".join(sorted(p.name[:-5] for p in resources.files("memlab.configs").iterdir()
                            if p.name.endswith(".yaml")))


def _cmd_components(args: argparse.Namespace) -> int:
    """Every registered component, by family, with its settings (the config key that takes them)."""
    from memlab.run.components import describe_components

    print(describe_components())
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from memlab.llm.serve import ServeSettings, serve

    return serve(ServeSettings(model=args.model, alias=args.alias, ctx=args.ctx, slots=args.slots,
                               threads=args.threads, port=args.port, verbose=args.verbose),
                 say=lambda line: print(line, flush=True), stdin_eof=args.stop_on_stdin_eof)


def _cmd_cache(args: argparse.Namespace) -> int:
    from memlab.index.machine_cache import clear, info_text

    if args.cache_command == "clear":
        n = clear(args.dir, args.model)
        print(f"removed {n:,} entries" + (f" of {args.model}" if args.model else ""))
    print(info_text(args.dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memlab", description="Long-term conversational memory lab (LoCoMo-10).")
    sub = p.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="get or inspect the LoCoMo-10 file")
    dsub = data.add_subparsers(dest="data_command", required=True)
    f = dsub.add_parser("fetch", help="download LoCoMo-10 (or a LongMemEval variant) and verify its sha256")
    f.add_argument("dataset", nargs="?", default="locomo",
                   choices=["locomo", "longmemeval-s", "longmemeval-m", "longmemeval-oracle"])
    f.add_argument("--sha256", help="LongMemEval: the checksum to verify against")
    f.add_argument("--unpinned", action="store_true",
                   help="LongMemEval: download without verifying the pinned checksum (prints the file's)")
    f.add_argument("--dest", help="target file (default ~/.cache/memlab/locomo10.json)")
    f.add_argument("--url", help="alternative source URL (a mirror; LongMemEval: the folder of the release's files)")
    f.add_argument("--force", action="store_true", help="download even if a verified copy exists")
    f.set_defaults(func=_cmd_fetch)
    i = dsub.add_parser("info", help="validate a LoCoMo or LongMemEval file (told by its fields), print its "
                                     "statistics and load report")
    i.add_argument("path", nargs="?")
    i.set_defaults(func=_cmd_info)
    d = sub.add_parser("demo", help="the README demo on the embedded offline default")
    d.add_argument("--path", help="LoCoMo file (default: $MEMLAB_LOCOMO, then the user cache)")
    d.add_argument("--results", help="results root (default ./results)")
    d.set_defaults(func=_cmd_demo)
    r = sub.add_parser("run", help="run an experiment config (an ablation runs every grid point)")
    r.add_argument("config", nargs="?", help=f"YAML file or a shipped config name ({_shipped()}); `memlab "
                   "components` lists each registered component with its settings")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set retrieval.top_k=20 (repeatable)")
    r.add_argument("--resume", metavar="RUN_DIR",
                   help="finish a killed or errored run: its missing and errored questions")
    r.add_argument("--force-config", action="store_true",
                   help="with --resume: apply the --set overrides to the remaining questions")
    r.add_argument("--trust-run-config", action="store_true",
                   help="with --resume: use endpoints, API key variables and prompt files from the run folder's "
                        "config.yaml that you did not start the run with (refused by default: a folder from "
                        "elsewhere could send your keys or files to its own server)")
    r.add_argument("--results", help="results root (default ./results or $MEMLAB_RESULTS)")
    r.add_argument("--reuse", action="store_true",
                   help="return the newest complete run of the same config, data and code under the results root "
                        "instead of running it again (each grid point on its own)")
    r.add_argument("--executor", choices=("local", "ray"),
                   help="where the runs execute (default: the config's run.executor, local): ray = (grid cell x "
                        "conversation) tasks on a Ray cluster (pip install 'memlab[ray]')")
    r.add_argument("--address", help="with --executor ray: the cluster to join (auto, ray://HOST:10001); "
                                     "default run.ray_address, else a local Ray instance")
    r.add_argument("--plan", action="store_true",
                   help="print what the run will ask of each model role (calls, prompt tokens, completion tokens "
                        "bounded by max_tokens, dollars; for a local endpoint the wall time from a two-request "
                        "throughput probe) without running it")
    r.add_argument("--no-probe", action="store_true", help="with --plan: no throughput probe (no request at all)")
    r.set_defaults(func=_cmd_run)
    rp = sub.add_parser("report", help="per-category table of runs with 95 %% intervals (text, md, latex, csv, html)")
    rp.add_argument("runs", nargs="+", help="run folders under results/ (unfinished ones are skipped, with a warning)")
    rp.add_argument("--format", choices=("text", "md", "latex", "csv"),
                    help="table format (default text; with --out, from the file suffix .md/.tex/.csv)")
    rp.add_argument("--out", metavar="FILE", help="write the table to FILE instead of printing it")
    rp.add_argument("--metrics", help="comma-separated summary columns (default: f1,bleu1,j,recall@10,prompt_tokens_qa,"
                                      "context_tokens_qa,calls_qa,latency_p50_s)")
    rp.add_argument("--html", metavar="OUT.html", help="also write one self-contained HTML page: tables, plots and "
                                                       "a question browser with the three trace layers")
    rp.add_argument("--intersection", action="store_true",
                    help="compare the runs on their shared questions when the question sets differ (default: no "
                         "paired comparison then, with a note)")
    rp.add_argument("--profiles", help="show one run under these scoring profiles side by side, "
                                       "e.g. locomo,mem0,trpc-agent-go (no model calls: J from the cache)")
    rp.add_argument("--trust-run-config", action="store_true",
                    help="with --profiles: use an errata file the run folder's config names that you did not start "
                         "the run with")
    rp.set_defaults(func=_cmd_report)
    cp = sub.add_parser("compare", help="paired comparison of runs (CIs, permutation, McNemar, MDD; Holm for >2)")
    cp.add_argument("runs", nargs="+", help="run folders; all are compared with the first (or --baseline)")
    cp.add_argument("--baseline", help="the run the others are compared with (default: the first)")
    cp.add_argument("--intersection", action="store_true",
                    help="compare on the shared questions when the question sets differ (default: refuse)")
    cp.add_argument("--metrics", help="comma-separated (default f1,bleu1,em,j,context_recall)")
    cp.add_argument("--threshold-metric", default="f1", help="metric that defines correct for McNemar/flips")
    cp.add_argument("--threshold", type=float, default=0.5, help="correct = metric >= this (default 0.5)")
    cp.add_argument("--token-matched", type=int, metavar="BUDGET",
                    help="a comparison at equal context budget: every run must have been made with "
                         "retrieval.context_tokens=BUDGET (refused otherwise, with the command that makes it); the "
                         "context tokens per question are compared too")
    cp.set_defaults(func=_cmd_compare)


    rs = sub.add_parser("rescore", help="score a finished run under another scoring profile (no model calls)")
    rs.add_argument("run", help="a finished run folder")
    rs.add_argument("--profile", default="locomo",
                    help="locomo (default), mem0, trpc-agent-go (LoCoMo runs); longmemeval, longmemeval-official "
                         "(LongMemEval runs; the official rule: any reply containing yes)")
    rs.add_argument("--errata", help="CSV qid,answer (corrected answer or 'invalid'); default: the run's")
    rs.add_argument("--allow-model-calls", action="store_true",
                    help="call the judge model for verdicts not in the response cache (default: leave J empty)")
    rs.add_argument("--trust-run-config", action="store_true",
                    help="use an errata file (and with --allow-model-calls the judge endpoint, key variable and "
                         "prompt) the run folder's config names that you did not start the run with")
    rs.set_defaults(func=_cmd_rescore)
    cm = sub.add_parser("components", help="every registered component (extractors, answer arms, embedders, keyword "
                        "scorers, judges, systems) with its settings and the config key that takes them")
    cm.set_defaults(func=_cmd_components)
    ca = sub.add_parser("cache", help="the machine cache of model vectors (minilm, e5, litellm embedders, SPLADE) "
                        "every results root shares: info, clear")
    casub = ca.add_subparsers(dest="cache_command", required=True)
    for name, what in (("info", "its folder, size and entries per model"),
                       ("clear", "delete its entries (all, or one model's with --model)")):
        c = casub.add_parser(name, help=what)
        c.add_argument("--dir", help="the cache folder (default $MEMLAB_CACHE_DIR, else $XDG_CACHE_HOME/memlab, "
                                     "else ~/.cache/memlab; a config's run.cache_dir)")
        if name == "clear":
            c.add_argument("--model", metavar="ID", help="only this model's entries (its id as `memlab cache info` "
                                                         "lists it)")
        c.set_defaults(func=_cmd_cache)
    sv = sub.add_parser("serve", help="serve a GGUF model with llama.cpp on 127.0.0.1 (OpenAI-compatible; default: "
                                      "the packaged SmolLM2-135M-Instruct); prints the api_base, Ctrl-C stops it")
    sv.add_argument("--model", metavar="GGUF", help="a GGUF model file (default: SmolLM2-135M-Instruct from "
                                                   "memlab[local])")
    sv.add_argument("--alias", default="local", help="the name it answers to; a config calls it openai/ALIAS "
                                                     "(default local)")
    sv.add_argument("--ctx", type=int, default=8192, help="context window per slot, tokens (default 8192)")
    sv.add_argument("--slots", type=int, default=1, help="requests computed side by side (default 1; raise "
                                                         "models.concurrency to match)")
    sv.add_argument("--threads", type=int, help="CPU threads (default: the cores this process may use, as "
                                                "run.threads)")
    sv.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: a free one; refused when busy)")
    sv.add_argument("--verbose", action="store_true", help="show llama.cpp's own log")
    sv.add_argument("--stop-on-stdin-eof", action="store_true", help="also stop when standard input closes (how "
                    "memlab.llm.serve.LocalServer ties a server to the process that started it)")
    sv.set_defaults(func=_cmd_serve)
    return p


#: The exit status of a run the spend cap stopped (2: an error, 3: errors over run.max_error_rate, 130/143: signals).
SPEND_CAP_EXIT = 4


def main(argv: list[str] | None = None) -> int:
    from memlab.data import ChecksumMismatchError, ChecksumNotPinnedError, DataNotFoundError, LoCoMoFormatError

    args = build_parser().parse_args(argv)
    errors: tuple[type[BaseException], ...] = (DataNotFoundError, ChecksumMismatchError, LoCoMoFormatError,
                                               ConnectionError, ChecksumNotPinnedError)
    if args.command == "serve":
        from memlab.llm.serve import ServeError

        errors += (ServeError,)
    if args.command == "cache":  # an unknown --model, a cache file failing its integrity check, a locked file
        import sqlite3

        from memlab.cache_integrity import CacheCorruptError
        from memlab.index.machine_cache import UnknownCacheModel

        errors += (CacheCorruptError, UnknownCacheModel, sqlite3.OperationalError)
    if args.command in ("run", "report", "compare", "rescore"):
        from memlab.eval.errata import ErrataError
        from memlab.eval.profiles import ProfileError
        from memlab.eval.stats import ComparisonError
        from memlab.run import ConfigError
        from memlab.run.extraction import ExtractionFailed
        from memlab.run.ray_cluster import RayNotInstalled
        from memlab.run.records import RecordSchemaError
        from memlab.run.results import RunFileError
        from memlab.run.runner import RunStorageError
        from memlab.rundir import RunFolderBusy
        from memlab.systems.base import SystemFailure

        errors += (ConfigError, FileNotFoundError, ExtractionFailed, RecordSchemaError, ErrataError, ProfileError,
                   ComparisonError, RayNotInstalled, RunFileError, RunFolderBusy, RunStorageError, SystemFailure)
        if args.command == "report":
            from memlab.run.report import ReportError

            errors += (ReportError,)
    try:
        return args.func(args)
    except errors as e:
        print(f"memlab: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # the run printed how to resume; 128 + the signal, as a shell reports it
        spend = sys.modules.get("memlab.llm.spend")  # loaded whenever a cap could have stopped the run
        if spend is not None and isinstance(e, spend.SpendCapReached):  # run.max_calls / run.max_usd (it said so)
            return SPEND_CAP_EXIT
        return 143 if type(e).__name__ == "Terminated" else 130
    except Exception as e:  # disk full, read-only folder, name too long: one line, no traceback
        if args.command not in ("run", "report", "compare", "rescore"):
            raise
        from memlab.run.runner import is_storage_error, storage_message

        if not is_storage_error(e):
            raise
        print(f"memlab: {storage_message(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
