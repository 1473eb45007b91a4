"""One registry style for every extension point: engines, comparators, controls, gate kinds and
the ``harness`` subcommands.

A :class:`Registry` maps a name to a thing (a factory, a class, a control set) plus a line of help.
Entries are added with the same decorator everywhere::

    ENGINES = Registry("candidate")

    @ENGINES.register("hf", help="Hugging Face transformers")
    def _hf(spec, arg, model, ctx): ...

and looked up with :meth:`Registry.get`, which answers an unknown name with the closest valid ones.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A user named something that does not exist; the message lists the valid names."""


def unknown(kind: str, name: str, valid: Iterable[str]) -> UnknownName:
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return UnknownName(f"unknown {kind} {name!r}.{hint} Valid: {', '.join(valid)}")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    name: str
    value: T
    help: str = ""
    meta: Any = None
    """Whatever the extension point needs besides the value (e.g. a comparator's parameters)."""


class Registry(Generic[T]):
    """Name -> thing, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, *, help: str = "", meta: Any = None,  # noqa: A002
                 replace: bool = False) -> Callable[[T], T]:
        """Decorator (or call) adding ``name``; a second registration of a name is a bug unless
        ``replace`` says it is meant (tests planting a fault)."""
        def add(value: T) -> T:
            if name in self._entries and not replace:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = Entry(name, value, help, meta)
            return value
        return add

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    @contextmanager
    def patched(self, name: str, value: T, *, help: str = "", meta: Any = None) -> Iterator[T]:  # noqa: A002
        """``name`` -> ``value`` inside the block, the previous entry (or none) after it: how tests
        plant a faulty engine, comparator or control set."""
        old = self._entries.get(name)
        self._entries[name] = Entry(name, value, help, meta)
        try:
            yield value
        finally:
            if old is None:
                self._entries.pop(name, None)
            else:
                self._entries[name] = old

    def entry(self, name: str) -> Entry[T]:
        e = self._entries.get(name)
        if e is None:
            raise unknown(self.kind, name, self._entries)
        return e

    def get(self, name: str) -> T:
        return self.entry(name).value

    def find(self, name: str) -> T | None:
        e = self._entries.get(name)
        return e.value if e is not None else None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[Entry[T]]:
        return list(self._entries.values())
