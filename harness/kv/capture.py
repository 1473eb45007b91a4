"""What a connector saw, on disk: page bytes + one JSON line per page, per process, per phase.

Layout of one phase's capture folder (``<run>/capture/<phase>/``)::

    worker-<rank>.pages.bin     the raw bytes of captured pages, appended
    worker-<rank>.pages.jsonl   one line per page: side (written/restored), key, layer, group,
                                token range, request, case, lane, digest, dtype, shape, offset;
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

import torch

from harness.kv.digest import as_page_bytes, page_digests
from harness.kv.pages import PageRef
from harness.kv.plan import PagePlan

Side = Literal["written", "restored"]


class CaptureError(ValueError):
    """A capture folder that cannot be read; the message names the file and line."""


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


class CaptureWriter:
    """Worker-side: appends pages to ``worker-<rank>.pages.{bin,jsonl}`` in a phase folder."""

    def __init__(self, folder: Path, rank: int = 0) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.bin_name = f"worker-{rank}.pages.bin"
        self._bin = open(folder / self.bin_name, "ab")  # noqa: SIM115 - lives as long as the engine
        self._idx = open(folder / f"worker-{rank}.pages.jsonl", "a")  # noqa: SIM115
        self._offset = self._bin.tell()
        self.seconds = 0.0

    def pages(self, side: Side, refs: Sequence[PageRef], tags: Sequence[PageTag], pages: torch.Tensor,
              keep_bytes: Sequence[bool] | None = None, digests: Sequence[str] | None = None,
              step: int = -1) -> list[str]:
        """Record ``pages`` ([P, ...] on any device; row i is ``refs[i]``). Returns the digests.

        ``keep_bytes[i]`` False records the digest only (a page already captured under that key).
        """
        t0 = time.perf_counter()
        if digests is None:
            digests = page_digests(pages)
        raw = as_page_bytes(pages)
        keep = list(keep_bytes) if keep_bytes is not None else [True] * len(refs)
        rows = [i for i, k in enumerate(keep) if k]
        if len(rows) == raw.shape[0]:
            host = raw.cpu().numpy()
        else:
            host = raw.index_select(0, torch.tensor(rows, device=raw.device)).cpu().numpy() if rows else None
        shape = list(pages.shape[1:])
        lines = []
        pos = 0
        for i, (ref, tag, dig) in enumerate(zip(refs, tags, digests, strict=True)):
            offset = None
            if keep[i]:
                assert host is not None
                offset = self._offset
                self._bin.write(host[pos].tobytes())
                self._offset += raw.shape[1]
                pos += 1
            lines.append(json.dumps({
                "t": "page", "side": side, "key": ref.key, "layer": ref.layer, "group": ref.group,
                "start": ref.start, "end": ref.end, "shard": ref.shard, "req": tag.req,
                "case": tag.case, "lane": tag.lane, "digest": dig, "nbytes": int(raw.shape[1]),
                "dtype": str(pages.dtype).removeprefix("torch."), "shape": shape,
                "file": self.bin_name if offset is not None else None, "offset": offset,
                "step": step}, sort_keys=True))
        self._bin.flush()
        dt = time.perf_counter() - t0
        self.seconds += dt
        lines.append(json.dumps({"t": "batch", "side": side, "pages": len(refs),
                                 "bytes": int(raw.shape[1]) * len(rows), "seconds": dt}))
        self._idx.write("\n".join(lines) + "\n")
        self._idx.flush()
        return list(digests)

    def error(self, side: Side, ref: PageRef, tag: PageTag, kind: str, reason: str) -> None:
        self._idx.write(json.dumps({
            "t": "error", "side": side, "key": ref.key, "layer": ref.layer, "group": ref.group,
            "start": ref.start, "end": ref.end, "shard": ref.shard, "req": tag.req, "case": tag.case,
            "lane": tag.lane, "kind": kind, "reason": reason}, sort_keys=True) + "\n")
        self._idx.flush()

    def close(self) -> None:
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
            raise CaptureError(f"{self.ref.describe()}: only its digest was kept (duplicate page)")
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
                   pages: Sequence[PagePlan], step: int) -> None:
    """Record the planned pages of one layer as they sit in the paged buffer ``kv`` (both the
    harness connector and the tap call this, on the write side and on the restore side)."""
    rank = worker_rank()
    data = gather(kv, [p.block_id for p in pages])
    refs = [PageRef(p.key, layer, p.group, p.start, p.end, rank) for p in pages]
    tags = [PageTag(p.req, p.case, p.lane) for p in pages]
    capture.pages(side, refs, tags, data, keep_bytes=[not p.dup for p in pages], step=step)
