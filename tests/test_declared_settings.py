"""Issue 35: every setting of every shipped component declares what it accepts where it is declared (its
constructor, `memlab.params`), so an out-of-range value is refused when the config is read, before any work, as
one line naming the key; and an endpoint, key or file setting is marked as such (`Trust`)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from memlab.answer import ANSWERERS, JUDGES
from memlab.cli import main
from memlab.extract.extractors import EXTRACTORS
from memlab.index.embedders import EMBEDDERS
from memlab.index.keyword import KEYWORD_SCORERS
from memlab.params import FolderWith, OneOf, Pattern, PromptName, Range, Trust, settable_specs
from memlab.run import ConfigError, ExperimentConfig
from memlab.run.config import JudgeConfig
from memlab.systems import SYSTEMS

#: family -> (registry, the config key naming the component, the key of its settings)
FAMILIES = {"extractor": (EXTRACTORS, "extraction.name", "extraction.params"),
            "answer arm": (ANSWERERS, "answer.name", "answer.params"),
            "embedder": (EMBEDDERS, "index.embedder.name", "index.embedder.params"),
            "keyword scorer": (KEYWORD_SCORERS, "index.keyword.name", "index.keyword.params"),
            "judge": (JUDGES, "judge.name", "judge.params"),
            "system": (SYSTEMS, "system.name", "system.params")}


def shipped() -> list[tuple[str, str, type]]:
    out = []
    for family, (registry, _, _) in FAMILIES.items():
        for name in registry:
            cls = registry.get(name)
            if cls.__module__.startswith("memlab."):
                out.append((family, name, cls))
    return out


def refused_values(spec, empty_dir: Path) -> list:
    """Values the declaration of ``spec`` must refuse (from its type and each constraint it carries)."""
    ann = spec.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
    base = args[0] if typing.get_origin(ann) is not typing.Literal else ann
    bad: list = []
    if base is bool:
        bad.append("yes")
    if base in (int, float):
        bad.append("many")
    if typing.get_origin(base) is typing.Literal:
        bad.append("no-such-choice")
    for c in spec.constraints:
        if isinstance(c, Range):
            step = 1 if base is int else 0.5
            if c.lo is not None:
                bad.append(c.lo if c.lo_open else c.lo - step)
            if c.hi is not None:
                bad.append(c.hi + step)
        elif isinstance(c, OneOf):
            bad.append("no-such-choice")
        elif isinstance(c, Pattern):
            bad.append("two words")
        elif isinstance(c, PromptName):
            bad.append("no-such-prompt")
        elif isinstance(c, FolderWith):
            bad.append(str(empty_dir))
        elif isinstance(c, Trust):
            bad.append({"endpoint": "ftp://elsewhere", "secret": "sk-a-literal-key", "file": ""}[c.kind])
    return bad


def undeclared(spec) -> str | None:
    """Why a settable parameter's declaration leaves some wrong value accepted (None: it does not)."""
    ann = spec.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
    base = args[0]
    kinds = {type(c) for c in spec.constraints}
    if base is bool or typing.get_origin(ann) is typing.Literal or typing.get_origin(base) is typing.Literal:
        return None
    if base in (int, float):
        return None if Range in kinds else "a number without a Range"
    if base is str or typing.get_origin(ann) in (typing.Union,) and str in args:
        return None if kinds & {OneOf, Pattern, PromptName, FolderWith, Trust} else "a string without a constraint"
    return f"a setting of type {ann!r}: declare it, or let the run decide it (fixed_params)"


def config_for(family: str, name: str, cls: type, settings: dict) -> dict:
    registry, name_key, params_key = FAMILIES[family]
    d: dict = {"name": "declared"}

    def put(key: str, value) -> None:
        *path, field = key.split(".")
        at = d
        for part in path:
            at = at.setdefault(part, {})
        at[field] = value

    spelled = f"{name}:some-model" if getattr(cls, "spec_setting", None) else name
    put(name_key, spelled)
    if family == "judge":  # a judge setting that is a judge.* field is given there (judge.params may not)
        fields = {f.name for f in dataclasses.fields(JudgeConfig)}
        d["judge"].update({"model": "openai/judge", **{k: v for k, v in settings.items() if k in fields},
                           "params": {k: v for k, v in settings.items() if k not in fields}})
    else:
        put(params_key, settings)
    if getattr(cls, "requires_model", False):
        put("extraction.model" if family == "extractor" else "answer.model", "openai/m")
    return d


