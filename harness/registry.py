"""Name -> thing registries that answer an unknown name with the closest valid ones."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UnknownName(ValueError):
    """A user named something that does not exist; the message lists the valid names."""


def unknown(kind: str, name: str, valid: Iterable[str]) -> UnknownName:
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return UnknownName(f"unknown {kind} {name!r}.{hint} Valid: {', '.join(valid)}")
