"""One direction through the package: a module never imports from a stage after it."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "memlab"
#: Stage order (DESIGN): data -> memory/store -> index -> extract -> answer -> eval -> run ->
#: trace/attribution -> plots. Shared leaves (prompts, llm, testing) sit at the bottom.
STAGES = {
    "data": 0, "prompts": 0, "llm": 0, "testing": 0, "atomic": 0, "registry": 0, "configs": 0,
    "cache_integrity": 0, "breaker": 0, "progress": 0, "threads": 0, "plain": 0, "params": 0, "constraints": 0,
    "stemming": 0,
    "memory": 1, "index": 2, "extract": 3, "answer": 4, "systems": 4, "eval": 5,
    "rundir": 6, "run": 6, "demo": 7, "trace": 7, "attribution": 8, "studies": 8, "plots": 9, "report_html": 9,
    "report_data": 9,
    "cli": 10, "__main__": 10, "__init__": 10,
}


def stage_of(parts: list[str]) -> int:
    return STAGES[parts[0]]


def test_no_module_imports_a_later_stage():
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("").parts
        if rel == ("__init__",) or rel == ("__main__",):
            continue
        own = stage_of(list(rel))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memlab."):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("memlab.")]
            for name in names:
                target = stage_of(name.split(".")[1:])
                if target > own:
                    bad.append(f"{'/'.join(rel)} (stage {own}) imports {name} (stage {target})")
    assert not bad, "\n".join(bad)


def test_every_module_has_a_stage():
    missing = {p.relative_to(PKG).parts[0].removesuffix(".py") for p in PKG.rglob("*.py")} - set(STAGES)
    assert not missing


#: The brief's module size: a module a newcomer can read in one sitting.
MAX_MODULE_LINES = 450


def test_every_module_is_at_most_450_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
