"""Page digests computed where the pages live: on the GPU for a GPU cache, on the host otherwise.

A digest string names its algorithm (``<name>:<32 hex digits>``), and every digest in a record or a
capture can be checked again from the bytes with :func:`matches`, whichever algorithm took it:

* ``xxh128`` (XXH3-128, the ``xxhash`` package): pages in host memory, where ``xxhash`` is
  installed (a dependency of the harness). A hash made for this, at tens of GB/s a core;
* ``mx128`` (below): pages on a GPU (the fused Triton kernel, or torch integer ops), and host pages
  in an interpreter without ``xxhash`` (a vLLM release's venv holds only what vLLM brings). Records
  written before ``xxh128`` hold ``mx128`` digests; they stay comparable and checkable.

Two digests are compared only when their algorithms agree; when they do not (a producer and a
consumer in different interpreters), the comparator compares the bytes, as for digests that differ.

``mx128`` is one algorithm on every device, built from plain torch integer ops, so a digest taken on
a CUDA cache equals the digest of the same bytes read back on the host, and the comparator can
compare digests first and bytes only on mismatch.

``mx128`` is four independent 32-bit lanes. Each lane views the page as 32-bit words ``w_i``, mixes
every word with a position coefficient ``a_i`` (odd, from splitmix64 of the position and lane) and
sums with wrap-around::

    lane = sum_i  f(w_i * a_i)         (mod 2**32),   f(y) = (y ^ (y >>> 15)) * K

``w -> w * a_i`` (odd ``a_i``), the xor-shift and ``* K`` are bijections mod 2**32, so a change of
any single word always changes every lane; a modular sum is order-free, so a GPU reduction in any
order gives the same bits. Multiplication by ``K`` distributes over the modular sum, so every
implementation sums ``y ^ (y >>> 15)`` and multiplies the lane sum by ``K`` once: the same bits with
half the multiplies (the fused kernel's bound). 32-bit integer ops are the ones CPUs vectorise and
GPUs run at full rate. The lane sums and the byte length are then avalanched on the host (a few
words per page). It is a checksum against accidents (bit flips, misplaced or stale pages), not a
defence against an adversary.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from harness.kv_pages import digest_triton
from harness.kv_pages.layout import check_ids

try:
    from xxhash import xxh3_128_hexdigest as _xxh128
except ImportError:  # a release's venv: vLLM does not bring xxhash
    _xxh128 = None

NAME = "mx128"
"""The device algorithm (GPU caches), and the host's where ``xxhash`` is not installed."""
XXH128 = "xxh128"
HOST = XXH128 if _xxh128 is not None else NAME
"""What :func:`digest_bytes` and host pages use in this interpreter."""
ALGORITHMS = (NAME, XXH128)
_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15 as int64
_M1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_M2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
_LANES = 4
_K32 = -0x3361D2AF  # 0xCC9E2D51 as int32, odd
_LANE_OFFSET = 1 << 40
_MASK64 = (1 << 64) - 1
_WORDS_PER_SLICE = {"cpu": 1 << 16}
"""Page words mixed at once per device type. Host: 256 KiB of words (x4 lanes, x2 buffers) stays
in cache and never page-faults; a GPU (the default) takes 4 Mi words per slice so that a few
kernel launches cover gigabytes."""
_GPU_WORDS_PER_SLICE = 1 << 22


