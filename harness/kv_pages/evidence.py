"""What one case of a KV round trip left behind: the facts the KV comparators judge.

Below the comparators and the contracts (it imports only :mod:`harness.kv_pages.identity`), so that
:mod:`harness.api` and :mod:`harness.compare` can name these types without reaching up into
:mod:`harness.kinds.kv`, which uses both.

Built by :mod:`harness.kinds.kv.roundtrip` from the two phases' captures and the engines' outputs; judged
by ``byte_equal`` (pages) and ``kv_hits`` (how many prompt tokens the connector really served).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from harness.kv_pages.identity import PageRef


class CaptureError(ValueError):
    """A capture folder that cannot be read; the message names the file and line."""


class Page(Protocol):
    """A captured page: :class:`harness.kinds.kv.capture.CapturedPage`, or an in-memory one for controls."""

    ref: PageRef
    digest: str
    nbytes: int

    def read(self) -> bytes:
        """The page's bytes; :class:`CaptureError` when they cannot be read back."""
        ...

    def check_present(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class MemoryPage:
    """A page held in memory (controls and unit tests)."""

    ref: PageRef
    digest: str
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def read(self) -> bytes:
        return self.data

    def check_present(self) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class Problem:
    """A page the restoring connector could not serve (``missing``, ``truncated``, ``corrupt``)."""

    ref: PageRef
    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class CaseEvidence:
    """One request of the consumer phase, with everything needed to judge its restore."""

    model: str
    case_id: str
    lane: str
    prompt_len: int
    chunk_size: int
    """The connector's storage granularity C (for a wrapped connector: what the suite expects)."""
    expected_hit: int
    """Prompt tokens that must come from the connector: ``floor((N - 1) / C) * C``."""
    expected: tuple[PageRef, ...]
    """Every page (all layers, all shards) of the expected hit range."""
    written: Mapping[tuple[str, str, int], Page]
    """Pages the producer wrote, by ``PageRef.id`` (first write of each key)."""
    restored: tuple[Page, ...]
    """This request's pages as they sat in the consumer's buffer after the load."""
    problems: tuple[Problem, ...] = ()
    engine_cached: int | None = None
    """``num_cached_tokens`` the engine reported for the request (prefix caching is off, so all of
    it came through the connector)."""
    connector_matched: int | None = None
    """What the connector answered to ``get_num_new_matched_tokens``."""
    connector_external: int | None = None
    """Tokens the engine allocated for the connector to load."""
    stored_times: Mapping[str, int] = field(default_factory=dict)
    """Chunk key -> how many times the store wrote it (harness store only; empty for a tap)."""
    finish_reason: str = ""
    error: str | None = None
    notes: tuple[str, ...] = ()

    def as_written(self) -> CaseEvidence | str:
        """This case as a perfect restore would leave it — every expected page back as the producer
        wrote it, the engine and the connector counting the expected hit, nothing stored twice — or
        why there is none (a page the producer never wrote). The page comparators' controls plant
        their faults in it, so a control judges the comparator, not the run."""
        pages = []
        for ref in self.expected:
            w = self.written.get(ref.id)
            if w is None:
                return f"the producer never wrote page {ref.describe()}"
            try:
                pages.append(MemoryPage(ref, w.digest, bytes(w.read())))
            except CaptureError as e:
                return f"page {ref.describe()} cannot be read back: {e}"
        return replace(self, restored=tuple(pages), problems=(), engine_cached=self.expected_hit,
                       connector_matched=self.expected_hit, connector_external=self.expected_hit,
                       stored_times=dict.fromkeys(self.stored_times, 1), finish_reason="length",
                       error=None)

    def layers(self) -> list[str]:
        return sorted({r.layer for r in self.expected} | {p.ref.layer for p in self.restored})

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case_id, "lane": self.lane, "prompt_len": self.prompt_len,
                "chunk_size": self.chunk_size, "expected_hit": self.expected_hit,
                "expected_pages": len(self.expected), "restored_pages": len(self.restored),
                "engine_cached": self.engine_cached, "connector_matched": self.connector_matched,
                "connector_external": self.connector_external}
