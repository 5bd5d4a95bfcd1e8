"""How runs and categories are named in reports, tables and plots: a run's label is its name plus the config
values that distinguish it from the runs beside it (the runs' ``config.yaml`` files are diffed); a category's
name is its number and label (``1 multi-hop``), with ``(n=…)`` when asked."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from memlab.data.locomo import CATEGORY_LABELS
from memlab.run.results import Run
from memlab.systems.base import read_by_system

#: Short names for swept keys in run labels.
KEY_ALIASES = {"retrieval.top_k": "k"}
#: Config keys that never change a result (names, how a run is driven): left out of run labels.
IGNORED_KEYS = ("name", "grid", "run.concurrency", "run.max_error_rate", "run.check_endpoint", "models.timeout",
                "models.max_retries", "run.cache_dir")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_dict(run: Run) -> dict[str, Any]:
    p = run.run_dir / "config.yaml"
    d = yaml.safe_load(p.read_text(encoding="utf-8")) if p.is_file() else run.config.to_dict()
    return _flatten(d or {})


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
    last = [k.split(".")[-1] for k in keys]
    return {k: KEY_ALIASES.get(k, s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _fmt_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ",".join(map(str, v)) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, str) and ("/" in v or "\\" in v):
        return Path(v).name
    return str(v)


def _base_name(run: Run, diff: dict[str, Any]) -> str:
    """The run's name without the suffixes an ablation grid appended (``topk-top_k5`` -> ``topk``)."""
    parts = run.config.name.split("-")
    suffixes = {f"{k.split('.')[-1]}{v}" for k, v in diff.items()}
    while len(parts) > 1 and parts[-1] in suffixes:
        parts.pop()
    return "-".join(parts)


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Short, unique labels: name plus ``key=value`` for each config value that differs between the runs."""
    diffs = distinguishing(runs)
    short = _short_keys(dict.fromkeys(k for d in diffs for k in d))
    labels = []
    for r, d in zip(runs, diffs):
        base = _base_name(r, d)
        parts = [f"{short[k]}={_fmt_value(v)}" for k, v in d.items()]
        labels.append(" ".join([base, ", ".join(parts)]) if parts else base)
    seen: dict[str, int] = {}
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
    if any(c > 1 for c in seen.values()):  # identical configs (reruns): the folder tells them apart
        labels = [f"{lab} [{r.run_dir.name}]" if seen[lab] > 1 else lab for lab, r in zip(labels, runs)]
    return labels


def category_name(group: Any, n: int | None = None, label: str | None = None) -> str:
    """``1 multi-hop`` / ``overall 1-4``, with ``(n=…)`` when ``n`` is given; ``label``: the run's own label
    for the number (its summary's, e.g. LongMemEval's types), else LoCoMo's."""
    try:
        g = int(group)
        name = f"{g} {label if isinstance(label, str) and label else CATEGORY_LABELS.get(g, '')}".strip()
    except (TypeError, ValueError):
        name = str(group)
    return f"{name} (n={int(n):,})" if n is not None else name
