"""Experiments as data: a dataclass tree that round-trips to YAML, validated with clear errors.

An *ablation* is a base config plus a ``grid`` of dotted keys to value lists, expanded into runs
(``retrieval.top_k: [5, 10, 20, 40]`` gives four configs). Every component family (`FAMILIES`: extractor, answer
arm, judge, memory system, the index's embedder and keyword scorers) is one selector, ``<family>.name``, checked
against its registry, and one settings mapping, ``<family>.params``, checked against the class's constructor
(`memlab.params`); an old spelling is moved with a warning (`memlab.run.config_migrate`). Shipped configs are
package data (``memlab/configs``).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from memlab.answer import ANSWERERS, JUDGES
from memlab.answer.base import section_settings
from memlab.eval.profiles import PROFILES
from memlab.extract.extractors import EXTRACTORS
from memlab.index.embedders import EMBEDDERS, parse_embedder_spec, spec_forms
from memlab.index.keyword import KEYWORD_SCORERS
from memlab.llm.retry import default_concurrency
from memlab.params import ParamError, check_params, param_specs, secret_names
from memlab.prompts import load_prompt
from memlab.run.config_migrate import migrate, migrate_key, short_name
from memlab.run.config_models import ROLES, ModelsConfig, RoleConfig  # noqa: F401  (re-exported)
from memlab.run.config_sections import (  # noqa: F401  (re-exported: the sections were defined here)
    _NAME,
    BACKENDS,
    COMBINES,
    EXECUTORS,
    MAX_NAME,
    MAX_SEED,
    MAX_TOP_K,
    AnswerConfig,
    CheckerConfig,
    ConfigError,
    CostConfig,
    DatasetConfig,
    ExtractionConfig,
    IndexConfig,
    JudgeConfig,
    PartConfig,
    RetrievalConfig,
    RunConfig,
    ScoringConfig,
    StoreConfig,
    SystemConfig,
    WorkerConfig,
    build_section,
    one_of,
)
from memlab.systems import SYSTEMS

#: Every component family: the config section holding its ``name`` and ``params``, and its registry.
FAMILIES = (("extraction", EXTRACTORS), ("answer", ANSWERERS), ("index.embedder", EMBEDDERS),
            ("index.keyword", KEYWORD_SCORERS), ("index.sparse", KEYWORD_SCORERS), ("judge", JUDGES),
            ("system", SYSTEMS))


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    extraction: ExtractionConfig = field(default_factory=ExtractionConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    grid: dict[str, list[Any]] = field(default_factory=dict)

    # ----------------------------------------------------------------------------- YAML
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config", recorded: bool = False) -> ExperimentConfig:
        """A config from its dict (YAML); old spellings moved (`memlab.run.config_migrate`), with a warning each
        unless ``recorded`` (a finished run's own record, read for report and compare)."""
        d = dict(d or {})
        if isinstance(d.get("judge"), str):  # the shorthand ``judge: litellm:<model>``
            spec = d["judge"]
            if not spec.startswith("litellm:") or len(spec) <= len("litellm:"):
                raise ConfigError(f"{where}: judge = {spec!r}; expected litellm:<model> or a judge section")
            d["judge"] = {"model": spec[len("litellm:"):]}
        if isinstance(d.get("answer"), dict) and "speaker_window" in d["answer"]:  # removed with the fitted reader
            d["answer"] = dict(d["answer"])
            if d["answer"].pop("speaker_window") not in (None, 1):  # 1: what every older run folder recorded
                raise ConfigError(f"{where}: answer.speaker_window was removed: the offline reader's abstain test "
                                  "reads the whole context; tune answer.params.abstain_margin instead")
        d = migrate(d, where, quiet=recorded)
        cfg = build_section(cls, d, where)
        cfg.validate(where)
        return cfg

    @classmethod
    def of(cls, config: ExperimentConfig | str | Path | None,
           overrides: dict[str, Any] | list[str] | None = None, caller: str = "run_experiment") -> ExperimentConfig:
        """A config given as an object, a file or a name (`from_yaml`), with ``overrides`` applied: what every
        entry point (a run, a grid, either executor) accepts."""
        if config is None:
            raise ConfigError(f"{caller}: give a config (or resume=RUN_DIR)")
        cfg = config if isinstance(config, cls) else cls.from_yaml(config)
        return cfg.with_overrides(overrides) if overrides else cfg

    @classmethod
    def from_yaml(cls, path: str | Path) -> ExperimentConfig:
        """A config file, or a name: ``./configs/<name>.yaml`` first, then the shipped configs."""
        p = Path(path)
        if p.is_file():
            where, text = str(p), p.read_text(encoding="utf-8")
        elif (Path("configs") / f"{path}.yaml").is_file():
            p = Path("configs") / f"{path}.yaml"
            where, text = str(p), p.read_text(encoding="utf-8")
        elif str(path) in shipped_configs():
            res = resources.files("memlab.configs").joinpath(f"{path}.yaml")
            where, text = f"memlab/configs/{path}.yaml", res.read_text(encoding="utf-8")
        else:
            raise ConfigError(f"{path}: no such config file, no ./configs/{path}.yaml, and no shipped config of "
                              f"that name; shipped: {', '.join(shipped_configs())}")
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{where}: not valid YAML ({e})") from e
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a mapping at the top, got {type(d).__name__}")
        return cls.from_dict(d, where=where)

    # ----------------------------------------------------------------------------- rules
    def validate(self, where: str = "config") -> None:
        """Each section's own constraints (``check``, next to its fields in `memlab.run.config_sections`), then
        the names the registries know, each component's settings, and the rules across sections."""
        check_name(self.name, where)
        for section in (self.dataset, self.extraction, self.store, self.index, self.retrieval,
                        self.judge, self.models, self.run):
            section.check(where)
        for prefix, registry in FAMILIES:
            if prefix != "index.embedder" and (prefix != "index.sparse" or self.index.sparse.name is not None):
                one_of(where, f"{prefix}.name", get_dotted(self, prefix).name, registry.names())
        if self.system.name != "memlab" and self.run.executor != "local":
            raise ConfigError(f"{where}: system.name = {self.system.name!r} runs on the local executor only "
                              f"(run.executor = {self.run.executor!r})")
        one_of(where, "scoring.profile", self.scoring.profile, tuple(PROFILES))
        self._validate_settings(where)
        prompts = [("answer", "answer.prompt", self.answer.prompt), ("judge", "judge.prompt", self.judge.prompt)]
        if EXTRACTORS.get(self.extraction.name).requires_model:
            prompts.append(("extract", "extraction.prompt", self.extraction.prompt))
        for stage, key, name in prompts:
            if name is not None:
                try:
                    load_prompt(stage, name)
                except FileNotFoundError as e:
                    raise ConfigError(f"{where}: {key} = {name!r}: {e}") from None
        if EXTRACTORS.get(self.extraction.name).requires_model and not self.extraction.model:
            raise ConfigError(f"{where}: extraction.model is required when extraction.name = "
                              f"{self.extraction.name!r}")
        if ANSWERERS.get(self.answer.name).requires_model and not self.answer.model:
            raise ConfigError(f"{where}: answer.model is required for answer.name = {self.answer.name!r}")
        self._validate_models(where)
        for key, values in self.grid.items():
            get_dotted(self, key, where=f"{where}: grid")
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{where}: grid.{key} = {values!r}; expected a non-empty list of values (one run "
                                  f"per value, e.g. [{values!r}])")

    def _validate_settings(self, where: str) -> None:
        """Each family's ``params`` (`FAMILIES`) and the index's own (``index.params``) against its class's
        declared parameters (`memlab.params.check_params`), kept as the constructor gets them (2 for a float is
        2.0: one cache key)."""
        from memlab.index.hybrid import HybridIndex

        for key, cls, name, params in component_sections(self, checked=False):
            if not isinstance(params, dict):
                raise ConfigError(f"{where}: {key} = {params!r}; expected a mapping of setting names to values")
            if name is None:  # no sparse scorer (IndexConfig.check refuses its settings alone)
                continue
            if cls is not None:
                refuse_secrets(where, key, cls, params)
            try:
                if key == "index.embedder.params":
                    checked = parse_embedder_spec(name, params, complete=True)[1]
                    checked = {k: checked[k] for k in params}  # the spec's own setting stays in the spec
                else:
                    family = dict(FAMILIES)[key.rpartition(".params")[0]].family
                    checked = check_params(cls, params, f"{family} {name!r}")
                params.update(checked)
            except ParamError as e:
                raise ConfigError(f"{where}: {key}.{e}" if e.key else f"{where}: {key}: {e}") from None
            except ValueError as e:
                why = f" ({e})" if name.partition(":")[0] in EMBEDDERS else ""  # else the list says it all
                raise ConfigError(f"{where}: index.embedder.name = {name!r}; allowed: {spec_forms()}{why}") from None
        try:
            self.index.params.update(check_params(HybridIndex, self.index.params, "the index (HybridIndex)"))
        except ParamError as e:
            raise ConfigError(f"{where}: index.params.{e}" if e.key else f"{where}: index.params: {e}") from None
        judge = JUDGES.get(self.judge.name)  # the judge.* fields that are its settings (judge.prompt, .repeats ...)
        for name, value in section_settings(judge, self.judge).items():
            try:
                param_specs(judge)[name].check(value)
            except ParamError as e:
                raise ConfigError(f"{where}: judge.{name} = {value!r}; {e}") from None

    def _validate_models(self, where: str) -> None:
        limits: dict[str, tuple[int | None, str]] = {}
        for role in ROLES:
            r = self.models.resolve(role)
            for key, lo, kind in (("timeout", 0, float), ("max_retries", 0, int), ("concurrency", 1, int),
                                  ("context_window", 1, int)):
                v, src = r[key], f"models.{role}.{key}" if getattr(getattr(self.models, role), key) is not None \
                    else f"models.{key}"
                if v is None:
                    continue
                ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and v > lo) if kind is float else \
                    (isinstance(v, int) and not isinstance(v, bool) and v >= lo)
                if not ok:
                    want = "seconds > 0" if kind is float else f"an integer >= {lo}"
                    raise ConfigError(f"{where}: {src} = {v!r}; expected {want}")
            base = r["api_base"]
            if base is not None and not (isinstance(base, str) and base.startswith(("http://", "https://"))):
                raise ConfigError(f"{where}: api_base of role {role} = {base!r}; expected an http(s):// URL")
            if base and self.role_in_use(role):
                prev = limits.get(base.rstrip("/"))
                if prev is not None and prev[0] != r["concurrency"]:
                    raise ConfigError(f"{where}: {base} has concurrency {prev[0]} for {prev[1]} but "
                                      f"{r['concurrency']} for {role}; one endpoint, one limit")
                limits[base.rstrip("/")] = (r["concurrency"], role)

    def role_in_use(self, role: str) -> bool:
        """Whether this config calls a model for the role."""
        arm = ANSWERERS.get(self.answer.name)
        return {"extractor": EXTRACTORS.get(self.extraction.name).requires_model and bool(self.extraction.model),
                "reader": (arm.requires_model or arm.model_optional) and bool(self.answer.model),
                "judge": bool(self.judge.model),
                "embedder": self.index.embedder_model() is not None}[role]

    def trust_settings(self, run_dir: str | Path | None = None) -> dict[str, Any]:
        """What decides where requests, keys and file contents go (`memlab.run.trust.trust_settings`)."""
        from memlab.run.trust import trust_settings

        return trust_settings(self, run_dir)

    def describe_models(self) -> list[str]:
        """One line per role: its model and endpoint, and which local embedder runs when none is remote."""
        names = {"extractor": self.extraction.model, "reader": self.answer.model, "judge": self.judge.model,
                 "embedder": self.index.embedder_model()}
        lines = []
        for role in ROLES:
            r = self.models.resolve(role)
            if role == "embedder" and names[role] is None:
                remote = [x for x in ROLES if x != "embedder" and self.role_in_use(x) and self.models.resolve(x)[
                    "api_base"]]
                plural = len(remote) > 1
                note = (f"; the chat endpoint{'s' if plural else ''} of {', '.join(remote)} "
                        f"{'are' if plural else 'is'} not used for embeddings") if remote else ""
                lines.append(f"embedder: {self.index.embedder.name} (local, in this process){note}")
                continue
            if not self.role_in_use(role):
                continue
            where = r["api_base"] or "provider default endpoint"
            conc = r["concurrency"] if r["concurrency"] is not None else default_concurrency(r["api_base"])
            lines.append(f"{role}: {names[role]} at {where} (timeout {r['timeout']:g} s, max_retries "
                         f"{r['max_retries']}, concurrency {conc}, context window "
                         f"{r['context_window'] or 'from /models or unchecked'}, max_tokens {r['max_tokens']}, "
                         f"structured output {r['structured_output']})")
        return lines

    # ----------------------------------------------------------------------------- edits
    def with_overrides(self, overrides: dict[str, Any] | list[str]) -> ExperimentConfig:
        """A copy with dotted-key overrides (``{"retrieval.top_k": 20}`` or ``["retrieval.top_k=20"]``)."""
        if isinstance(overrides, list):
            overrides = parse_sets(overrides)
        d = self.to_dict()
        for key, value in overrides.items():
            set_dotted_dict(d, migrate_key(key, d, value=value), value)
        return ExperimentConfig.from_dict(d, where="config with --set")

    def expand(self) -> list[ExperimentConfig]:
        """The runs of an ablation (a config without a grid is one run)."""
        if not self.grid:
            return [self]
        keys = list(self.grid)
        out = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            c = self.with_overrides(dict(zip(keys, combo)))
            c.grid = {}
            c.name = self.name + "-" + "-".join(f"{short_name(k)}{slug(v)}" for k, v in zip(keys, combo))
            check_name(c.name, f"grid point {dict(zip(keys, combo))!r}")
            out.append(c)
        return out


