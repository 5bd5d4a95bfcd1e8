"""Component registries: a name → class table per family (extractors, answerers, judges, embedders,
keyword scorers), filled by a class decorator next to each class.

Adding a component is one new file: decorate the class with ``@EXTRACTORS.register("name")`` and
import the module where its family is imported. Config validation, the CLI's help and the runner
read the registry, so no list of allowed names is copied anywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownComponentError(ValueError):
    """A component name no class is registered under (the message lists the registered names)."""


class Registry(Generic[T]):
    """Names to classes for one family; ``register`` is a class decorator."""

    def __init__(self, family: str):
        self.family = family
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def deco(cls: type[T]) -> type[T]:
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(f"{self.family} {name!r} is registered twice "
                                 f"({self._classes[name].__qualname__} and {cls.__qualname__})")
            self._classes[name] = cls
            return cls

        return deco

    def get(self, name: str) -> type[T]:
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownComponentError(f"{self.family}: unknown {name!r}; registered: "
                                        f"{', '.join(self.names())}") from None

    @contextlib.contextmanager
    def scoped(self) -> Iterator[Registry[T]]:
        """Registrations made inside the block are undone after it (a test registers without leaking)."""
        saved = dict(self._classes)
        try:
            yield self
        finally:
            self._classes.clear()
            self._classes.update(saved)

    def names(self) -> tuple[str, ...]:
        return tuple(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __repr__(self) -> str:
        return f"Registry({self.family}: {', '.join(self.names())})"
