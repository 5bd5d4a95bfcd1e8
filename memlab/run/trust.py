"""What in a run's config decides where requests, keys and file contents go, and the check that a run folder's
config (``--resume``, ``rescore``) uses only such settings its user started the run with.

Nothing here is a list to keep: each model role's endpoint and key variable (``models``), every config field
declared as naming a file (``metadata=TRUST_FILE`` beside the field, `memlab.run.config_sections`) and every
component parameter marked with `memlab.params.Trust` where it is declared (its constructor) counts, so a new
component's endpoint, key or file setting is covered as soon as it is declared. A file inside the run folder or
inside memlab itself is the folder's or the package's own: reading it sends nothing anywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memlab.params import PromptName, param_specs, trust_kinds
from memlab.run.config import ConfigError, ExperimentConfig
from memlab.run.config_models import ROLES
from memlab.rundir import remember_settings, remembered_settings

_PACKAGE = Path(__file__).resolve().parents[1]


def component_sections(cfg: ExperimentConfig) -> list[tuple[str, Any, dict[str, Any]]]:
    """(config key, component class, its settings) for every component section whose name is registered."""
    from memlab.run.config import component_sections as sections

    return [(key, cls, params or {}) for key, cls, _, params in sections(cfg)]


def _own_file(value: Any, run_dir: Path | None) -> bool:
    """Whether a path is inside ``run_dir`` or memlab's own package (nothing of the user's is read)."""
    try:
        p = Path(str(value)).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    roots = [_PACKAGE] + ([run_dir.resolve()] if run_dir is not None else [])
    return any(p == r or r in p.parents for r in roots)


def _file_fields(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every config field declared as naming a file (`TRUST_FILE`)."""
    out = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out += _file_fields(v, f"{prefix}{f.name}.")
        elif f.metadata.get("trust") == "file":
            out.append((f"{prefix}{f.name}", v))
    return out


def trust_settings(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """What decides where requests, keys and file contents go: each model role's endpoint and key variable, the
    files config fields name (a shipped prompt's bare name is none) and every component setting marked with
    `Trust`, files inside ``run_dir`` or memlab left out."""
    where = Path(run_dir) if run_dir is not None else None
    out: dict[str, Any] = {}
    for role in ROLES:
        if cfg.role_in_use(role):
            r = cfg.models.resolve(role)
            out.update({f"models.{role}.{k}": r[k] for k in ("api_base", "api_key_env") if r[k] is not None})
    for key, value in _file_fields(cfg):
        if value is not None and not (key.endswith(".prompt") and PromptName.is_name(value)) and \
                not _own_file(value, where):
            out[key] = value
    for key, cls, params in component_sections(cfg):
        specs = param_specs(cls)
        for name, kind in trust_kinds(cls).items():
            v = params.get(name)
            if v is None or (kind == "file" and _own_file(v, where)):
                continue
            if kind == "file" and PromptName.is_name(v) and any(isinstance(c, PromptName)
                                                                for c in specs[name].constraints):
                continue  # a shipped prompt by name
            out[f"{key}.{name}"] = v
    return out


def check_trust(run_dir: str | Path, cfg: ExperimentConfig, named: dict[str, Any], trusted: bool,
                what: str = "--resume", used: Callable[[str], bool] = lambda key: True) -> None:
    """Refuse to use a run folder's config when it names an endpoint, key variable or file (of those ``used``
    picks) that this user neither started the run with (`memlab.rundir.remembered_settings`) nor names now
    (``named``: the ``--set`` overrides), unless ``trusted``: a crafted folder must not send the user's keys or
    files to a server of its choosing, nor print them. What the user confirms is remembered."""
    run_dir = Path(run_dir)
    settings = {k: v for k, v in trust_settings(cfg, run_dir).items() if used(k)}
    mine = remembered_settings(run_dir)
    said = {(k.rsplit(".", 1)[-1], repr(v)) for k, v in named.items()}
    strange = {k: v for k, v in settings.items() if mine.get(k) != v and (k.rsplit(".", 1)[-1], repr(v)) not in said}
    if strange and not trusted:
        listed = "; ".join(f"{k} = {v!r}" for k, v in strange.items())
        raise ConfigError(f"{what} {run_dir}: its config.yaml names endpoints, key variables or files this user did "
                          f"not start the run with: {listed}. Check them, then add --trust-run-config to use them"
                          + (" (or --force-config --set KEY=VALUE to replace them)" if what == "--resume" else ""))
    if any(mine.get(k) != v for k, v in settings.items()):
        remember_settings(run_dir, {**mine, **settings})
