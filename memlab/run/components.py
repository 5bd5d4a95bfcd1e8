"""Building a run's components from its config, through the registries (or taking the user's own).

BEIR-style: ``run_experiment(cfg, extractor=MyExtractor(), answerer=MyAnswerer())`` uses the given
objects instead of the configured names; everything else (caching, traces, scoring) is the same.
"""

from __future__ import annotations

from typing import Any

import memlab.eval.profiles  # noqa: F401 - registers the llm judge (ProfileJudge) in JUDGES
from memlab.answer import ANSWERERS, JUDGES, Answerer
from memlab.answer.base import section_settings
from memlab.extract.extractors import EXTRACTORS, Extractor
from memlab.index.embedders import EMBEDDERS, parse_embedder_spec
from memlab.index.hybrid import HybridIndex
from memlab.index.keyword import KEYWORD_SCORERS
from memlab.params import (
    SEP,
    CacheIdentified,
    describe_params,
    fixed_params,
    get_params,
    resolved_params,
    secret_names,
    settable_specs,
)
from memlab.run.clients import Clients
from memlab.run.config import ExperimentConfig, get_dotted


def build_extractor(cfg: ExperimentConfig, clients: Clients) -> Extractor:
    return EXTRACTORS.get(cfg.extraction.name).from_config(cfg.extraction, clients.for_role)


def build_answerer(cfg: ExperimentConfig, clients: Clients) -> Answerer:
    arm = ANSWERERS.get(cfg.answer.name).from_config(cfg.answer, clients.for_role)
    if arm.own_index:  # an arm with its own turn index (session-recall): the run's index settings
        arm.use_index(index={**cfg.index.hybrid_params(), "embedder_params": clients.embedder_params()},
                      turn_style=cfg.extraction.turn_style, embedding_cache=str(clients.embedding_cache))
    return arm


def build_judge(cfg: ExperimentConfig, clients: Clients) -> Any | None:
    """The registered judge ``judge.name`` with ``judge.params``; each parameter it declares the run decides
    (`memlab.params.Component.fixed_params`, e.g. the ``llm`` judge's ``profile`` from ``scoring.profile``,
    whose verdict rule it applies) gets that config key's value."""
    if not cfg.judge.model:
        return None
    cls = JUDGES.get(cfg.judge.name)
    fixed = {name: get_dotted(cfg, key) for name, key in fixed_params(cls).items()}
    return cls.from_config(cfg.judge, clients.for_role, **fixed)


def _held(obj: Any, fallback: dict[str, Any]) -> dict[str, Any]:
    """The settings (config-settable parameters) an object holds, as run.json records them; ``fallback`` (the
    config's, defaults included) for an object that does not store its arguments under their own names. A secret
    (`memlab.params.Trust.secret`) is never recorded."""
    specs, secret = settable_specs(type(obj)), secret_names(type(obj))
    try:
        held = {k: v for k, v in get_params(obj).items() if k in specs}
    except TypeError:
        held = fallback
    return {k: v for k, v in held.items() if k not in secret}


def component_params(cfg: ExperimentConfig, extractor: Any, answerer: Any, judge: Any = None) -> dict[str, Any]:
    """Each component's settings with every default filled in (run.json ``components.params``): the extractor,
    answer arm and judge as built, the embedder and keyword scorer as the index builds them."""
    index = HybridIndex(**cfg.index.hybrid_params(), embedder_params=cfg.index.embedder.params)
    deep = index.get_params(deep=True)  # the index's parts, each with its settings (``keyword__k1``)

    def part(name: str) -> dict[str, Any] | None:
        return None if index.parts()[name] is None else \
            {k[len(name) + len(SEP):]: v for k, v in deep.items() if k.startswith(name + SEP)}

    out: dict[str, Any] = {
        "extractor": None if extractor is None else _held(extractor, resolved_params(
            EXTRACTORS.get(cfg.extraction.name), cfg.extraction.params)),
        "answerer": _held(answerer, resolved_params(ANSWERERS.get(cfg.answer.name), cfg.answer.params)),
        "judge": None if judge is None else _held(judge, resolved_params(JUDGES.get(cfg.judge.name), {
            **section_settings(JUDGES.get(cfg.judge.name), cfg.judge), **cfg.judge.params})),
        "embedder": part("embedder"), "keyword": part("keyword"), "sparse": part("sparse"),
        "index": {k: deep[k] for k in settable_specs(HybridIndex)}}
    return out