CASES = [(family, name, cls, pname) for family, name, cls in shipped() for pname in settable_specs(cls)]


def test_every_shipped_component_has_settings_to_walk():
    assert {family for family, *_ in CASES} == set(FAMILIES)
    assert len(CASES) > 40


@pytest.mark.parametrize("family, name, cls, pname", CASES, ids=[f"{f}:{n}.{p}" for f, n, _, p in CASES])
def test_every_setting_refuses_an_out_of_range_value_before_any_work(family, name, cls, pname, tmp_path):
    spec = settable_specs(cls)[pname]
    why = undeclared(spec)
    assert why is None, f"{family} {name!r}: {pname} is {why}"  # before: n_components, seed, split ... undeclared
    bad = refused_values(spec, tmp_path)
    assert bad, f"{family} {name!r}: {pname} declares nothing to refuse"
    for value in bad:
        d = config_for(family, name, cls, {pname: value})
        with pytest.raises(ConfigError) as e:
            ExperimentConfig.from_dict(d)
        text = str(e.value)
        assert pname in text and "\n" not in text, text
        if value == "sk-a-literal-key":
            assert value not in text  # a key is never echoed


def test_a_good_value_of_every_constrained_setting_is_accepted():
    """The constraints refuse what is wrong, not what the components ship with: every default passes."""
    for family, name, cls, pname in CASES:
        spec = settable_specs(cls)[pname]
        if spec.required or spec.default is None or family == "judge":
            continue
        ExperimentConfig.from_dict(config_for(family, name, cls, {pname: spec.default}))


@pytest.mark.parametrize("setting", [
    "index.embedder.params.n_components=0", "index.embedder.params.n_components=-5",
    "index.embedder.params.ngram_max=0", "index.embedder.params.seed=-1", "answer.params.temporal_window=-10",
    "answer.params.max_words=-3", "answer.params.list_spans=-1", "answer.params.span_window=0",
    "answer.params.split=bogus", "answer.params.span=bogus", "index.params.ef_search=0",
    "index.params.factory=HNSW0", "extraction.turn_style=bogus", "judge.temperature=-1",
])
def test_the_reported_settings_are_one_line_before_any_folder(setting, synthetic_path, tmp_path, capsys):
    root = tmp_path / "r"
    rc = main(["run", "offline", "--set", f"dataset.path={synthetic_path}", "--set", setting, "--results", str(root)])
    err = capsys.readouterr().err
    assert rc == 2, err  # before: the run went on (F1 .137 for n_components=0, .049 for temporal_window=-10) or crashed
    assert len(err.strip().splitlines()) == 1 and setting.split("=")[0] in err and "Traceback" not in err
    assert not root.exists() or not any(root.glob("offline-*"))


@pytest.mark.parametrize("section", [
    {"extraction": {"name": "turns", "params": {"style": "bogus"}}},
    {"system": {"name": "mem0", "params": {"embedder_model": "/etc"}}},
])
def test_a_component_setting_is_refused_once_and_before_extraction(section, synthetic_path, tmp_path, capsys):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"name": "c", "dataset": {"path": str(synthetic_path)}, **section}))
    assert main(["run", str(cfg), "--results", str(tmp_path / "r")]) == 2  # before: a traceback, or 3 lines
    err = capsys.readouterr().err
    (key, value), = next(iter(section.values()))["params"].items()
    assert err.count(f".params.{key} = {value!r}") == 1 and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()  # refused before any folder, so before extraction


def test_a_setting_of_an_unset_settings_mapping_can_be_given_with_set(synthetic_path, tmp_path, capsys):
    cfg = ExperimentConfig.from_yaml("offline").with_overrides(["system.name=mem0", "system.params.infer=false"])
    assert cfg.system.params == {"infer": False}  # before: "'params' is not a section; sections: " (none listed)
    with pytest.raises(ConfigError, match=r"--set system\.params\.worker_params\.x: system\.params\.worker_params "
                                          r"is not a section"):
        ExperimentConfig.from_yaml("offline").with_overrides(["system.params.worker_params.x=1"])