def component_sections(cfg: ExperimentConfig, checked: bool = True) -> list[tuple[str, Any, str | None, Any]]:
    """(settings key, class, name, settings) of every family (`FAMILIES`) whose name is registered (an
    unregistered one: class None, unless ``checked`` leaves it out); the embedder by its registered name."""
    out = []
    for prefix, registry in FAMILIES:
        part = get_dotted(cfg, prefix)
        name = part.name
        reg_name = None if name is None else name.partition(":")[0] if registry is EMBEDDERS else name
        cls = registry.get(reg_name) if reg_name is not None and reg_name in registry else None
        if cls is None and checked:
            continue
        out.append((f"{prefix}.params", cls, name, part.params))
    return out


def recorded_dict(d: dict[str, Any] | None, where: str = "config") -> dict[str, Any] | None:
    """A config dict a run recorded (config.yaml, run.json), in today's spelling with every default filled in, so a
    run written before a key moved compares with one written after; None when it no longer reads as a config."""
    try:
        return build_section(ExperimentConfig, migrate(d, where, quiet=True), where).to_dict() if d else None
    except ConfigError:
        return None


def refuse_secrets(where: str, key: str, cls: type, params: dict[str, Any]) -> None:
    """A parameter ``cls`` declares a secret (`memlab.params.Trust.secret`) given as a config value: a `ConfigError`
    that never shows it."""
    for name in secret_names(cls):
        if params.get(name) is not None:
            raise ConfigError(f"{where}: {key}.{name} is a key given as a literal (not shown here); a key is never a "
                              f"config value (config.yaml, run.json and the reports are shared): put it in an "
                              f"environment variable and name that with models.api_key_env (or "
                              f"models.<role>.api_key_env)")


