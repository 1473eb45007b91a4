"""Split weighted items into n shards: disjoint, covering, balanced — LPT greedy.

**LPT** (longest processing time first, Graham 1969): sort the items by weight, heaviest first
(ties by id, so the split is a pure function of its input), and give each to the shard with the
least weight so far (ties: the one with fewer items, then the lowest index, so that zero-weight
items spread too and ``n`` shards of at least ``n`` items are never empty). Two bounds hold, and
the property tests check both:

* ``max load <= total / n + max weight`` (any greedy list schedule: the shard that ends heaviest was
  the lightest when it took its last item);
* ``max load <= (4/3 - 1/(3n)) * OPT`` where OPT is the best possible split (Graham's LPT bound;
  checked against brute force on small inputs).

Every runner computes the same split from the same plan, so shard ``i`` of ``n`` needs no
coordination. Standard library only.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence


class ShardError(ValueError):
    """A bad ``i/n`` shard spec."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4): 1-based, as CI matrices count."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise ShardError(f"shard {text!r}: write i/n, e.g. 2/4 (the 2nd of 4 shards)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= i <= n:
        raise ShardError(f"shard {text!r}: i must be between 1 and n (n >= 1)")
    return i, n


def lpt(items: Sequence[tuple[str, float]], n: int) -> list[list[str]]:
    """``items`` (id, weight) -> ``n`` lists of ids. Ids must be unique; weights >= 0."""
    if n < 1:
        raise ShardError(f"{n} shards: need at least one")
    ids = [i for i, _ in items]
    if len(set(ids)) != len(ids):
        raise ShardError("duplicate item ids: " + ", ".join(sorted({i for i in ids if ids.count(i) > 1})))
    shards: list[list[str]] = [[] for _ in range(n)]
    heap = [(0.0, 0, k) for k in range(n)]
    for item, w in sorted(items, key=lambda x: (-x[1], x[0])):
        if not w >= 0:
            raise ShardError(f"item {item!r}: weight {w!r} must be a number >= 0")
        load, count, k = heapq.heappop(heap)
        shards[k].append(item)
        heapq.heappush(heap, (load + w, count + 1, k))
    return shards


def loads(shards: Sequence[Sequence[str]], weight: dict[str, float]) -> list[float]:
    return [sum(weight[i] for i in s) for s in shards]
