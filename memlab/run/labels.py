"""How runs and categories are named in reports, tables and plots, the one place every comparison takes them from
(``memlab report``, ``memlab compare``, the HTML page, `memlab.plots`, the notebooks).

A run's label (`run_labels`) is its config name plus at most two ``key=value`` that tell it apart from runs of the
same name beside it (``offline k=20``; the runs' ``config.yaml`` files are diffed), short enough for a plot
legend; `run_legend` is the table that maps each label to everything its config changes. A category's name is
its number and label (``1 multi-hop``), with ``(n=…)`` when asked."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from memlab.data.locomo import CATEGORY_LABELS
from memlab.run.config_migrate import short_name
from memlab.run.results import Run
from memlab.systems.base import read_by_system

#: Short names for swept keys in run labels.
KEY_ALIASES = {"retrieval.top_k": "k", "dataset.path": "data"}
#: Config keys that never change a result (names, how a run is driven): left out of run labels.
IGNORED_KEYS = ("name", "grid", "run.concurrency", "run.max_error_rate", "run.check_endpoint", "models.timeout",
                "models.max_retries", "run.cache_dir")
#: A label names at most this many config keys; the legend (`run_legend`) holds the full difference.
LABEL_KEYS = 2
#: A value in a label is cut to this many characters, a whole label to `LABEL_MAX` (the legend keeps both whole).
VALUE_MAX = 18
LABEL_MAX = 48


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_dict(run: Run) -> dict[str, Any]:
    """The run's config as its folder holds it, in today's spelling with every default filled in (a run written
    before a key moved compares with one written after: `memlab.run.config_migrate`)."""
    from memlab.run.config import recorded_dict

    p = run.run_dir / "config.yaml"
    d = recorded_dict(yaml.safe_load(p.read_text(encoding="utf-8")), str(p)) if p.is_file() else None
    return _flatten(d or run.config.to_dict())


def distinguishing(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per run, the config values (dotted keys) that are not the same in every run (name and grid aside)."""
    flat = [_config_dict(r) for r in runs]
    keys = sorted({k for f in flat for k in f})
    # a value a run's memory system never reads (mem0 and memlab's extractor) tells nothing about that run
    systems = [str(f.get("system.name") or "memlab") for f in flat]
    differ = [k for k in keys if k not in IGNORED_KEYS and not k.startswith("grid.")
              and len({yaml.safe_dump(f.get(k)) for f, s in zip(flat, systems) if read_by_system(k, s)}) > 1]
    return [{k: f.get(k) for k in differ if read_by_system(k, s)} for f, s in zip(flat, systems)]


