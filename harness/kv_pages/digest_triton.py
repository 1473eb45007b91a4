"""The ``mx128`` page digest as one fused Triton kernel, reading pages where they sit in the cache.

Same arithmetic as :mod:`harness.kv_pages.digest` (four 32-bit lanes, ``K * sum (y ^ (y >> 15)) mod 2**32``
with ``y = w_i * a_i``), so its lane sums, finished on the host, equal the host digest of the same
bytes bit for bit. Two kernels, the same bits:

``rows`` (the default): a program owns ``ROWS`` pages and walks their words in tiles of ``BLOCK``
positions. Each tile's position coefficients (``[4, BLOCK]``, read from L2: the table is
``16 x`` a page's words, shared by every page) serve ``ROWS`` pages; each lane's terms are added
into a ``[ROWS, BLOCK]`` accumulator in registers, element by element, and reduced across threads
once, at the end: no reduction, barrier or partial sum per tile, one launch, sums stored directly.
Per 32-bit word: four multiplies (the ``K`` is taken out of the sum), eight shifts/xors, four adds.

``tiles`` (the first kernel): a program owns one tile of positions and loops over ``PAGES`` pages,
so the coefficient tile stays in registers; each page-tile's four lane sums are reduced across the
program's threads at once and stored as partial sums, which a second pass (a torch int32 sum,
wrapping) adds up. Measured on an H200 (tests/device/kv_capture_gpu.py, 13.1 GB): 2.7 TB/s, where a
read-only torch sum of the same bytes ran at 4.43 TB/s; atomic adds instead of partials: 1.1 TB/s.

Both read pages in place from the paged cache through a block table (``block_ids``): no gather,
no temporaries (the torch path materialises ``[pages, 4, words]`` int32 products, 16 bytes of
traffic written and read per byte digested).

A page may be split into segments (a ``[2, blocks, ...]`` layout keeps a block's K and V apart):
word ``i`` of segment ``j`` of block ``b`` sits at ``b * block_stride + j * seg_stride + i`` (in
32-bit words) and is word ``j * seg_words + i`` of the page, as the bytes of ``kv[:, b]`` are.

The same source runs on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``): the unit
tests check it there against the host digest (the kernel's CPU twin); the device tests run it on a
GPU (tests/device/kv_digest_gpu_bench.py measures both kernels beside the card's read bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

try:  # Triton is optional: without it (or without a GPU) the torch path digests device pages
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - environment dependent
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]

VARIANT = "rows"
"""Which kernel :func:`lane_sums` runs by default: ``rows`` or ``tiles`` (module docstring)."""
ROWS = 8
"""``rows``: pages per program (each coefficient tile serves this many pages)."""
ROW_BLOCK = 256
"""``rows``: word positions per tile (1 KiB of each of the ``ROWS`` pages per step)."""
STAGES = 3
"""``rows``: software-pipelining depth of the tile loop (``tl.range(num_stages=...)``)."""
ROW_WARPS = 4
BLOCK = 2048
"""``tiles``: word positions per program (8 KiB of each page)."""
PAGES = 32
"""``tiles``: pages per program: how many times one coefficient tile is reused."""
NUM_WARPS = 4
UNROLL = False
"""``tiles``: unroll the page loop (every page's load issued up front) or run it as a loop."""
PARTIALS = True
"""``tiles``: store each tile's lane sums and add them in a second pass (torch int32 sum, wrapping),
or add them with atomics (16 programs adding into the same four words of a page serialise)."""


@dataclass(frozen=True, slots=True)
class PageLayout:
    """Where the words of page ``b`` sit in a cache tensor viewed as int32 words."""

    seg_words: int
    """Words per contiguous segment."""
    segments: int
    """Segments per page (1: a page is one run of words)."""
    block_stride: int
    """Words from block b to block b + 1."""
    seg_stride: int
    """Words from segment j to segment j + 1 of one block."""

    @property
    def words(self) -> int:
        return self.seg_words * self.segments

    @property
    def nbytes(self) -> int:
        return 4 * self.words


def layout_of(kv: torch.Tensor, block_dim: int = 0) -> PageLayout:
    """The page layout of a contiguous cache tensor whose blocks run along ``block_dim`` (0: a
    page is ``kv[b]``; 1: a page is ``kv[:, b]``, e.g. ``[2, blocks, block_size, heads, dim]``)."""
    if not kv.is_contiguous():
        raise ValueError("the fused digest reads a contiguous cache tensor")
    page_bytes = kv[(slice(None),) * block_dim + (0,)].numel() * kv.element_size()
    if page_bytes % 4:
        raise ValueError(f"a page of {page_bytes} bytes is not a whole number of 32-bit words")
    if block_dim == 0:
        w = page_bytes // 4
        return PageLayout(w, 1, w, w)
    if block_dim == 1:
        seg = kv[0, 0].numel() * kv.element_size() // 4
        return PageLayout(seg, kv.shape[0], seg, kv[0].numel() * kv.element_size() // 4)
    raise ValueError(f"block_dim {block_dim}: pages along dimension 0 or 1 only")


if triton is not None:

    @triton.jit
    def _page_sums(words_ptr, ids_ptr, sums_ptr, part_ptr, page, tile, n_tiles, block_stride, rel, inb,
                   c0, c1, c2, c3, k, EVEN: tl.constexpr, PARTIALS: tl.constexpr):
        """The four lane sums of one tile of one page, added into ``sums[page]`` (atomics) or
        stored at ``partials[page, tile]``."""
        blk = tl.load(ids_ptr + page).to(tl.int64)
        if EVEN:
            w = tl.load(words_ptr + blk * block_stride + rel).to(tl.uint32, bitcast=True)
        else:
            w = tl.load(words_ptr + blk * block_stride + rel, mask=inb, other=0).to(tl.uint32, bitcast=True)
        y = w * c0
        s0 = tl.sum(y ^ (y >> 15), axis=0) * k  # K distributes over the sum: one multiply per tile
        y = w * c1
        s1 = tl.sum(y ^ (y >> 15), axis=0) * k
        y = w * c2
        s2 = tl.sum(y ^ (y >> 15), axis=0) * k
        y = w * c3
        s3 = tl.sum(y ^ (y >> 15), axis=0) * k
        if PARTIALS:
            out = part_ptr + (page.to(tl.int64) * n_tiles + tile) * 4
            tl.store(out, s0.to(tl.int32, bitcast=True))
            tl.store(out + 1, s1.to(tl.int32, bitcast=True))
            tl.store(out + 2, s2.to(tl.int32, bitcast=True))
            tl.store(out + 3, s3.to(tl.int32, bitcast=True))
        else:
            out = sums_ptr + page * 4
            tl.atomic_add(out, s0.to(tl.int32, bitcast=True))
            tl.atomic_add(out + 1, s1.to(tl.int32, bitcast=True))
            tl.atomic_add(out + 2, s2.to(tl.int32, bitcast=True))
            tl.atomic_add(out + 3, s3.to(tl.int32, bitcast=True))

    @triton.jit
    def _mx128_kernel(words_ptr, ids_ptr, coef_ptr, sums_ptr, part_ptr, n_words, seg_words,
                      block_stride, seg_stride, PAGES: tl.constexpr, BLOCK: tl.constexpr,
                      SPLIT: tl.constexpr, EVEN: tl.constexpr, UNROLL: tl.constexpr,
                      PARTIALS: tl.constexpr):
        tile = tl.program_id(0)
        group = tl.program_id(1)
        n_tiles = tl.num_programs(0)
        pos = tl.max_contiguous(tl.multiple_of(tile * BLOCK + tl.arange(0, BLOCK), BLOCK), BLOCK)
        inb = pos < n_words
        c0 = tl.load(coef_ptr + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
        c1 = tl.load(coef_ptr + n_words + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
        c2 = tl.load(coef_ptr + 2 * n_words + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
        c3 = tl.load(coef_ptr + 3 * n_words + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
        if SPLIT:  # K and V of a block apart: word -> (segment, offset)
            seg = pos // seg_words
            rel = seg.to(tl.int64) * seg_stride + (pos - seg * seg_words)
        else:  # one run of words per page: contiguous, so loads are 16 bytes wide
            rel = pos.to(tl.int64)
        k = tl.full([], 0xCC9E2D51, dtype=tl.uint32)  # typed: a bare literal could widen the product
        # ids (and sums) are padded to a whole number of groups: no page mask
        if UNROLL:  # every page's load issued up front: more bytes in flight per program
            for p in tl.static_range(PAGES):
                _page_sums(words_ptr, ids_ptr, sums_ptr, part_ptr, group * PAGES + p, tile, n_tiles,
                           block_stride, rel, inb, c0, c1, c2, c3, k, EVEN, PARTIALS)
        else:
            for p in range(PAGES):
                _page_sums(words_ptr, ids_ptr, sums_ptr, part_ptr, group * PAGES + p, tile, n_tiles,
                           block_stride, rel, inb, c0, c1, c2, c3, k, EVEN, PARTIALS)


    @triton.jit
    def _mx128_rows_kernel(words_ptr, ids_ptr, coef_ptr, sums_ptr, n_words, seg_words, block_stride,
                           seg_stride, ROWS: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
                           EVEN: tl.constexpr, STAGES: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # ids are padded to whole groups: no row mask
        base = tl.load(ids_ptr + rows).to(tl.int64) * block_stride
        a0 = tl.zeros([ROWS, BLOCK], dtype=tl.uint32)
        a1 = tl.zeros([ROWS, BLOCK], dtype=tl.uint32)
        a2 = tl.zeros([ROWS, BLOCK], dtype=tl.uint32)
        a3 = tl.zeros([ROWS, BLOCK], dtype=tl.uint32)
        for t in tl.range(0, n_words, BLOCK, num_stages=STAGES):
            pos = tl.max_contiguous(tl.multiple_of(t + tl.arange(0, BLOCK), BLOCK), BLOCK)
            if SPLIT:  # K and V of a block apart: word -> (segment, offset)
                seg = pos // seg_words
                rel = seg.to(tl.int64) * seg_stride + (pos - seg * seg_words)
            else:
                rel = pos.to(tl.int64)
            ptrs = words_ptr + base[:, None] + rel[None, :]
            if EVEN:
                c0 = tl.load(coef_ptr + pos).to(tl.uint32, bitcast=True)
                c1 = tl.load(coef_ptr + n_words + pos).to(tl.uint32, bitcast=True)
                c2 = tl.load(coef_ptr + 2 * n_words + pos).to(tl.uint32, bitcast=True)
                c3 = tl.load(coef_ptr + 3 * n_words + pos).to(tl.uint32, bitcast=True)
                w = tl.load(ptrs).to(tl.uint32, bitcast=True)
            else:  # a tail tile: masked words are 0 and their coefficients 0, so they add nothing
                inb = pos < n_words
                c0 = tl.load(coef_ptr + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
                c1 = tl.load(coef_ptr + n_words + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
                c2 = tl.load(coef_ptr + 2 * n_words + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
                c3 = tl.load(coef_ptr + 3 * n_words + pos, mask=inb, other=0).to(tl.uint32, bitcast=True)
                w = tl.load(ptrs, mask=inb[None, :], other=0).to(tl.uint32, bitcast=True)
            y = w * c0[None, :]
            a0 += y ^ (y >> 15)
            y = w * c1[None, :]
            a1 += y ^ (y >> 15)
            y = w * c2[None, :]
            a2 += y ^ (y >> 15)
            y = w * c3[None, :]
            a3 += y ^ (y >> 15)
        k = tl.full([], 0xCC9E2D51, dtype=tl.uint32)
        out = sums_ptr + rows.to(tl.int64) * 4
        tl.store(out, (tl.sum(a0, axis=1) * k).to(tl.int32, bitcast=True))
        tl.store(out + 1, (tl.sum(a1, axis=1) * k).to(tl.int32, bitcast=True))
        tl.store(out + 2, (tl.sum(a2, axis=1) * k).to(tl.int32, bitcast=True))
        tl.store(out + 3, (tl.sum(a3, axis=1) * k).to(tl.int32, bitcast=True))


def available(device: torch.device | str | None = None) -> bool:
    """Whether the fused kernel can run on ``device`` (a CUDA device, or anywhere under
    ``TRITON_INTERPRET=1``)."""
    if triton is None:
        return False
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()


def lane_sums(kv: torch.Tensor, block_ids: torch.Tensor | Any, coef: torch.Tensor,
              layout: PageLayout | None = None, sums: torch.Tensor | None = None, *, variant: str = VARIANT,
              rows: int = ROWS, row_block: int = ROW_BLOCK, stages: int = STAGES, row_warps: int = ROW_WARPS,
              block: int = BLOCK, pages: int = PAGES, num_warps: int = NUM_WARPS, unroll: bool = UNROLL,
              partials: bool = PARTIALS) -> torch.Tensor:
    """``[len(block_ids), 4]`` int32 lane sums of the pages ``block_ids`` of ``kv``, on its device,
    without copying a page (launch only: the result is ready when the stream reaches it).

    ``coef``: the ``[4, words]`` position coefficients (:func:`harness.kv_pages.digest.coefficients`);
    ``sums`` (zeroed here) may be given to reuse one buffer across calls. ``variant`` ``rows`` takes
    ``rows``, ``row_block``, ``stages``, ``row_warps``; ``tiles`` takes ``block``, ``pages``,
    ``num_warps``, ``unroll``, ``partials`` (module docstring).
    """
    if triton is None:
        raise RuntimeError("Triton is not installed")
    if variant not in ("rows", "tiles"):
        raise ValueError(f"variant {variant!r}: rows or tiles")
    layout = layout or layout_of(kv)
    ids = torch.as_tensor(block_ids, dtype=torch.int64, device=kv.device).reshape(-1)
    n = int(ids.numel())
    group = rows if variant == "rows" else pages
    padded = -(-n // group) * group
    if padded != n:  # whole groups: the padding re-digests the first page into rows never read
        ids = torch.cat([ids, ids[:1].expand(padded - n)])
    if sums is None or sums.shape[0] < padded:
        sums = torch.zeros((padded, 4), dtype=torch.int32, device=kv.device)
    else:
        sums = sums[:padded]
        sums.zero_()
    if n == 0:
        return sums[:0]
    if tuple(coef.shape) != (4, layout.words):
        raise ValueError(f"coefficients {tuple(coef.shape)} for pages of {layout.words} words")
    words = kv.view(-1).view(torch.uint8).view(torch.int32) if kv.dtype != torch.int32 else kv.view(-1)
    if variant == "rows":
        _mx128_rows_kernel[(padded // rows,)](
            words, ids, coef, sums, layout.words, layout.seg_words, layout.block_stride, layout.seg_stride,
            ROWS=rows, BLOCK=row_block, SPLIT=layout.segments > 1, EVEN=layout.words % row_block == 0,
            STAGES=stages, num_warps=row_warps)
        return sums[:n]
    n_tiles = triton.cdiv(layout.words, block)
    part = (torch.empty((padded, n_tiles, 4), dtype=torch.int32, device=kv.device) if partials
            else sums)
    _mx128_kernel[(n_tiles, padded // pages)](
        words, ids, coef, sums, part, layout.words, layout.seg_words, layout.block_stride, layout.seg_stride,
        PAGES=pages, BLOCK=block, SPLIT=layout.segments > 1, EVEN=layout.words % block == 0, UNROLL=unroll,
        PARTIALS=partials, num_warps=num_warps)
    if partials:  # int32 sums wrap mod 2**32, like the host's
        torch.sum(part, dim=1, dtype=torch.int32, out=sums)
    return sums[:n]
