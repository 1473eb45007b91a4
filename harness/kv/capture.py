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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from harness.kv.digest import as_page_bytes, page_digests
from harness.kv.evidence import CaptureError
from harness.kv.pages import PageRef
from harness.kv.plan import PagePlan

Side = Literal["written", "restored"]


@dataclass(frozen=True, slots=True)
class PageTag:
    """Which request a captured page came from."""

    req: str
    case: str
    lane: str


def gather(kv: torch.Tensor, block_ids: Sequence[int]) -> torch.Tensor:
    """The pages ``kv[block_ids]`` as a new [P, ...] tensor on the cache's device.

    ``index_select`` rather than ``kv[ids]``: advanced indexing fans out to OpenMP threads even for
    two pages, which on a busy CPU host costs milliseconds per call.
    """
    return kv.index_select(0, torch.tensor(list(block_ids), dtype=torch.long, device=kv.device))


COLUMNS_MIN = 64
"""A batch of this many pages or more is indexed as one columnar ``pages`` line instead of one
line per page (the same fields, as lists; the reader expands it)."""

KeepBytes = Literal["all", "mismatch"]
"""What a capture keeps of a page besides its digest: its bytes always (``all``), or only when its
digest differs from the one expected of it (``mismatch``: digest-only capture, for GPU caches)."""


class HostStager:
    """Page bytes device -> host through two reusable pinned buffers, asynchronously.

    A batch's copy is queued on the current stream, after the kernels that wrote the pages and
    before any that may overwrite them, into pinned memory (a pageable copy runs at a fraction of
    the link's rate and blocks); the host waits for it only when the bytes are written out, one
    batch later, so the copy of one batch overlaps the file write of the previous one. Host tensors
    (a CPU cache) are copied at once: there is no link to overlap.
    """

    def __init__(self) -> None:
        self._slots: list[torch.Tensor | None] = [None, None]
        self._turn = 0

    def start(self, raw: torch.Tensor) -> tuple[Any, np.ndarray]:
        """(a handle to wait on, the host array the bytes of ``raw`` [P, nbytes] uint8 land in)."""
        if raw.device.type == "cpu":
            return None, raw.numpy().copy()
        n = raw.numel()
        slot = self._turn
        self._turn ^= 1
        buf = self._slots[slot]
        if buf is None or buf.numel() < n:
            buf = self._slots[slot] = torch.empty(max(n, 1), dtype=torch.uint8, pin_memory=True)
        dst = buf[:n].view(raw.shape)
        dst.copy_(raw, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(raw.device))
        return event, dst.numpy()

    @staticmethod
    def wait(handle: Any) -> None:
        if handle is not None:
            handle.synchronize()


class _PageLines:
    """The index line of a page, exactly ``json.dumps(fields, sort_keys=True)``, assembled from the
    batch's shared fields and each page's own (a 100k-token cache records 200k pages a pass: one
    ``json.dumps`` each cost more than digesting them on a GPU)."""

    def __init__(self, side: str, dtype: str, shape: list[int], nbytes: int, step: int, file: str) -> None:
        d = json.dumps
        self.mid = f'"dtype": {d(dtype)}, '
        self.file_some = f'"file": {d(file)}, '
        self.shape = f'"shape": {d(shape)}, '
        self.nbytes, self.side, self.step = nbytes, d(side), step
        self._s: dict[str, str] = {}

    def _q(self, x: str) -> str:
        q = self._s.get(x)
        if q is None:
            q = self._s[x] = json.dumps(x)
        return q

    def __call__(self, ref: PageRef, tag: PageTag, digest: str, kept: str, offset: int | None) -> str:
        q = self._q
        return (f'{{"case": {q(tag.case)}, "digest": {json.dumps(digest)}, {self.mid}"end": {ref.end}, '
                f'{self.file_some if offset is not None else chr(34) + "file" + chr(34) + ": null, "}'
                f'"group": {ref.group}, "kept": {q(kept)}, "key": {json.dumps(ref.key)}, '
                f'"lane": {q(tag.lane)}, "layer": {q(ref.layer)}, "nbytes": {self.nbytes}, '
                f'"offset": {"null" if offset is None else offset}, "req": {q(tag.req)}, {self.shape}'
                f'"shard": {ref.shard}, "side": {self.side}, "start": {ref.start}, "step": {self.step}, '
                f'"t": "page"}}')


