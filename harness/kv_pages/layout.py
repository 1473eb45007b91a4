"""Which dimension of a paged KV-cache tensor counts blocks, read from the tensor's shape.

vLLM hands a connector one tensor per attention layer, and its layout is the attention backend's
(``get_kv_cache_shape``), not the connector API's: most backends put the block first
(``[num_blocks, 2, block_size, heads, head_size]``), others put keys and values first
(``[2, num_blocks, ...]``: the CPU backend of vLLM up to 0.17). Page ``b`` is then
``kv.select(block_dim, b)``. Indexing the wrong dimension reads the wrong bytes or runs past the
end, so the block dimension is found from what the engine says about its cache, never guessed:

* the dimension whose size is the engine's block count (``KVCacheConfig.num_blocks``);
* where that is ambiguous or unknown, the one whose page (every other dimension) has the layer's
  page size (``kv_cache_spec.page_size_bytes``).

A tensor that fits neither is a :class:`CacheLayoutError` naming the layer, the shape and what was
looked for, and :func:`check_ids` refuses block ids past the dimension's end with the same detail.
Needs only torch (loaded inside every vLLM release's engine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


class CacheLayoutError(ValueError):
    """A KV-cache tensor whose block dimension cannot be told, or block ids it does not hold."""


def block_dim(
    shape: Sequence[int],
    element_size: int,
    num_blocks: int | None = None,
    page_nbytes: int | None = None,
    where: str = "KV cache",
) -> int:
    """The block dimension of a cache tensor of ``shape`` (see the module doc); ``where`` names the
    tensor in the error."""
    dims = range(len(shape))
    numel = math.prod(shape)
    by_blocks = [d for d in dims if num_blocks and shape[d] == num_blocks]
    by_bytes = [
        d for d in dims if page_nbytes and shape[d] and numel // shape[d] * element_size == page_nbytes
    ]
    for found in ([d for d in by_blocks if d in by_bytes], by_blocks, by_bytes):
        if len(found) == 1:
            return found[0]
    looked = " and ".join(
        x
        for x in (
            f"{num_blocks} blocks" if num_blocks else "",
            f"pages of {page_nbytes} bytes" if page_nbytes else "",
        )
        if x
    )
    many = sorted({*by_blocks, *by_bytes})
    why = (
        (f"dimensions {many} all fit" if len(many) > 1 else "no dimension fits")
        if looked
        else "the engine gave neither its block count nor its page size"
    )
    raise CacheLayoutError(
        f"{where}: cannot tell the block dimension of a cache tensor of shape "
        f"{list(shape)} ({element_size}-byte elements), looking for "
        f"{looked or 'anything'}: {why}"
    )


def block_dim_of(
    kv: torch.Tensor, num_blocks: int | None = None, page_nbytes: int | None = None, where: str = "KV cache"
) -> int:
    """:func:`block_dim` of a tensor."""
    return block_dim(tuple(kv.shape), kv.element_size(), num_blocks, page_nbytes, where)


def check_ids(kv: torch.Tensor, block_ids: Sequence[int], dim: int, where: str = "KV cache") -> None:
    """Refuse block ids the tensor's dimension ``dim`` does not hold: a wrong block dimension, named,
    instead of an ``IndexError`` from inside torch (or, worse, the bytes of another dimension)."""
    if not block_ids:
        return
    if not 0 <= dim < kv.dim():
        raise CacheLayoutError(
            f"{where}: block dimension {dim} of a {kv.dim()}-dimensional cache tensor "
            f"(shape {list(kv.shape)})"
        )
    if not 0 <= min(block_ids) <= max(block_ids) < kv.shape[dim]:
        bad = [int(b) for b in block_ids if not 0 <= b < kv.shape[dim]]
        raise CacheLayoutError(
            f"{where}: block ids {bad[:5]} are outside dimension {dim} of the cache "
            f"tensor (shape {list(kv.shape)}, {kv.shape[dim]} there): that dimension "
            f"does not count blocks"
        )


def page_shape(kv: torch.Tensor, dim: int) -> list[int]:
    """The shape of one page: the tensor's shape without the block dimension."""
    return [int(n) for i, n in enumerate(kv.shape) if i != dim]


def page_nbytes(kv: torch.Tensor, dim: int) -> int:
    """The bytes of one page."""
    return math.prod(page_shape(kv, dim)) * kv.element_size()


def layer_tensor(kv: Any) -> torch.Tensor | None:
    """The cache tensor of a layer as vLLM keeps it: a tensor, or (older releases) a list with one
    tensor per virtual engine, of which the harness runs one."""
    if isinstance(kv, list | tuple) and kv:
        kv = kv[0]
    return kv if isinstance(kv, torch.Tensor) and kv.dim() > 0 and kv.numel() > 0 else None


class BlockDims:
    """Each layer's block dimension, found once per layer (:func:`block_dim_of`) from the engine's
    block count and the layer's page size, then checked on every read (:func:`check_ids`)."""

    def __init__(self, num_blocks: int | None, page_bytes: dict[str, int | None]) -> None:
        self.num_blocks = num_blocks
        self.page_bytes = page_bytes
        self.found: dict[str, int] = {}

    def __call__(self, layer: str, kv: torch.Tensor) -> int:
        dim = self.found.get(layer)
        if dim is None:
            dim = self.found[layer] = block_dim_of(
                kv, self.num_blocks, self.page_bytes.get(layer), where=f"layer {layer}"
            )
        return dim


def block_dims(kv_cache_config: Any) -> BlockDims:
    """:class:`BlockDims` for the engine's ``KVCacheConfig`` (its block count, each group's page size)."""
    pages: dict[str, int | None] = {}
    for g in getattr(kv_cache_config, "kv_cache_groups", ()) or ():
        nbytes = getattr(g.kv_cache_spec, "page_size_bytes", None)
        for layer in g.layer_names:
            pages[layer] = int(nbytes) if isinstance(nbytes, int) else None
    n = getattr(kv_cache_config, "num_blocks", None)
    return BlockDims(int(n) if isinstance(n, int) and n > 0 else None, pages)