def _lshr(x: torch.Tensor, s: int, bits: int = 64) -> torch.Tensor:
    """Logical right shift (torch's ``>>`` on signed ints is arithmetic)."""
    return (x >> s) & ((1 << (bits - s)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    z = x + _GOLDEN
    z = (z ^ _lshr(z, 30)) * _M1
    z = (z ^ _lshr(z, 27)) * _M2
    return z ^ _lshr(z, 31)


@lru_cache(maxsize=32)
def _coefficients(n_words: int, device: str) -> torch.Tensor:
    """[4, n_words] odd int32 position coefficients, made on ``device``."""
    pos = torch.arange(n_words, dtype=torch.int64, device=device)
    lanes = torch.stack([_splitmix(pos + lane * _LANE_OFFSET) for lane in range(_LANES)])
    return ((lanes & 0xFFFFFFFF) | 1).to(torch.int32)  # low 32 bits, wrapped into int32


def as_page_bytes(pages: torch.Tensor) -> torch.Tensor:
    """[P, ...] of any dtype -> [P, nbytes] uint8 on the same device (a view when contiguous)."""
    if pages.dim() == 0:
        raise ValueError("pages must have a leading page dimension")
    p = pages.contiguous()
    n = p.shape[0]
    if p.numel() == 0:
        width = int(np.prod(p.shape[1:])) * p.element_size() if n == 0 else 0
        return torch.empty((n, width), dtype=torch.uint8, device=p.device)
    if p.dtype != torch.uint8:
        p = p.reshape(n, -1).view(torch.uint8)
    return p.reshape(n, -1)


def page_digests(pages: torch.Tensor) -> list[str]:
    """One digest per leading index of ``pages`` ([P, ...], any dtype, any device).

    Pages on a GPU are digested there (``mx128``), by the fused Triton kernel
    (:mod:`harness.kv_pages.digest_triton`) when Triton is installed, else by torch integer ops; pages in
    host memory by :func:`host_digests` (``xxh128``, or ``mx128`` in numpy without ``xxhash``), on
    the calling thread: small torch ops fan out to OpenMP threads that contend with the engine's own
    on a busy CPU host.
    """
    if pages.device.type == "cpu" and pages.dim() > 0 and pages.numel() > 0:
        return host_digests(_host_bytes(pages))
    raw = as_page_bytes(pages)
    if raw.device.type == "cpu":
        return host_digests(raw.numpy())
    if raw.shape[1] % 4 == 0 and raw.shape[0] and digest_triton.available(raw.device):
        return fused_digests(raw, torch.arange(raw.shape[0], device=raw.device), digest_triton.layout_of(raw))
    return device_digests(raw)


def _host_bytes(pages: torch.Tensor) -> np.ndarray:
    """[P, ...] host tensor -> [P, nbytes] uint8 numpy, through numpy where it knows the dtype (a
    torch view or reshape costs microseconds, as much as digesting a small page)."""
    try:
        arr = pages.detach().numpy()
    except TypeError:  # bfloat16, float8: no numpy dtype
        return as_page_bytes(pages).numpy()
    arr = np.ascontiguousarray(arr)
    return arr.reshape(arr.shape[0], -1).view(np.uint8)


def cache_digests(kv: torch.Tensor, block_ids: Sequence[int], block_dim: int = 0) -> list[str]:
    """Digests of the pages ``block_ids`` of a paged cache tensor, read where they sit: on a GPU by
    the fused kernel without gathering them first; elsewhere gathered, then :func:`page_digests`.
    ``block_dim``: the dimension that counts blocks (:mod:`harness.kv_pages.layout`); block ids it does not
    hold are a :class:`~harness.kv_pages.layout.CacheLayoutError`."""
    check_ids(kv, block_ids, block_dim)
    if kv.device.type != "cpu" and digest_triton.available(kv.device) and kv.is_contiguous():
        try:
            layout = digest_triton.layout_of(kv, block_dim)
        except ValueError:
            layout = None
        if layout is not None:
            return fused_digests(kv, list(block_ids), layout)
    ids = torch.tensor(list(block_ids), dtype=torch.long, device=kv.device)
    return page_digests(kv.index_select(block_dim, ids).movedim(block_dim, 0))


def fused_lane_sums(kv: torch.Tensor, block_ids: Any, layout: digest_triton.PageLayout | None = None,
                    sums: torch.Tensor | None = None, **knobs: Any) -> torch.Tensor:
    """The fused kernel's ``[pages, 4]`` int32 lane sums of pages ``block_ids`` of ``kv`` (its
    device), with this module's coefficients; ``knobs``: see
    :func:`harness.kv_pages.digest_triton.lane_sums`."""
    layout = layout or digest_triton.layout_of(kv)
    return digest_triton.lane_sums(kv, block_ids, coefficients(layout.words, str(kv.device)), layout, sums,
                                   **knobs)


def fused_digests(kv: torch.Tensor, block_ids: Any, layout: digest_triton.PageLayout | None = None
                  ) -> list[str]:
    """Digest strings of pages ``block_ids`` of ``kv`` by the fused kernel: equal to
    :func:`digest_bytes` of their bytes."""
    layout = layout or digest_triton.layout_of(kv)
    sums = fused_lane_sums(kv, block_ids, layout)
    return format_sums(sums.cpu().numpy().view(np.uint32), layout.nbytes)


def device_digests(raw: torch.Tensor) -> list[str]:
    """The torch path over [P, nbytes] uint8 on any device (what a GPU cache uses)."""
    n_pages, nbytes = raw.shape
    if n_pages == 0:
        return []
    if nbytes % 4:
        raw = torch.nn.functional.pad(raw, (0, 4 - nbytes % 4))
    words = raw.view(torch.int32)
    n_words = words.shape[1]
    coef = _coefficients(n_words, str(raw.device))
    sums = torch.empty((n_pages, _LANES), dtype=torch.int32, device=raw.device)
    per_slice = _WORDS_PER_SLICE.get(raw.device.type, _GPU_WORDS_PER_SLICE)
    step = max(1, per_slice // max(n_words, 1))
    y = torch.empty((min(step, n_pages), _LANES, n_words), dtype=torch.int32, device=raw.device)
    z = torch.empty_like(y)
    for lo in range(0, n_pages, step):
        w = words[lo:lo + step]
        yy, zz = y[:w.shape[0]], z[:w.shape[0]]
        torch.mul(w.unsqueeze(1), coef, out=yy)  # all four lanes in one pass
        torch.bitwise_right_shift(yy, 15, out=zz)
        zz &= 0x1FFFF
        yy ^= zz
        sums[lo:lo + step] = yy.sum(dim=2, dtype=torch.int32) * _K32  # K distributes over the sum
    return _format(sums.cpu().numpy().view(np.uint32), nbytes)


def host_digests(raw: np.ndarray, algorithm: str = HOST) -> list[str]:
    """Digests of [P, nbytes] uint8 host memory, by ``algorithm`` (this interpreter's :data:`HOST`)."""
    if algorithm == XXH128:
        return xxh128_digests(raw)
    if algorithm == NAME:
        return mx128_host_digests(raw)
    raise ValueError(f"unknown page digest algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def xxh128_digests(raw: np.ndarray) -> list[str]:
    """XXH3-128 of each row of [P, nbytes] uint8 host memory, one call per page on a memoryview."""
    if _xxh128 is None:
        raise RuntimeError("the xxh128 page digest needs the xxhash package (pip install xxhash)")
    n_pages, nbytes = raw.shape
    flat = memoryview(np.ascontiguousarray(raw).reshape(-1))
    h = _xxh128
    return [f"xxh128:{h(flat[lo:lo + nbytes])}" for lo in range(0, n_pages * nbytes, nbytes)] if nbytes \
        else [f"xxh128:{h(b'')}"] * n_pages


def mx128_host_digests(raw: np.ndarray) -> list[str]:
    """``mx128`` in numpy over [P, nbytes] uint8 host memory: the same bits as :func:`device_digests`."""
    n_pages, nbytes = raw.shape
    if n_pages == 0:
        return []
    if nbytes % 4:
        raw = np.pad(raw, ((0, 0), (0, 4 - nbytes % 4)))
    words = np.ascontiguousarray(raw).view(np.uint32)
    n_words = words.shape[1]
    coef = _host_coefficients(n_words)
    sums = np.empty((n_pages, _LANES), dtype=np.uint32)
    step = max(1, _WORDS_PER_SLICE["cpu"] // max(n_words, 1))
    y = np.empty((min(step, n_pages), _LANES, n_words), dtype=np.uint32)
    z = np.empty_like(y)
    k = np.uint32(_K32 & 0xFFFFFFFF)
    for lo in range(0, n_pages, step):
        w = words[lo:lo + step]
        yy, zz = y[:w.shape[0]], z[:w.shape[0]]
        np.multiply(w[:, None, :], coef, out=yy)
        np.right_shift(yy, np.uint32(15), out=zz)  # unsigned: a logical shift
        np.bitwise_xor(yy, zz, out=yy)
        sums[lo:lo + step] = yy.sum(axis=2, dtype=np.uint32) * k  # K distributes over the sum
    return _format(sums, nbytes)


@lru_cache(maxsize=32)
def _host_coefficients(n_words: int) -> np.ndarray:
    return _coefficients(n_words, "cpu").numpy().view(np.uint32)


def coefficients(n_words: int, device: str) -> torch.Tensor:
    """[4, n_words] int32 position coefficients on ``device`` (the fused kernel reads them)."""
    return _coefficients(n_words, device)


def format_sums(sums: np.ndarray, nbytes: int) -> list[str]:
    """[P, 4] uint32 lane sums of pages of ``nbytes`` -> their digest strings."""
    return _format(sums, nbytes)


def _format(sums: np.ndarray, nbytes: int) -> list[str]:
    """[P, 4] uint32 lane sums -> digest strings (length folded in, avalanched)."""
    s = sums.astype(np.uint64)
    a = _finish_many(s[:, 0] | (s[:, 1] << np.uint64(32)), nbytes, 0)
    b = _finish_many(s[:, 2] | (s[:, 3] << np.uint64(32)), nbytes, 1)
    text = np.stack([a, b], axis=1).astype(">u8").tobytes().hex()
    return [f"{NAME}:{text[i:i + 32]}" for i in range(0, len(text), 32)]


def _finish_many(h: np.ndarray, nbytes: int, lane: int) -> np.ndarray:
    """:func:`_finish` over a uint64 array (numpy wraps uint64 arithmetic mod 2**64)."""
    with np.errstate(over="ignore"):
        z = h ^ np.uint64(((nbytes + lane * _LANE_OFFSET) * 0x9E3779B97F4A7C15) & _MASK64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _finish(h: int, nbytes: int, lane: int) -> int:
    """Fold the byte length in and avalanche the lane sum (host side, two words per page)."""
    z = (h ^ ((nbytes + lane * _LANE_OFFSET) * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def digest_bytes(data: bytes | bytearray | memoryview | np.ndarray, algorithm: str = HOST) -> str:
    """The digest of one page given as host bytes, by ``algorithm`` (this interpreter's :data:`HOST`)."""
    if algorithm == XXH128 and _xxh128 is not None and not isinstance(data, np.ndarray):
        return f"xxh128:{_xxh128(data)}"
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    if arr.size == 0 and algorithm == NAME:
        return f"{NAME}:{_finish(0, 0, 0):016x}{_finish(0, 0, 1):016x}"
    return host_digests(arr.reshape(1, -1), algorithm)[0]


def algorithm_of(digest: str) -> str:
    """``mx128:0a1b...`` -> ``mx128``."""
    return digest.split(":", 1)[0]


def matches(data: bytes | bytearray | memoryview | np.ndarray, digest: str) -> bool | None:
    """Whether ``data`` has ``digest``, recomputed by the algorithm the digest names; None for an
    algorithm this module does not know (a digest some other tool took: nothing to check it by)."""
    algorithm = algorithm_of(digest)
    if algorithm not in ALGORITHMS or (algorithm == XXH128 and _xxh128 is None):
        return None
    return digest_bytes(data, algorithm) == digest