class CaptureWriter:
    """Worker-side: appends pages to ``worker-<rank>.pages.{bin,jsonl}`` in a phase folder.

    ``keep`` = ``mismatch`` is the digest-only capture: digests are taken where the pages live (on
    a GPU by the fused kernel, without gathering them) and bytes leave the device only for pages
    whose digest differs from the one the caller expected (the producer's digest of the same page),
    fetched then from the still-live buffer, so that a failure can still name its first differing
    byte; the other side of such a pair is read from the store.
    """

    def __init__(self, folder: Path, rank: int = 0, keep: KeepBytes = "all") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.keep = keep
        self.bin_name = f"worker-{rank}.pages.bin"
        self._bin = open(folder / self.bin_name, "ab")  # noqa: SIM115 - lives as long as the engine
        self._idx = open(folder / f"worker-{rank}.pages.jsonl", "a")  # noqa: SIM115
        self._offset = self._bin.tell()
        self._stager = HostStager()
        self._pending: tuple[Any, np.ndarray | None, list[str], dict[str, Any]] | None = None
        self.seconds = 0.0

    def _rows_to_keep(self, n: int, keep_bytes: Sequence[bool] | None, digests: Sequence[str],
                      expected: Sequence[str | None] | None) -> list[str]:
        """Per page: why its bytes are kept (``all``, ``mismatch``) or not (``duplicate``,
        ``digest-only``)."""
        base = list(keep_bytes) if keep_bytes is not None else [True] * n
        if self.keep == "all":
            return ["all" if k else "duplicate" for k in base]
        exp = list(expected) if expected is not None else [None] * n
        return ["mismatch" if k and e is not None and e != d else ("digest-only" if k else "duplicate")
                for k, d, e in zip(base, digests, exp, strict=True)]

    def pages(self, side: Side, refs: Sequence[PageRef], tags: Sequence[PageTag], pages: torch.Tensor,
              keep_bytes: Sequence[bool] | None = None, digests: Sequence[str] | None = None,
              step: int = -1, expected: Sequence[str | None] | None = None) -> list[str]:
        """Record ``pages`` ([P, ...] on any device; row i is ``refs[i]``). Returns the digests.

        ``keep_bytes[i]`` False records the digest only (a page already captured under that key);
        ``expected[i]``: the digest page i should have (digest-only capture keeps its bytes only
        when they differ).
        """
        t0 = time.perf_counter()
        if digests is None:
            digests = page_digests(pages)
        raw = as_page_bytes(pages)
        why = self._rows_to_keep(len(refs), keep_bytes, digests, expected)
        rows = [i for i, w in enumerate(why) if w in ("all", "mismatch")]
        sel = raw if len(rows) == raw.shape[0] else (
            raw.index_select(0, torch.tensor(rows, device=raw.device)) if rows else None)
        self._record(side, refs, tags, digests, why, sel, int(raw.shape[1]),
                     str(pages.dtype).removeprefix("torch."), list(pages.shape[1:]), step, t0)
        return list(digests)

    def cache_pages(self, side: Side, refs: Sequence[PageRef], tags: Sequence[PageTag], kv: torch.Tensor,
                    block_ids: Sequence[int], keep_bytes: Sequence[bool] | None = None, step: int = -1,
                    expected: Sequence[str | None] | None = None) -> list[str]:
        """Record the pages ``kv[block_ids]`` of a paged cache where they sit: digests in place (no
        gather on a GPU), bytes gathered only for the pages whose bytes are kept."""
        from harness.kv.digest import cache_digests

        t0 = time.perf_counter()
        digests = cache_digests(kv, block_ids)
        why = self._rows_to_keep(len(refs), keep_bytes, digests, expected)
        rows = [block_ids[i] for i, w in enumerate(why) if w in ("all", "mismatch")]
        sel = as_page_bytes(gather(kv, rows)) if rows else None
        nbytes = int(kv[0].numel() * kv.element_size())
        self._record(side, refs, tags, digests, why, sel, nbytes, str(kv.dtype).removeprefix("torch."),
                     list(kv.shape[1:]), step, t0)
        return digests

    def _record(self, side: Side, refs: Sequence[PageRef], tags: Sequence[PageTag], digests: Sequence[str],
                why: Sequence[str], sel: torch.Tensor | None, nbytes: int, dtype: str, shape: list[int],
                step: int, t0: float) -> None:
        """Queue the kept bytes' copy, then write the previous batch (bytes first, then its index
        lines), so this batch's copy overlaps that write."""
        handle, host = self._stager.start(sel) if sel is not None else (None, None)
        offsets: list[int | None] = []
        for w in why:
            offsets.append(self._offset if w in ("all", "mismatch") else None)
            if offsets[-1] is not None:
                self._offset += nbytes
        if len(refs) >= COLUMNS_MIN:  # one line for the batch: a 100k-token pass records 200k pages
            lines = [json.dumps({
                "t": "pages", "side": side, "nbytes": nbytes, "dtype": dtype, "shape": shape, "step": step,
                "file": self.bin_name, "key": [r.key for r in refs], "layer": [r.layer for r in refs],
                "group": [r.group for r in refs], "start": [r.start for r in refs],
                "end": [r.end for r in refs], "shard": [r.shard for r in refs], "req": [t.req for t in tags],
                "case": [t.case for t in tags], "lane": [t.lane for t in tags], "digest": list(digests),
                "kept": list(why), "offset": offsets}, sort_keys=True)]
        else:
            line = _PageLines(side, dtype, shape, nbytes, step, self.bin_name)
            lines = [line(ref, tag, dig, w, off)
                     for ref, tag, dig, w, off in zip(refs, tags, digests, why, offsets, strict=True)]
        kept = 0 if sel is None else int(sel.shape[0])
        batch = {"t": "batch", "side": side, "pages": len(refs), "bytes": nbytes * kept,
                 "seconds": time.perf_counter() - t0}
        self.flush()
        self._pending = (handle, host, lines, batch)
        self.seconds += batch["seconds"]
        if handle is None:  # host bytes: nothing in flight to overlap, write now (a crash loses nothing)
            self.flush()

    def flush(self) -> None:
        """Write the batch whose copy is in flight (bytes, then its index lines). A GPU capture
        leaves its last batch in flight: the connector calls this (or :meth:`close`) once a step's
        pages are all recorded."""
        if self._pending is None:
            return
        t0 = time.perf_counter()
        handle, host, lines, batch = self._pending
        self._pending = None
        HostStager.wait(handle)
        if host is not None:
            self._bin.write(host.tobytes())
            self._bin.flush()
        dt = time.perf_counter() - t0
        self.seconds += dt
        self._idx.write("\n".join([*lines, json.dumps({**batch, "seconds": batch["seconds"] + dt})]) + "\n")
        self._idx.flush()

    def error(self, side: Side, ref: PageRef, tag: PageTag, kind: str, reason: str) -> None:
        self._idx.write(json.dumps({
            "t": "error", "side": side, "key": ref.key, "layer": ref.layer, "group": ref.group,
            "start": ref.start, "end": ref.end, "shard": ref.shard, "req": tag.req, "case": tag.case,
            "lane": tag.lane, "kind": kind, "reason": reason}, sort_keys=True) + "\n")
        self._idx.flush()

    def close(self) -> None:
        if not self._idx.closed:
            self.flush()
        for f in (self._bin, self._idx):
            if not f.closed:
                f.close()


