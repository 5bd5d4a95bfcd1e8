"""Reusing a finished run: ``run_experiment(cfg, reuse=True)`` (``memlab run --reuse``) returns the newest run under
the results root that already answered this exact question set by this exact recipe, instead of running it again,
so notebooks that need the same arm share one run.

A run folder is reused only when everything that decides its results is the same: the whole resolved config (the
dataset's scoring profile applied; the run name included, since reports label runs by it), the dataset file's
sha256, the questions selected, the content of any other file the config names (``input_files`` in run.json),
memlab's own files (`memlab.rundir.source_sha256`), the Python and package versions; and only a run that finished
in one session with status ``complete`` (not one that errored, failed, was interrupted or resumed), was built
from the config alone (no caller's extractor / answerer / system objects), and whose every output file still has
the sha256 it recorded when it completed (`memlab.run.outputs`: an edited table is never served as the run's). Of
several, the newest by its recorded completion time is taken (a folder's name says nothing; a time in the future is
not believed).

A run's name decides no result, only its label: when no run of this name qualifies but one of another name does
(the same recipe in every other respect, e.g. a top-k sweep's k = 10 cell and the ``offline`` run), its folder is
copied under this name (`renamed_twin`, `copy_as`), so the labels, and a later reuse by name, stay this run's.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memlab.data import sha256_file
from memlab.run.config import recorded_dict
from memlab.run.outputs import copy_outputs, record_outputs, verify_outputs
from memlab.run.records import RunStatus
from memlab.run.results import Run, RunFileError, load_run, read_run_json
from memlab.run.spend import SPEND_KEYS
from memlab.rundir import environment, open_run_dir

if TYPE_CHECKING:  # memlab.run.steps records input_files through this module
    from memlab.run.steps import Prepared

#: What ``environment`` records that changes results: the interpreter, package versions, memlab's own files.
SAME_ENVIRONMENT = ("python", "packages", "memlab_source_sha256")
CONFIG_DIFFERS = "config differs: "
#: How far in the future a recorded completion time may be and still be believed (clocks of shared file systems).
CLOCK_SKEW = timedelta(minutes=5)


def _plain(d: Any) -> Any:
    """A config as run.json holds it (JSON types: tuples become lists), so the two compare equal."""
    return json.loads(json.dumps(d, default=str))


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def config_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    fa, fb = _flat(_plain(a)), _flat(_plain(b))
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, ...) != fb.get(k, ...))


def candidates(root: Path, name: str | None) -> list[Path]:
    """Run folders of ``name`` (None: of any name) under ``root`` (``<name>-<UTC stamp>[-n]``; real folders, not
    links), newest first by the completion time their run.json records (`completed_utc`; none: last)."""
    pat = re.compile((re.escape(name) if name is not None else r".+") + r"-(\d{8}-\d{6})(?:-(\d+))?")
    found = []
    for d in root.glob(f"{name if name is not None else ''}*-*") if root.is_dir() else ():
        if pat.fullmatch(d.name) and d.is_dir() and not d.is_symlink():
            found.append((completed_at(d), d.name, d))
    return [d for *_, d in sorted(found, key=lambda t: (t[0] or "", t[1]), reverse=True)]


def completed_at(run_dir: Path) -> str | None:
    """The completion time a run folder's run.json records (None: none, or unreadable)."""
    try:
        return read_run_json(run_dir / "run.json").get("completed_utc")
    except (OSError, RunFileError):
        return None


def input_files(cfg: dict[str, Any]) -> dict[str, str]:
    """sha256 of each file a config value names (a prompt, errata or price file; the dataset has its own
    ``dataset_sha256``): a file edited after a run changes its results while its config stays the same. A path
    is read as the process sees it (relative to its working directory)."""
    out = {}
    for key, value in _flat(_plain(cfg)).items():
        if key == "dataset.path" or not isinstance(value, str) or not value or "://" in value:
            continue
        try:
            path = Path(value).expanduser()
            if path.is_file():
                out[key] = sha256_file(path)
        except (OSError, ValueError):
            continue
    return out