def describe_components() -> str:
    """Each family's registered components with their settings (`memlab.params.describe_params`), under the
    config keys that name them and take their settings: the CLI's ``memlab components``."""
    from memlab.run.config import FAMILIES

    note = {"judge": "; judge.prompt, judge.repeats, judge.temperature are the settings of those names"}
    lines = [f"index (its own settings under index.params): {describe_params(HybridIndex)}"]
    for prefix, registry in FAMILIES:
        if prefix == "index.sparse":
            continue  # the keyword scorers again
        key = "index.keyword.name, index.sparse.name" if prefix == "index.keyword" else f"{prefix}.name"
        lines.append(f"{key} (settings under {key.replace('.name', '.params')}{note.get(prefix, '')}):")
        for name in registry:
            cls = registry.get(name)
            spelled = f"{name}:<{cls.spec_setting}>" if getattr(cls, "spec_setting", None) else name
            lines.append(f"  {spelled}: {describe_params(cls) or '(no settings)'}")
    return "\n".join(lines)


def component_label(obj: Any) -> str:
    """How a user-supplied component is named in run.json and the extraction cache key."""
    if isinstance(obj, CacheIdentified):
        try:
            return obj.cache_id()
        except TypeError:  # an answer arm that does not store its arguments: its class names it
            if isinstance(obj, Extractor):
                raise  # an extractor's label is its extraction cache key: never a guess
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class ComponentNotOnWorkers(RuntimeError):
    """A component registered in the driver (by importing a user module) that the workers cannot import."""


def user_component_modules(cfg: ExperimentConfig) -> dict[str, list[str]]:
    """The modules outside memlab whose import registered a component ``cfg`` names, each with what it
    registered (``extractor 'mine' (mymod.MyExtractor)``): a process that has not imported them (a Ray worker)
    does not know these names."""
    named = [(EXTRACTORS, cfg.extraction.name), (ANSWERERS, cfg.answer.name),
             (EMBEDDERS, parse_embedder_spec(cfg.index.embedder.name)[0]), (KEYWORD_SCORERS, cfg.index.keyword.name)]
    if cfg.index.sparse.name:
        named.append((KEYWORD_SCORERS, cfg.index.sparse.name))
    if cfg.judge.model:
        named.append((JUDGES, cfg.judge.name))
    out: dict[str, list[str]] = {}
    for registry, name in named:
        cls = registry.get(name)
        module = cls.__module__
        if module != "memlab" and not module.startswith("memlab."):
            out.setdefault(module, []).append(f"{registry.family} {name!r} ({module}.{cls.__qualname__})")
    return out


def import_component_modules(modules: dict[str, list[str]]) -> None:
    """Import ``modules`` (`user_component_modules`) here, registering their components; a module that cannot be
    imported (or one that is a script or notebook, ``__main__``) raises `ComponentNotOnWorkers` naming it."""
    import importlib

    for module, what in modules.items():
        if module == "__main__":
            raise ComponentNotOnWorkers(
                f"{', '.join(what)} is defined in the driver's script or notebook (__main__), which Ray workers "
                f"cannot import: move it to a module on the workers' Python path and import it from there")
        try:
            importlib.import_module(module)
        except Exception as e:
            raise ComponentNotOnWorkers(
                f"{', '.join(what)} was registered by importing {module!r} in the driver, but a worker cannot "
                f"import it ({type(e).__name__}: {e}); put the module on the workers' Python path (PYTHONPATH, or "
                f"Ray's runtime_env py_modules) and run again") from e
