"""Configs written before each family took one selector (``name``) and one settings key (``params``): their keys
moved to the new spelling, each move said (`MovedKey`, naming the old key and the new), never silently dropped.

A user's file gets a warning per key (update the file); a finished run's ``config.yaml`` / run.json is read quietly
(it records every field, defaults included, so report and compare read old runs as they were). A setting the arm
never read (an extractive weight under ``answer.arm: optimized``) is dropped: at its default quietly, otherwise
with a warning saying it had no effect.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

#: Selector keys renamed: section -> its old key (now ``<section>.name``).
SELECTORS = {"extraction": "extractor", "answer": "arm", "judge": "kind"}
#: The index's parts: ``index.<part>`` (a name) and ``index.<part>_params`` became ``index.<part>.name`` / ``.params``.
PARTS = ("embedder", "keyword", "sparse")
#: The index's own settings, once ``index.<key>``: now ``index.params.<key>`` (the constructor's names).
INDEX_OWN = ("factory", "date_in_text", "append_citing", "session_text", "ef_search", "ef_construction")
#: The ``answer.*`` fields that were an arm's settings: old field -> (the arm that declared it, its parameter).
_READER = ("span", "abstain", "temporal_window", "span_window", "max_words", "split", "drop_filler", "list_spans",
           "scorer", "reader_family", "rank_weight", "memory_weight", "agreement_weight", "speaker_weight",
           "date_weight", "length_weight", "phrase_bonus", "temporal_rank_weight", "abstain_margin")
ANSWER_MOVED: dict[str, tuple[str, str]] = {
    **{k: ("extractive", k) for k in _READER}, "max_rounds": ("optimized", "max_rounds"),
    "recall_unit": ("session-recall", "unit"), "recall_window": ("session-recall", "window"),
    "recall_max": ("session-recall", "max_units")}


class MovedKey(UserWarning):
    """A config key in an old spelling, moved to its new one (the message names both)."""


def _say(where: str, text: str, quiet: bool) -> None:
    if not quiet:
        warnings.warn(f"{where}: {text}", MovedKey, stacklevel=4)


def _answer_target(arm: str, old: str) -> tuple[str | None, Any]:
    """Where an old ``answer.<old>`` field goes for ``arm``: (its key under ``answer.params`` or None when the arm
    does not take it, the default it had)."""
    from memlab.answer import ANSWERERS
    from memlab.params import SEP, param_specs

    owner, name = ANSWER_MOVED[old]
    default = param_specs(ANSWERERS.get(owner))[name].default
    if arm not in ANSWERERS:
        return None, default
    specs = param_specs(ANSWERERS.get(arm))
    if arm == owner or (name in specs and specs[name].nested is None):
        return name, default
    part = next((n for n, s in specs.items() if s.nested is not None and name in param_specs(s.nested)), None)
    return (None if part is None else f"{part}{SEP}{name}"), default


def migrate(d: dict[str, Any], where: str = "config", quiet: bool = False) -> dict[str, Any]:
    """A config dict with every old key in its new place (a copy; ``d`` is untouched)."""
    d = copy.deepcopy(d)
    for section, old in SELECTORS.items():
        sec = d.get(section)
        if isinstance(sec, dict) and old in sec:
            if "name" in sec:
                raise _conflict(where, f"{section}.{old}", f"{section}.name")
            sec["name"] = sec.pop(old)
            _say(where, f"{section}.{old} is now {section}.name", quiet)
    idx = d.get("index")
    if isinstance(idx, dict):
        for part in PARTS:
            if part in idx and not isinstance(idx[part], dict):
                idx[part] = {"name": idx[part]}
                _say(where, f"index.{part} (a name) is now index.{part}.name", quiet)
            if f"{part}_params" in idx:
                given = idx.pop(f"{part}_params")
                if given:
                    idx.setdefault(part, {}).setdefault("params", {}).update(given)
                    _say(where, f"index.{part}_params is now index.{part}.params", quiet)
        own = {k: idx.pop(k) for k in INDEX_OWN if k in idx}
        if own:
            from memlab.index.hybrid import HybridIndex
            from memlab.params import param_specs

            specs = param_specs(HybridIndex)
            both = [k for k in own if k in (idx.get("params") or {})]
            if both:
                raise _conflict(where, f"index.{both[0]}", f"index.params.{both[0]}")
            changed = {k: v for k, v in own.items() if v != specs[k].default}
            idx.setdefault("params", {}).update(changed)
            for k in own:
                _say(where, f"index.{k} is now index.params.{k}", quiet)
    ans = d.get("answer")
    if isinstance(ans, dict):
        arm = ans.get("name", "extractive")
        moved = [k for k in ans if k in ANSWER_MOVED]
        if moved and ans.get("params") is None:
            ans["params"] = {}
        for old in moved:
            value, params = ans.pop(old), ans["params"]
            target, default = _answer_target(arm, old)
            if target is not None:
                if value != default:
                    params.setdefault(target, value)
                _say(where, f"answer.{old} is now answer.params.{target}", quiet)
            elif value != default:
                _say(where, f"answer.{old} = {value!r} dropped: answer arm {arm!r} does not take it (it had no "
                            f"effect)", quiet)
    if isinstance(d.get("system"), dict) and d["system"].get("params", {}) is None:
        d["system"]["params"] = {}
    if isinstance(d.get("grid"), dict):
        d["grid"] = {migrate_key(k, d, where, quiet): v for k, v in d["grid"].items()}
    return d


def migrate_key(key: str, d: dict[str, Any], where: str = "--set", quiet: bool = False, value: Any = None) -> str:
    """A dotted key (``--set``, a grid) in its new spelling; ``d`` (the config dict, new shape) tells where an
    arm's old ``answer.*`` field goes (``value``: a mapping given for a whole part, ``index.embedder``, is new)."""
    parts = key.split(".")
    new = key
    if len(parts) >= 2:
        section, leaf = parts[0], parts[1]
        if SELECTORS.get(section) == leaf and len(parts) == 2:
            new = f"{section}.name"
        elif section == "index" and leaf in PARTS and len(parts) == 2 and not isinstance(value, dict):
            new = f"index.{leaf}.name"
        elif section == "index" and leaf.endswith("_params") and leaf[:-7] in PARTS:
            new = ".".join(["index", leaf[:-7], "params", *parts[2:]])
        elif section == "index" and leaf in INDEX_OWN and len(parts) == 2:
            new = f"index.params.{leaf}"
        elif section == "answer" and leaf in ANSWER_MOVED and len(parts) == 2:
            arm = (d.get("answer") or {}).get("name", "extractive")
            target, _ = _answer_target(arm, leaf)
            if target is None:
                from memlab.run.config_sections import ConfigError

                raise ConfigError(f"{where}: {key} is now a setting of the answer arm under answer.params, and arm "
                                  f"{arm!r} does not take it (`memlab components` lists its settings)")
            new = f"answer.params.{target}"
    if new != key:
        _say(where, f"{key} is now {new}", quiet)
    return new


def short_name(key: str) -> str:
    """A dotted key's name in a run name or label: its last part, a selector by the name its key had
    (``extraction.name`` -> extractor, ``answer.name`` -> arm, ``index.keyword.name`` -> keyword), so grid-run names
    and labels read as before the move."""
    parts = key.split(".")
    if parts[-1] == "name" and len(parts) == 2 and parts[0] in SELECTORS:
        return SELECTORS[parts[0]]
    if parts[-1] == "name" and len(parts) == 3 and parts[0] == "index":
        return parts[1]
    return parts[-1]


def _conflict(where: str, old: str, new: str) -> Exception:
    from memlab.run.config_sections import ConfigError

    return ConfigError(f"{where}: both {old} (the old spelling) and {new} are given; keep {new}")
