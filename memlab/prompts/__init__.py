"""Prompt files: chosen by name (``memlab/prompts/<stage>/<name>.md``) or given as a path.

A prompt is plain text with ``{{placeholders}}`` filled by `render`; a user adds a prompt by
dropping a file in place or passing its path, without touching code.
"""

from __future__ import annotations

import re
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


def available_prompts(stage: str) -> list[str]:
    return sorted(p.stem for p in (PROMPTS_DIR / stage).glob("*.md"))


def prompt_file(stage: str, name_or_path: str) -> Path | None:
    """The file `load_prompt` reads for a name or path (None: there is none); nothing is read."""
    p = Path(name_or_path)
    if p.suffix and p.is_file():
        return p
    f = PROMPTS_DIR / stage / f"{name_or_path}.md"
    return f if f.is_file() else None


def load_prompt(stage: str, name_or_path: str) -> str:
    """A prompt by name for a stage (``extract``, ``answer``, ``judge``), or a file path."""
    p = prompt_file(stage, name_or_path)
    if p is None:
        raise FileNotFoundError(
            f"{stage} prompt {name_or_path!r}: no file {PROMPTS_DIR / stage / f'{name_or_path}.md'} and no such "
            f"path; available: {available_prompts(stage)}"
        )
    return p.read_text(encoding="utf-8")


def render(template: str, **values: str) -> str:
    """Fill ``{{name}}`` placeholders; an unknown placeholder is an error naming it."""
    def sub(m: re.Match[str]) -> str:
        k = m.group(1)
        if k not in values:
            raise KeyError(f"prompt placeholder {{{{{k}}}}} has no value; given: {sorted(values)}")
        return values[k]

    return _PLACEHOLDER.sub(sub, template)
