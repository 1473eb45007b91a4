"""The capture's writer, inside vLLM's processes: page bytes and index lines appended per worker
(:class:`CaptureWriter`), one line per scheduler event (:class:`SchedulerLog`). The format and its
reader are :mod:`harness.kinds.kv.capture`.

Imported by the connectors (:mod:`harness.kinds.kv.connector`, :mod:`harness.kinds.kv.tap`) under whichever
vLLM release the engine runs: it needs only torch, numpy, the standard library and the harness's
own KV modules.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from harness.kinds.kv.capture import PageTag, Side
from harness.kinds.kv.plan import PagePlan
from harness.kv_pages.digest import as_page_bytes, page_digests
from harness.kv_pages.identity import PageRef
from harness.kv_pages.layout import check_ids, page_nbytes, page_shape


def gather(kv: torch.Tensor, block_ids: Sequence[int], block_dim: int = 0) -> torch.Tensor:
    """The pages ``block_ids`` of ``kv`` (counted along ``block_dim``, :mod:`harness.kv_pages.layout`) as
    a new [P, ...] tensor on the cache's device.

    ``index_select`` rather than ``kv[ids]``: advanced indexing fans out to OpenMP threads even for
    two pages, which on a busy CPU host costs milliseconds per call.
    """
    check_ids(kv, block_ids, block_dim)
    pages = kv.index_select(block_dim, torch.tensor(list(block_ids), dtype=torch.long, device=kv.device))
    return pages if block_dim == 0 else pages.movedim(block_dim, 0)


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
                    expected: Sequence[str | None] | None = None, block_dim: int = 0) -> list[str]:
        """Record the pages ``block_ids`` of a paged cache (counted along ``block_dim``) where they
        sit: digests in place (no gather on a GPU), bytes gathered only for the pages whose bytes
        are kept."""
        from harness.kv_pages.digest import cache_digests

        t0 = time.perf_counter()
        digests = cache_digests(kv, block_ids, block_dim)
        why = self._rows_to_keep(len(refs), keep_bytes, digests, expected)
        rows = [block_ids[i] for i, w in enumerate(why) if w in ("all", "mismatch")]
        sel = as_page_bytes(gather(kv, rows, block_dim)) if rows else None
        self._record(side, refs, tags, digests, why, sel, page_nbytes(kv, block_dim),
                     str(kv.dtype).removeprefix("torch."), page_shape(kv, block_dim), step, t0)
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


def worker_rank() -> int:
    """This worker's tensor-parallel rank (0 when vLLM's groups are not set up)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 - outside an engine there is no group
        return int(os.environ.get("RANK", "0"))


def record_planned(capture: CaptureWriter, side: Any, layer: str, kv: torch.Tensor,
                   pages: Sequence[PagePlan], step: int,
                   expected: Mapping[tuple[str, str, int], str] | None = None, block_dim: int = 0) -> None:
    """Record the planned pages of one layer as they sit in the paged buffer ``kv`` (both the
    harness connector and the tap call this, on the write side and on the restore side).

    ``expected`` (digest-only capture, restore side): page id -> the digest the producer wrote, as
    :func:`harness.kinds.kv.capture.written_digests` reads it from the producer's capture. ``block_dim``:
    the dimension of ``kv`` that counts blocks (:class:`harness.kv_pages.layout.BlockDims`)."""
    rank = worker_rank()
    refs = [PageRef(p.key, layer, p.group, p.start, p.end, rank) for p in pages]
    tags = [PageTag(p.req, p.case, p.lane) for p in pages]
    want = [expected.get(r.id) for r in refs] if expected is not None else None
    capture.cache_pages(side, refs, tags, kv, [p.block_id for p in pages],
                        keep_bytes=[not p.dup for p in pages], step=step, expected=want, block_dim=block_dim)