def why_not(run_dir: Path, p: Prepared, env: dict[str, Any] | None = None, any_name: bool = False) -> str | None:
    """Why ``run_dir`` cannot stand for a run of ``p`` (None: it can); ``any_name``: its config may differ in
    ``name`` (what `renamed_twin` looks for)."""
    try:
        info = read_run_json(run_dir / "run.json")
    except (OSError, RunFileError) as e:
        return f"no readable run.json ({e})"
    sessions = info.get("sessions") or []
    if info.get("status") != RunStatus.COMPLETE.value or info.get("errors"):
        return f"status {info.get('status')!r}, errors {info.get('errors')}"
    if len(sessions) != 1 or sessions[0].get("status") != RunStatus.COMPLETE.value:
        return f"finished over {len(sessions)} sessions (interrupted or resumed)"
    done = info.get("completed_utc")
    if not info.get("outputs") or not isinstance(done, str):
        return "no record of its output files (made by an older memlab)"
    try:
        if datetime.fromisoformat(done) > datetime.now(timezone.utc) + CLOCK_SKEW:
            return f"its recorded completion time {done} is in the future"
    except (TypeError, ValueError):
        return f"its recorded completion time {done!r} is not a time"
    if any((info.get("components") or {}).get("custom", {}).values()):
        return "built with the caller's own component objects"
    recorded = recorded_dict(info.get("config")) or info.get("config") or {}  # an older spelling read as today's
    diff = [k for k in config_differences(recorded, p.cfg.to_dict())
            if not (any_name and k == "name") and k not in SPEND_KEYS]  # a cap it never reached decides nothing
    if diff:
        return f"{CONFIG_DIFFERS}{', '.join(diff[:5])}{' ...' if len(diff) > 5 else ''}"
    if info.get("dataset_sha256") != p.dataset_sha:
        return f"dataset changed (sha256 {str(info.get('dataset_sha256'))[:12]}…, now {p.dataset_sha[:12]}…)"
    files = input_files(p.cfg.to_dict())
    if (info.get("input_files") or {}) != files:
        changed = sorted(set(files) ^ set(info.get("input_files") or {}) |
                         {k for k in files if (info.get("input_files") or {}).get(k) not in (None, files[k])})
        return f"a file the config names changed or was not recorded ({', '.join(changed)})"
    env = env if env is not None else environment()
    recorded = info.get("environment") or {}
    changed = [k for k in SAME_ENVIRONMENT if recorded.get(k) is None or recorded.get(k) != env.get(k)]
    if changed:
        return f"made by other code or packages ({', '.join(changed)})"
    return None


def reusable_run(root: Path, p: Prepared) -> tuple[Run | None, str | None]:
    """The newest complete run of ``p`` under ``root``, loaded; else None with why the newest run of the same
    config was not reused (None when no run had that config: runs of other configs under one name, such as the
    cells of a sweep, are not worth a word)."""
    env = environment()
    first: str | None = None
    for d in candidates(root, p.cfg.name):
        why = why_not(d, p, env)
        if why is not None and why.startswith(CONFIG_DIFFERS):
            continue
        if why is None:
            run, why = _with_picks(d, p)
            if run is not None:
                run.info["reused"] = True  # in memory only: run.json stays as the run wrote it
                return run, None
        first = first or f"{d.name}: {why}"
    return None, first


def _with_picks(run_dir: Path, p: Prepared) -> tuple[Run | None, str | None]:
    """``run_dir`` loaded when it answered exactly ``p``'s questions, in order, and every output file it recorded
    is as it was; else None and why not."""
    try:
        run = load_run(run_dir)
        verify_outputs(run_dir, run.info.get("outputs"))
    except (OSError, RunFileError, ValueError) as e:
        return None, f"cannot be read back ({e})"
    if run.predictions["qid"].tolist() != [q.qid for _, q in p.picks]:
        return None, "its questions differ from the ones selected now"
    return run, None


def renamed_twin(root: Path, p: Prepared) -> Path | None:
    """The newest run folder under ``root`` of another name that `why_not` would reuse for ``p`` but for its
    name, and that holds ``p``'s questions (None: there is none)."""
    env = environment()
    for d in candidates(root, None):
        if why_not(d, p, env, any_name=True) is None and _with_picks(d, p)[0] is not None:
            return d
    return None


def copy_as(src: Path, p: Prepared, root: Path) -> Run:
    """A new run folder of ``p``'s name holding ``src``'s results (a complete run of the same recipe under another
    name, `renamed_twin`): the output files ``src`` recorded, each a regular file read without following a link
    and checked against its sha256 as it is copied (`memlab.run.outputs.copy_outputs`); run.json's id and config
    name made this run's, ``copied_from`` naming ``src``, the copy's outputs recorded. run.json is written last,
    so a copy cut short is never reused."""
    from memlab.run.steps import write_run_json  # lazily: memlab.run.steps imports this module

    info = read_run_json(src / "run.json")
    run_dir = open_run_dir(p.cfg.name, p.cfg.to_yaml(), root)  # its config.yaml and environment.json
    try:
        copy_outputs(src, run_dir, info.get("outputs") or {}, skip=("config.yaml", "environment.json"))
        info["outputs"] = record_outputs(run_dir)
        info["run_id"] = run_dir.name
        info["config"] = {**info["config"], "name": p.cfg.name}
        info["notes"] = [*info.get("notes", []), f"results copied from {src.name} (the same config but its name, "
                                                  f"data and code; its timings are that run's)"]
        info["copied_from"] = src.name
        write_run_json(run_dir, info)
        run = load_run(run_dir)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # no half copy left behind
        raise
    run.info["reused"] = True  # in memory only, as for a run reused under its own name
    return run
