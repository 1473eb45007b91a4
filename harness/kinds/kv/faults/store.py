"""Planted-fault stores: doubles of :class:`PageStore` that prove the byte-equal gate bites.

Each one damages exactly one page the first time it serves the chosen layer, and writes what it
did to ``planted-<lane>.json`` in the capture folder, so a test (or the gate's own controls) can
check that the failing verdict names that very page.

* ``flip``: serves the page with one byte xor-ed (a store or transport that corrupts silently;
  the store's own checksum has already passed, so only the written-vs-restored comparison sees it).
* ``drop``: answers that the page is not there although the chunk was listed (a store that lost a
  page behind a stale index).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.kinds.kv.store import PageRead, PageStore

FAULTS = ("flip", "drop")


class FaultyStore:
    """Serves like ``base`` except for one planted fault (see the module docstring)."""

    def __init__(self, base: PageStore, kind: str, layer: str, page: int = 0, offset: int = 0,
                 report: Path | None = None) -> None:
        if kind not in FAULTS:
            raise ValueError(f"unknown planted fault {kind!r}; valid: {', '.join(FAULTS)}")
        self.base = base
        self.root = base.root
        self.kind = kind
        self.layer = layer
        self.page = page
        self.offset = offset
        self.report = report
        self.done = False

    def has(self, key: str, layers: Sequence[str]) -> bool:
        return self.base.has(key, layers)

    def get(self, key: str, layer: str, n_pages: int) -> list[PageRead]:
        reads = self.base.get(key, layer, n_pages)
        if self.done or layer != self.layer or self.page >= len(reads) or reads[self.page].data is None:
            return reads
        self.done = True
        good = reads[self.page].data
        assert good is not None
        meta = self.base.meta(key, layer)
        tokens = int(meta["end"]) - int(meta["start"])
        page_tokens = tokens // n_pages
        start = int(meta["start"]) + self.page * page_tokens
        fact: dict[str, Any] = {"kind": self.kind, "chunk": key, "layer": layer, "page_in_chunk": self.page,
                                "start": start, "end": start + page_tokens}
        if self.kind == "flip":
            buf = np.frombuffer(good, dtype=np.uint8).copy()
            off = self.offset % buf.size
            buf[off] ^= 0x01
            reads[self.page] = PageRead(buf.tobytes())
            fact["offset"] = off
        else:
            reads[self.page] = PageRead(None, "missing", "page not in the store (planted drop)")
        if self.report is not None:
            self.report.write_text(json.dumps(fact, sort_keys=True))
        return reads

    def meta(self, key: str, layer: str) -> dict[str, Any]:
        return self.base.meta(key, layer)


def read_planted(folder: Path) -> dict[str, Mapping[str, Any]]:
    """lane -> what its planted-fault store did (empty when nothing was planted or served)."""
    out = {}
    for p in sorted(folder.glob("planted-*.json")):
        out[p.stem.removeprefix("planted-")] = json.loads(p.read_text())
    return out
