"""Page digests computed where the pages live: on the GPU for a GPU cache, on the host otherwise.

One algorithm on every device, built from plain torch integer ops, so a digest taken on a CUDA
cache equals the digest of the same bytes read back on the host, and the comparator can compare
digests first and bytes only on mismatch.

``mx128`` is four independent 32-bit lanes. Each lane views the page as 32-bit words ``w_i``, mixes
every word with a position coefficient ``a_i`` (odd, from splitmix64 of the position and lane) and
sums with wrap-around::

    lane = sum_i  f(w_i * a_i)         (mod 2**32),   f(y) = (y ^ (y >>> 15)) * K

``w -> w * a_i`` (odd ``a_i``), the xor-shift and ``* K`` are bijections mod 2**32, so a change of
any single word always changes every lane; a modular sum is order-free, so a GPU reduction in any
order gives the same bits. 32-bit integer ops are the ones CPUs vectorise and GPUs run at full
rate. The lane sums and the byte length are then avalanched on the host (a few words per page).
It is a checksum against accidents (bit flips, misplaced or stale pages), not a defence against an
adversary.
"""
from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np
import torch

NAME = "mx128"
_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15 as int64
_M1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_M2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
_LANES = 4
_K32 = -0x3361D2AF  # 0xCC9E2D51 as int32, odd
_LANE_OFFSET = 1 << 40
_MASK64 = (1 << 64) - 1
_WORDS_PER_SLICE = 1 << 18
"""Words mixed at once (1 MiB of int32 scratch, reused): big temporaries would page-fault on every
call on the host."""


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
    if p.dtype != torch.uint8:
        p = p.reshape(p.shape[0], -1).view(torch.uint8)
    return p.reshape(p.shape[0], -1)


def page_digests(pages: torch.Tensor) -> list[str]:
    """One digest per leading index of ``pages`` ([P, ...], any dtype, any device)."""
    raw = as_page_bytes(pages)
    n_pages, nbytes = raw.shape
    if n_pages == 0:
        return []
    if nbytes % 4:
        raw = torch.nn.functional.pad(raw, (0, 4 - nbytes % 4))
    words = raw.view(torch.int32)
    n_words = words.shape[1]
    coef = _coefficients(n_words, str(raw.device))
    sums = torch.empty((n_pages, _LANES), dtype=torch.int32, device=raw.device)
    step = max(1, _WORDS_PER_SLICE // max(n_words, 1))
    y = torch.empty((min(step, n_pages), n_words), dtype=torch.int32, device=raw.device)
    z = torch.empty_like(y)
    for lo in range(0, n_pages, step):
        w = words[lo:lo + step]
        yy, zz = y[:w.shape[0]], z[:w.shape[0]]
        for lane in range(_LANES):
            torch.mul(w, coef[lane], out=yy)
            torch.bitwise_right_shift(yy, 15, out=zz)
            zz &= 0x1FFFF
            yy ^= zz
            yy *= _K32
            sums[lo:lo + step, lane] = yy.sum(dim=1, dtype=torch.int32)
    host = sums.cpu().numpy().view(np.uint32).astype(np.uint64).tolist()
    out = []
    for s0, s1, s2, s3 in host:
        a = _finish(s0 | (s1 << 32), nbytes, 0)
        b = _finish(s2 | (s3 << 32), nbytes, 1)
        out.append(f"{NAME}:{a:016x}{b:016x}")
    return out


def _finish(h: int, nbytes: int, lane: int) -> int:
    """Fold the byte length in and avalanche the lane sum (host side, two words per page)."""
    z = (h ^ ((nbytes + lane * _LANE_OFFSET) * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def digest_bytes(data: bytes | bytearray | memoryview | np.ndarray) -> str:
    """The digest of one page given as host bytes (what the comparator re-checks on read)."""
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    if arr.size == 0:
        return f"{NAME}:{_finish(0, 0, 0):016x}{_finish(0, 0, 1):016x}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: we never write to it
        t = torch.from_numpy(arr) if arr.flags.writeable else torch.frombuffer(arr, dtype=torch.uint8)
    return page_digests(t.reshape(1, -1))[0]