def _short_keys(keys: Iterable[str]) -> dict[str, str]:
    keys = list(keys)
    last = [short_name(k) for k in keys]
    return {k: KEY_ALIASES.get(k, s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _fmt_value(v: Any, width: int | None = VALUE_MAX) -> str:
    if isinstance(v, list):
        s = "[" + ",".join(map(str, v)) + "]"
    elif isinstance(v, float):
        s = f"{v:g}"
    elif isinstance(v, str) and ("/" in v or "\\" in v) and width is not None:
        s = Path(v).name
    else:
        s = str(v)
    return s if width is None or len(s) <= width else s[: width - 1] + "…"


def _base_name(run: Run, diff: dict[str, Any]) -> str:
    """The run's name without the suffixes an ablation grid appended (``topk-top_k5`` -> ``topk``)."""
    parts = run.config.name.split("-")
    suffixes = {f"{short_name(k)}{v}" for k, v in diff.items()}
    while len(parts) > 1 and parts[-1] in suffixes:
        parts.pop()
    return "-".join(parts)


def _value_key(v: Any) -> str:
    return yaml.safe_dump(v)


def _label_keys(diffs: Sequence[dict[str, Any]], group: Sequence[int]) -> list[str]:
    """At most `LABEL_KEYS` keys that tell the runs of ``group`` (one base name) apart: greedily the key that
    separates the most runs not yet told apart (ties: an aliased key such as ``k``, then the shorter text)."""
    keys = list(dict.fromkeys(k for i in group for k in diffs[i]))
    keys = [k for k in keys if len({_value_key(diffs[i].get(k)) for i in group}) > 1]
    chosen: list[str] = []

    def classes(ks: Sequence[str]) -> int:
        return len({tuple(_value_key(diffs[i].get(k)) for k in ks) for i in group})

    while len(chosen) < LABEL_KEYS and classes(chosen) < len(group):
        best = max((k for k in keys if k not in chosen), default=None, key=lambda k: (
            classes([*chosen, k]), k in KEY_ALIASES, -sum(len(_fmt_value(diffs[i].get(k))) for i in group)))
        if best is None or classes([*chosen, best]) == classes(chosen):
            break
        chosen.append(best)
    return chosen


def _labels_and_keys(runs: Sequence[Run]) -> tuple[list[str], list[dict[str, Any]]]:
    diffs = distinguishing(runs)
    bases = [_base_name(r, d) for r, d in zip(runs, diffs)]
    shown: list[list[str]] = [[] for _ in runs]
    for base in dict.fromkeys(bases):
        group = [i for i, b in enumerate(bases) if b == base]
        if len(group) > 1:
            keys = _label_keys(diffs, group)
            # the first key on every run; a second only where the run's value is not the group's usual one
            usual = {k: max(vals := [_value_key(diffs[i].get(k)) for i in group], key=vals.count) for k in keys}
            for i in group:
                shown[i] = [k for j, k in enumerate(keys)
                            if k in diffs[i] and (j == 0 or _value_key(diffs[i].get(k)) != usual[k])]
    short = _short_keys(dict.fromkeys(k for d in diffs for k in d))
    labels = []
    for base, d, ks in zip(bases, diffs, shown):
        parts = [f"{short[k]}={_fmt_value(d[k])}" for k in ks]
        lab = " ".join([base, ", ".join(parts)]) if parts else base
        labels.append(lab if len(lab) <= LABEL_MAX else lab[: LABEL_MAX - 1] + "…")
    counts = {lab: labels.count(lab) for lab in labels}
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):  # identical configs (reruns), or values cut alike: numbered in order
        if counts[lab] > 1:
            seen[lab] = seen.get(lab, 0) + 1
            labels[i] = f"{lab} #{seen[lab]}"
    return labels, diffs


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Short, unique labels, one per run, in order: the config name plus at most `LABEL_KEYS` ``key=value``
    that tell apart runs of the same name (``offline k=20``), at most `LABEL_MAX` characters; runs still alike
    (identical configs) get `` #1``, `` #2``. `run_legend` maps each label to the runs' full difference."""
    return _labels_and_keys(runs)[0]


def run_legend(runs: Sequence[Run]) -> pd.DataFrame:
    """The legend of `run_labels`: per run its ``run`` label, config ``name``, ``folder`` and ``differs``, every
    config value that is not the same in all the runs (full key and value, ``; ``-joined; ``identical config``
    when there is none), so a short label never hides what a run changed."""
    labels, diffs = _labels_and_keys(runs)
    return pd.DataFrame({
        "run": labels, "name": [r.config.name for r in runs], "folder": [str(r.run_dir) for r in runs],
        "differs": ["; ".join(f"{k}={_fmt_value(v, None)}" for k, v in d.items()) or "identical config"
                    for d in diffs]})


def legend_lines(legend: pd.DataFrame) -> list[str]:
    """The legend as lines for a text report: ``label: folder (differs)``."""
    return [f"{r.run}: {r.folder} ({r.differs})" for r in legend.itertuples(index=False)]


def category_name(group: Any, n: int | None = None, label: str | None = None) -> str:
    """``1 multi-hop`` / ``overall 1-4``, with ``(n=…)`` when ``n`` is given; ``label``: the run's own label
    for the number (its summary's, e.g. LongMemEval's types), else LoCoMo's."""
    try:
        g = int(group)
        name = f"{g} {label if isinstance(label, str) and label else CATEGORY_LABELS.get(g, '')}".strip()
    except (TypeError, ValueError):
        name = str(group)
    return f"{name} (n={int(n):,})" if n is not None else name