class SchedulerLog:
    """Scheduler-side: one JSON line per event in ``scheduler.jsonl``."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "scheduler.jsonl"

    def write(self, event: str, /, **fields: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"t": event, **fields}, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# Reading a capture back


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
    """The pages of one columnar ``pages`` line (a batch of at least :data:`COLUMNS_MIN` pages)."""
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


def worker_rank() -> int:
    """This worker's tensor-parallel rank (0 when vLLM's groups are not set up)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 - outside an engine there is no group
        return int(os.environ.get("RANK", "0"))


def record_planned(capture: CaptureWriter, side: Any, layer: str, kv: torch.Tensor,
                   pages: Sequence[PagePlan], step: int,
                   expected: Mapping[tuple[str, str, int], str] | None = None) -> None:
    """Record the planned pages of one layer as they sit in the paged buffer ``kv`` (both the
    harness connector and the tap call this, on the write side and on the restore side).

    ``expected`` (digest-only capture, restore side): page id -> the digest the producer wrote, as
    :func:`written_digests` reads it from the producer's capture."""
    rank = worker_rank()
    refs = [PageRef(p.key, layer, p.group, p.start, p.end, rank) for p in pages]
    tags = [PageTag(p.req, p.case, p.lane) for p in pages]
    want = [expected.get(r.id) for r in refs] if expected is not None else None
    capture.cache_pages(side, refs, tags, kv, [p.block_id for p in pages],
                        keep_bytes=[not p.dup for p in pages], step=step, expected=want)


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
