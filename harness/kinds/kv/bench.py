"""Throughput figures for the KV gate, all measured in the gate's own process on the same bytes.

* ``compare``: the byte_equal comparator over every page pair of the run (digests first; the
  pages are equal, so no bytes are read): bytes judged per second;
* ``compare_bytes``: the path where digests do not settle it (they differ, or were taken by two
  algorithms), every pair read and compared, byte by byte where they differ;
* ``diff``: pairs that differ in one byte: the first differing byte and the count, per pair;
* ``digest``: the page digest over the same bytes on this host (the capture-side cost per byte:
  ``xxh128``), and ``digest_mx128``: the ``mx128`` digest on the host (interpreters without
  ``xxhash``, and re-checking pages a GPU digested);
* ``memcpy``: a plain copy of the same bytes, the yardstick the others are read against.

Each figure repeats its work until it has run for at least ``min_s`` seconds, so that small runs
still give stable rates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from harness.kv_pages.digest import NAME, host_digests, page_digests
from harness.perf import rate


def throughput(judge_all: Callable[[], Any], pairs: Sequence[tuple[bytes, bytes]],
               min_s: float = 0.2, rounds: int = 1) -> dict[str, float]:
    """Bytes/s of the comparator (``judge_all`` judges every pair once), the byte diff, the digest
    and memcpy, over ``pairs`` = [(written bytes, restored bytes), ...].

    Torch runs single-threaded here, as in vLLM's CPU worker where the capture digests run: on a
    busy small host, OpenMP threads spinning against other processes make any figure meaningless.
    ``rounds``: see :func:`harness.perf.rate`.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _throughput(judge_all, pairs, min_s, rounds)
    finally:
        torch.set_num_threads(threads)


def _throughput(judge_all: Callable[[], Any], pairs: Sequence[tuple[bytes, bytes]],
                min_s: float, rounds: int) -> dict[str, float]:
    from harness.compare.byte_equal import diff_bytes

    total = sum(len(a) for a, _ in pairs)
    if total == 0:
        return {"bytes": 0}
    flat = np.frombuffer(b"".join(a for a, _ in pairs), np.uint8)
    dst = np.empty_like(flat)
    page = len(pairs[0][0])
    same_size = all(len(a) == page for a, _ in pairs)
    pages = torch.from_numpy(flat.copy()).reshape(len(pairs), page) if same_size else None

    def diff_all() -> None:
        for a, b in pairs:
            diff_bytes(a, b)

    flipped = []
    for a, _ in pairs:
        x = bytearray(a)
        if x:
            x[len(x) // 2] ^= 1
        flipped.append((a, bytes(x)))

    def diff_flipped() -> None:
        for a, b in flipped:
            diff_bytes(a, b)

    out = {
        "bytes": float(total),
        "pages": float(len(pairs)),
        "compare_Bps": rate(total, judge_all, min_s, rounds),
        "compare_bytes_Bps": rate(total, diff_all, min_s, rounds),
        "diff_Bps": rate(total, diff_flipped, min_s, rounds),
        "memcpy_Bps": rate(total, lambda: np.copyto(dst, flat), min_s, rounds),
    }
    if pages is not None:
        out["digest_Bps"] = rate(total, lambda: page_digests(pages), min_s, rounds)
        raw = pages.numpy()
        out["digest_mx128_Bps"] = rate(total, lambda: host_digests(raw, NAME), min_s, rounds)
    return out