def check_name(name: Any, where: str = "config") -> None:
    """A run name (it becomes a folder under the results root) or a `ConfigError` saying what is expected."""
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_NAME:
        raise ConfigError(f"{where}: name = {name!r}; expected at most {MAX_NAME} letters, digits and . _ + = - (it "
                          f"names a folder under the results root: no path separators, no leading dot)")


def slug(value: Any, limit: int = 40) -> str:
    """A grid value as part of a run name: characters other than letters, digits and ``. _ + = -`` become ``_``
    (a value such as ``../../x`` can never make a path), at most ``limit`` characters; a value changed on the
    way gets a short hash of itself, so two values never share a name (``openai/m`` -> ``openai_m_1c2f3a``)."""
    raw = str(value)
    text = re.sub(r"[^A-Za-z0-9._+=-]+", "_", raw).strip("._")[:limit]
    if text == raw:
        return text
    import hashlib

    return f"{text}_{hashlib.sha256(raw.encode()).hexdigest()[:6]}".lstrip("_")


def shipped_configs() -> list[str]:
    """Names of the configs shipped in the package (``memlab run <name>``)."""
    return sorted(p.name[:-5] for p in resources.files("memlab.configs").iterdir() if p.name.endswith(".yaml"))


#: The field holding a component's settings by name: ``--set answer.params.rank=2`` and a grid over
#: ``answer.params.rank`` may name a setting the section does not list yet.
SETTINGS_KEYS = ("params",)


