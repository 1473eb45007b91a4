"""Page identity: a KV page is named by the tokens it depends on, never by its block id.

A page is one engine block (``block_size`` tokens) of one attention layer. Its KV depends on every
token up to the end of the block, so its key is a hash of the token prefix ``ids[:end]``. Block ids
are an allocation detail: they differ between the producer and the consumer, and between runs.
Two requests that share a prefix share the keys of its pages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

KEY_BYTES = 16
"""blake2b digest size of a page key (32 hex characters)."""


@dataclass(frozen=True, slots=True)
class PageRef:
    """Which page: the token prefix it ends, the layer and the KV-cache group holding it."""

    key: str
    """blake2b-128 of the prompt's token ids ``[0, end)`` as little-endian int64."""
    layer: str
    group: int
    """Index of the engine's KV-cache group (models with several attention types have several)."""
    start: int
    """First token of the page."""
    end: int
    """One past the last token of the page; the key covers tokens ``[0, end)``."""
    shard: int = 0
    """Tensor-parallel rank holding this slice of the heads."""

    @property
    def id(self) -> tuple[str, str, int]:
        """What pages are matched by across the write and restore sides."""
        return (self.key, self.layer, self.shard)

    def describe(self) -> str:
        rank = f", rank {self.shard}" if self.shard else ""
        return (f"layer {self.layer} (group {self.group}{rank}), tokens [{self.start}, {self.end}), "
                f"page {self.key[:12]}")


def _token_bytes(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype="<i8").tobytes()


def prefix_keys(ids: Sequence[int], block_size: int, upto: int | None = None) -> list[str]:
    """The key of every full block of ``ids[:upto]``: ``keys[j]`` names tokens ``[0, (j+1)*B)``.

    One incremental hash over the prefix, so the cost is linear in the prompt length.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = len(ids) if upto is None else min(upto, len(ids))
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    keys = []
    for j in range(n // block_size):
        h.update(_token_bytes(ids[j * block_size:(j + 1) * block_size]))
        keys.append(h.copy().hexdigest())
    return keys


def prefix_key(ids: Sequence[int]) -> str:
    """The key of the prefix ``ids`` as a whole (equal to ``prefix_keys`` at a block boundary)."""
    return hashlib.blake2b(_token_bytes(ids), digest_size=KEY_BYTES).hexdigest()


def blocks_completed(done_before: int, done_after: int, limit: int, block_size: int) -> Iterator[int]:
    """Indices of the blocks whose last token lands in ``(done_before, min(done_after, limit)]``.

    ``limit`` is the prompt length: pages holding generated tokens are not stored.
    """
    hi = min(done_after, limit) // block_size
    lo = done_before // block_size
    return iter(range(lo, hi))


def expected_hit_tokens(n_prompt: int, chunk_size: int) -> int:
    """Prompt tokens a chunked store can serve: whole chunks, leaving at least one token.

    The engine must compute at least the last prompt token to produce the first output token (vLLM
    asserts it), so a prompt of exactly ``k * C`` tokens is served ``(k - 1) * C``:
    ``floor((N - 1) / C) * C``.
    """
    if n_prompt < 1:
        return 0
    return ((n_prompt - 1) // chunk_size) * chunk_size
