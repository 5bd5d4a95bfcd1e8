"""``memlab.compare``: the one paired comparison of finished runs, used by the CLI (``memlab compare``,
``memlab report``), the HTML page, the notebooks and the tests (statistics in `memlab.eval.stats`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from memlab.data import sha256_file
from memlab.eval.comparison import ComparisonError
from memlab.eval.stats import Comparison, check_scored, compare_grid
from memlab.run.labels import run_labels
from memlab.run.results import Run, load_run

DEFAULT_METRICS = ("f1", "bleu1", "em", "j", "context_recall")
#: The top-k a token-matched run searches to (an upper bound: the budget, not k, decides how many memories fit).
TOKEN_MATCHED_TOP_K = 100


def dataset_sha(run: Run) -> str | None:
    """The dataset sha256 the run recorded; for older runs, the hash of its dataset file if still there."""
    sha = run.info.get("dataset_sha256")
    if sha:
        return str(sha)
    path = run.info.get("dataset")
    return sha256_file(path) if path and Path(path).is_file() else None


def _load(r: Run | str | Path) -> Run:
    return r if isinstance(r, Run) else load_run(r)


def compare(baseline: Run | str | Path, *runs: Run | str | Path, metrics: Sequence[str] = DEFAULT_METRICS,
            questions: str = "same", threshold_metric: str = "f1", threshold: float = 0.5, unit: str = "auto",
            n_boot: int = 2000, seed: int | None = None, names: Sequence[str] | None = None,
            token_matched: int | None = None) -> Comparison:
    """Each run against ``baseline`` (A), question by question, in the order given; every delta is run - A.

    `Comparison`: ``.table`` (run x group x metric: a, b, delta, lo, hi, p_perm, p_perm_holm, p_mcnemar,
    p_mcnemar_holm, wins, losses, ties, mdd, n), ``.flipped`` and ``.legend()``. p-values are Holm-adjusted over
    the whole table. Refuses runs over different datasets (sha256) or question sets (``questions='intersection'``
    compares the shared questions) and a run whose every question errored. ``unit``: ``auto`` (conversations when
    there are at least 6, else questions), ``conversation`` or ``question``, shared by the interval and the
    permutation test. ``seed`` defaults to the baseline's ``run.seed``; ``names`` label the runs (default: their
    short labels, `memlab.run.labels.run_labels`, whose legend ``run_legend`` maps each to its folder and config).
    ``token_matched``: a comparison at equal context budget -- every run must have been made with
    ``retrieval.context_tokens`` equal to it (`check_token_matched`), and the context tokens each question read
    are compared too.
    """
    if not runs:
        raise ComparisonError("compare: give a baseline and at least one more run")
    loaded = [_load(r) for r in (baseline, *runs)]
    folders = [r.run_dir.resolve() for r in loaded]
    twice = sorted({str(f) for f in folders if folders.count(f) > 1})
    if twice:  # a run against itself: every delta 0, every test meaningless
        raise ComparisonError(f"compare: {', '.join(twice)} given more than once; compare different runs")
    labels = list(names) if names is not None else run_labels(loaded)
    if len(labels) != len(loaded) or len(set(labels)) != len(labels):
        raise ComparisonError(f"compare: names must be {len(loaded)} distinct labels, got {labels}")
    for lab, r in zip(labels, loaded):
        check_scored(r.predictions, lab, r.run_dir)
    base = loaded[0]
    shas = {n: dataset_sha(r) for n, r in zip(labels, loaded)}
    if token_matched is not None:
        check_token_matched(loaded, labels, token_matched)
        metrics = (*metrics, "context_tokens") if "context_tokens" not in metrics else metrics
    cmp = compare_grid(base.predictions, {n: r.predictions for n, r in zip(labels[1:], loaded[1:])}, shas,
                        baseline_name=labels[0], metrics=metrics, questions=questions,
                        threshold_metric=threshold_metric, threshold=threshold, unit=unit, n_boot=n_boot,
                        seed=base.config.run.seed if seed is None else seed)
    if token_matched is not None:
        cmp.notes.append(f"token-matched: every run read at most {token_matched:,} context tokens per search "
                         f"(retrieval.context_tokens; o200k tokens of the memories given to the reader)")
    return cmp


def check_token_matched(runs: Sequence[Run], labels: Sequence[str], budget: int) -> None:
    """Every run made with ``retrieval.context_tokens = budget``; a `ComparisonError` naming each that was not and
    the command that makes it (the budget changes what a reader reads: it cannot be applied to a finished run)."""
    off = [f"{lab} ({r.run_dir}: retrieval.context_tokens = {r.config.retrieval.context_tokens}, "
           f"top_k = {r.config.retrieval.top_k})" for lab, r in zip(labels, runs)
           if r.config.retrieval.context_tokens != budget]
    if off:
        raise ComparisonError(
            f"compare --token-matched {budget}: not made at that budget: {'; '.join(off)}. Run each config as "
            f"memlab run CONFIG --set retrieval.context_tokens={budget} --set retrieval.top_k={TOKEN_MATCHED_TOP_K}")