def get_dotted(cfg: Any, key: str, where: str = "config") -> Any:
    obj, parts = cfg, key.split(".")
    for i, part in enumerate(parts):
        if isinstance(obj, dict) and i == len(parts) - 1 and parts[i - 1] in SETTINGS_KEYS:
            return obj.get(part)  # a component's setting: its name is checked against its class on validation
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            raise ConfigError(f"{where}: unknown key {key!r}")
        obj = getattr(obj, part)
    return obj


def set_dotted_dict(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for i, p in enumerate(parts[:-1]):
        if cur.get(p) is None and p in SETTINGS_KEYS and p in cur:  # a component's settings, none given yet
            cur[p] = {}
        if not isinstance(cur.get(p), dict):
            where = ".".join(parts[:i + 1])
            sections = [k for k, v in cur.items() if isinstance(v, dict)]
            raise ConfigError(f"--set {key}: {where} is not a section; " + (
                f"sections under {'.'.join(parts[:i]) or 'the top level'}: {', '.join(sections)}" if sections else
                f"{'.'.join(parts[:i])} holds no section (a setting's value is given whole: --set {where}=VALUE)"))
        cur = cur[p]
    if parts[-1] not in cur and not (len(parts) > 1 and parts[-2] in SETTINGS_KEYS):
        raise ConfigError(f"--set {key}: unknown key {parts[-1]!r}; allowed: {', '.join(cur)}")
    cur[parts[-1]] = copy.deepcopy(value)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` strings, values parsed as YAML (``20`` -> 20, ``true`` -> True, ``[1, 2]`` -> list)."""
    out = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"--set {it!r}: expected key=value")
        k, v = it.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out
