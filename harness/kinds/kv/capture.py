"""What a connector saw, on disk: page bytes + one JSON line per page, per process, per phase.

Layout of one phase's capture folder (``<run>/capture/<phase>/``)::

    worker-<rank>.pages.bin     the raw bytes of captured pages, appended
    worker-<rank>.pages.jsonl   one line per page: side (written/restored), key, layer, group,
                                token range, request, case, lane, digest, dtype, shape, offset,
                                kept (why its bytes are there or not); a batch of 64 pages or
                                more as one columnar "pages" line (the same fields as lists);
                                plus load errors and per-batch timings
    scheduler.jsonl             one line per request (prompt length, connector hit counts), per
                                stored chunk, and the refusal when the connector refused to start

Each process appends and flushes after every batch, so an engine that dies mid-run leaves a
readable prefix. The reader names the file and line of anything malformed and never guesses.

This module is the host side (the format's vocabulary and the reader); the writer that runs inside
vLLM's processes is :mod:`harness.kinds.kv.capture_write`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.kv_pages.evidence import CaptureError
from harness.kv_pages.identity import PageRef

Side = Literal["written", "restored"]


@dataclass(frozen=True, slots=True)
class PageTag:
    """Which request a captured page came from."""

    req: str
    case: str
    lane: str


@dataclass(frozen=True, slots=True)
class CapturedPage:
    """One page as a connector saw it: where, its digest, and where its bytes are kept."""

    ref: PageRef
    side: Side
    tag: PageTag
    digest: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    path: Path | None
    """The ``.pages.bin`` holding the bytes; None for a digest-only duplicate."""
    offset: int | None

    def read(self) -> bytes:
        """The page's bytes; :class:`CaptureError` (naming the file) when missing or truncated."""
        if self.path is None or self.offset is None:
            raise CaptureError(f"{self.ref.describe()}: only its digest was kept (a duplicate page, or "
                               "a digest-only capture whose digest matched: its bytes are in the store)")
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(self.nbytes)
        except OSError as e:
            raise CaptureError(f"{self.path}: cannot read {self.ref.describe()}: {e}") from None
        if len(data) != self.nbytes:
            raise CaptureError(f"{self.path}: truncated: {self.ref.describe()} needs bytes "
                               f"[{self.offset}, {self.offset + self.nbytes}) but the file has "
                               f"{self.offset + len(data)}")
        return data

    def check_present(self) -> str | None:
        """Why the bytes could not be read back (missing / truncated file), without reading them."""
        if self.path is None or self.offset is None:
            return None
        try:
            size = self.path.stat().st_size
        except OSError:
            return f"{self.path.name}: missing"
        if size < self.offset + self.nbytes:
            return f"{self.path.name}: truncated ({size} bytes, page ends at {self.offset + self.nbytes})"
        return None


@dataclass(frozen=True, slots=True)
class PageProblem:
    """A page the connector could not serve or capture (store file missing, corrupted, ...)."""

    ref: PageRef
    side: Side
    tag: PageTag
    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the scheduler-side connector saw of one request."""

    req: str
    case: str
    lane: str
    prompt_len: int
    local_hit: int
    """Tokens the engine's own prefix cache served."""
    matched: int
    """What the connector answered to ``get_num_new_matched_tokens``."""
    external: int
    """Tokens the engine allocated for the connector to load (``update_state_after_alloc``)."""
    load_async: bool


@dataclass(frozen=True, slots=True)
class Capture:
    """One phase's capture, read back."""

    folder: Path
    pages: tuple[CapturedPage, ...]
    problems: tuple[PageProblem, ...]
    requests: tuple[RequestFacts, ...]
    stored: tuple[Mapping[str, Any], ...]
    """Chunks the harness store wrote (one line each; ``dedup`` lines name skipped re-writes)."""
    refusal: str | None
    setup: Mapping[str, Any]
    store_problems: tuple[Mapping[str, Any], ...]
    """Requests whose whole store was unreadable (``case``, ``lane``, ``kind``, ``reason``)."""
    """The connector's view of the engine: KV-cache groups (index, block_size, layers, paged), tp."""
    capture_seconds: float
    captured_bytes: int
    malformed: tuple[str, ...] = field(default_factory=tuple)
    """``file:line: why`` for every line that could not be parsed."""

    def side(self, side: Side) -> list[CapturedPage]:
        return [p for p in self.pages if p.side == side]


