"""Comparators: each judges one case and returns a Verdict. ``build`` makes them from a suite."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.api import Comparator
from harness.compare.from_suite import drift, kl, nmse
from harness.compare.near_tie import NearTie
from harness.compare.strict import Strict
from harness.registry import unknown

Decode = Callable[[Sequence[int]], str]
Factory = Callable[[Mapping[str, Any], "Decode | None"], Comparator]

COMPARATORS: dict[str, Factory] = {
    "strict": lambda p, d: Strict(decode=d),
    "near_tie": lambda p, d: NearTie(threshold_nats=float(p.get("threshold_nats", 0.5)), decode=d),
    "kl": kl,
    "drift": drift,
    "nmse": nmse,
}


def _kv(name: str) -> Factory:
    """KV comparators judge pages, not Outputs; imported on use (they pull in torch)."""
    def make(p: Mapping[str, Any], d: Decode | None) -> Comparator:
        if name == "byte_equal":
            from harness.compare.byte_equal import ByteEqual

            return ByteEqual()
        from harness.compare.kv_hits import KVHits

        return KVHits()
    return make


COMPARATORS.update({"byte_equal": _kv("byte_equal"), "kv_hits": _kv("kv_hits")})


def build(name: str, params: Mapping[str, Any], decode: Decode | None = None) -> Comparator:
    """The comparator registered as ``name``, configured from its suite table ``params``."""
    if name not in COMPARATORS:
        raise unknown("comparator", name, COMPARATORS)
    return COMPARATORS[name](params, decode)
