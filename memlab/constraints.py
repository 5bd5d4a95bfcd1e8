"""The constraints a component parameter declares beside its type (`memlab.params`: ``Annotated[int, Range(1)]``):
each has ``check(value)`` (None when accepted, else what is expected) and ``text()`` (that expectation, for errors
and the CLI's help). `Trust` marks a parameter naming an endpoint, a key or a file (`memlab.run.trust`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal


@dataclass(frozen=True)
class Range:
    """A number in [lo, hi] (either bound None: open on that side; ``lo_open``: strictly above lo)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False

    def check(self, v: Any) -> str | None:
        if (self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo)) or \
                (self.hi is not None and v > self.hi):
            return self.text()
        return None

    def text(self) -> str:
        lo = None if self.lo is None else f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        hi = None if self.hi is None else f"<= {_num(self.hi)}"
        return " and ".join(x for x in (lo, hi) if x)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


@dataclass(frozen=True)
class OneOf:
    """One of a fixed set of values (a tuple, or a callable giving one when the set is filled later, e.g. a
    registry's names)."""

    values: tuple[Any, ...] | Any

    def allowed(self) -> tuple[Any, ...]:
        return tuple(self.values() if callable(self.values) else self.values)

    def check(self, v: Any) -> str | None:
        return None if v in self.allowed() else self.text()

    def text(self) -> str:
        return f"one of {', '.join(map(str, self.allowed()))}"


@dataclass(frozen=True)
class Pattern:
    """A string matching ``regex`` whole (``what`` says what that is, for the error: "a model name")."""

    regex: str
    what: str

    def check(self, v: Any) -> str | None:
        return None if isinstance(v, str) and re.fullmatch(self.regex, v) else self.text()

    def text(self) -> str:
        return self.what


@dataclass(frozen=True)
class PromptName:
    """A prompt of ``stage`` (``answer``, ``extract``, ``judge``): a name under ``memlab/prompts/<stage>/`` or a
    file, checked to exist when the config is read (not when the first question is answered)."""

    stage: str

    def check(self, v: Any) -> str | None:
        from memlab.prompts import prompt_file

        try:
            return None if isinstance(v, str) and prompt_file(self.stage, v) is not None else self.text()
        except (OSError, ValueError):
            return self.text()

    def text(self) -> str:
        return f"a prompt under memlab/prompts/{self.stage}/ or a prompt file"

    @staticmethod
    def is_name(v: Any) -> bool:
        """A shipped prompt's bare name (no folder, no suffix), as opposed to a file path."""
        return isinstance(v, str) and "/" not in v and not Path(v).suffix


@dataclass(frozen=True)
class FolderWith:
    """An existing folder holding one of ``files`` (a model folder: ``config.json`` or ``modules.json``)."""

    files: tuple[str, ...]
    what: str = "a folder"

    def check(self, v: Any) -> str | None:
        p = Path(v) if isinstance(v, str) else None
        return None if p is not None and p.is_dir() and any((p / f).is_file() for f in self.files) else self.text()

    def text(self) -> str:
        return f"{self.what} holding {' or '.join(self.files)}"


@dataclass(frozen=True)
class Trust:
    """Marks a parameter that decides where requests, keys or file contents go, where it is declared:
    ``Trust.endpoint`` (a URL requests are sent to), ``Trust.secret`` (a key), ``Trust.file`` (a path read or
    written). Everything derives from the mark: a resume trusts such a setting only when its user started the run
    with it (`memlab.run.trust`), a secret is never a config value and never recorded (`secret_names`, left out of
    cache ids and run.json), and the value's form is checked here."""

    kind: Literal["endpoint", "secret", "file"]
    endpoint: ClassVar[Trust]
    secret: ClassVar[Trust]
    file: ClassVar[Trust]

    def check(self, v: Any) -> str | None:
        if self.kind == "endpoint" and not (isinstance(v, str) and v.startswith(("http://", "https://"))):
            return self.text()
        if self.kind == "file" and not (isinstance(v, str) and v.strip() and "\0" not in v):
            return self.text()
        return None

    def text(self) -> str:
        return {"endpoint": "an http(s):// URL", "file": "a path",
                "secret": "a key: named by an environment variable, never written in a config"}[self.kind]


Trust.endpoint = Trust("endpoint")
Trust.secret = Trust("secret")
Trust.file = Trust("file")

#: A seed for numpy's and scikit-learn's generators: an unsigned 32-bit integer.
SEED = Range(0, 2**32 - 1)
#: A model's name as a provider or server knows it (``openai/gpt-4o-mini``): no spaces.
MODEL_NAME = Pattern(r"\S+", "a model name")