def _column_pages(folder: Path, d: Mapping[str, Any]) -> list[CapturedPage]:
    """The pages of one columnar ``pages`` line (a batch of at least
    :data:`harness.kinds.kv.capture_write.COLUMNS_MIN` pages)."""
    n = len(d["key"])
    cols = ("layer", "group", "start", "end", "shard", "req", "case", "lane", "digest", "kept", "offset")
    if any(len(d[c]) != n for c in cols):
        raise ValueError(f"columns of unequal length ({n} keys)")
    shape = tuple(int(x) for x in d["shape"])
    file = folder / d["file"]
    out = []
    for i in range(n):
        off = d["offset"][i]
        out.append(CapturedPage(
            PageRef(str(d["key"][i]), str(d["layer"][i]), int(d["group"][i]), int(d["start"][i]),
                    int(d["end"][i]), int(d["shard"][i])), d["side"],
            PageTag(str(d["req"][i]), str(d["case"][i]), str(d["lane"][i])), str(d["digest"][i]),
            int(d["nbytes"]), str(d["dtype"]), shape, file if off is not None else None,
            int(off) if off is not None else None))
    return out


def _ref(d: Mapping[str, Any]) -> PageRef:
    return PageRef(str(d["key"]), str(d["layer"]), int(d["group"]), int(d["start"]), int(d["end"]),
                   int(d.get("shard", 0)))


def _tag(d: Mapping[str, Any]) -> PageTag:
    return PageTag(str(d.get("req", "")), str(d.get("case", "")), str(d.get("lane", "")))


def _lines(path: Path) -> Iterable[tuple[int, dict[str, Any] | str]]:
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                yield n, f"not JSON ({e.msg})"
                continue
            yield n, d if isinstance(d, dict) else "not a JSON object"


def read_capture(folder: Path) -> Capture:
    """Read one phase folder; malformed lines are listed, never skipped silently."""
    if not folder.is_dir():
        raise CaptureError(f"{folder}: no capture folder (did the engine start with the connector?)")
    pages: list[CapturedPage] = []
    problems: list[PageProblem] = []
    malformed: list[str] = []
    seconds, nbytes = 0.0, 0
    for idx in sorted(folder.glob("worker-*.pages.jsonl")):
        for n, d in _lines(idx):
            if isinstance(d, str):
                malformed.append(f"{idx.name}:{n}: {d}")
                continue
            try:
                kind = d["t"]
                if kind == "page":
                    file = d.get("file")
                    pages.append(CapturedPage(
                        _ref(d), d["side"], _tag(d), str(d["digest"]), int(d["nbytes"]), str(d["dtype"]),
                        tuple(int(x) for x in d["shape"]), folder / file if file else None,
                        int(d["offset"]) if d.get("offset") is not None else None))
                elif kind == "pages":
                    pages += _column_pages(folder, d)
                elif kind == "error":
                    problems.append(PageProblem(_ref(d), d["side"], _tag(d), str(d["kind"]),
                                                str(d["reason"])))
                elif kind == "batch":
                    seconds += float(d["seconds"])
                    nbytes += int(d["bytes"])
            except (KeyError, TypeError, ValueError) as e:
                malformed.append(f"{idx.name}:{n}: {type(e).__name__}: {e}")
    requests: list[RequestFacts] = []
    stored: list[Mapping[str, Any]] = []
    refusal = None
    setup: dict[str, Any] = {}
    store_problems: list[Mapping[str, Any]] = []
    sched = folder / "scheduler.jsonl"
    if sched.exists():
        for n, d in _lines(sched):
            if isinstance(d, str):
                malformed.append(f"{sched.name}:{n}: {d}")
                continue
            try:
                if d["t"] == "request":
                    requests.append(RequestFacts(
                        str(d["req"]), str(d["case"]), str(d["lane"]), int(d["prompt_len"]),
                        int(d["local_hit"]), int(d["matched"]), int(d["external"]), bool(d["async"])))
                elif d["t"] == "store":
                    stored.append(d)
                elif d["t"] == "refused":
                    refusal = str(d["reason"])
                elif d["t"] == "setup":
                    setup = d
                elif d["t"] == "store_problem":
                    store_problems.append(d)
            except (KeyError, TypeError, ValueError) as e:
                malformed.append(f"{sched.name}:{n}: {type(e).__name__}: {e}")
    return Capture(folder, tuple(pages), tuple(problems), tuple(requests), tuple(stored), refusal,
                   setup, tuple(store_problems), seconds, nbytes, tuple(malformed))


def written_digests(folder: Path) -> dict[tuple[str, str, int], str]:
    """Page id (key, layer, shard) -> the digest of its first write, from a capture folder's index
    (what a digest-only restore compares against). Malformed lines are skipped here; the full
    reader (:func:`read_capture`) names them."""
    out: dict[tuple[str, str, int], str] = {}
    for idx in sorted(Path(folder).glob("worker-*.pages.jsonl")):
        for _, d in _lines(idx):
            if isinstance(d, dict) and d.get("t") == "page" and d.get("side") == "written":
                try:
                    out.setdefault((str(d["key"]), str(d["layer"]), int(d.get("shard", 0))), str(d["digest"]))
                except (KeyError, TypeError, ValueError):
                    continue
    return out
