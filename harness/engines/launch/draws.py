"""What every engine's :class:`~harness.abilities.Sampler` shares: the sampling parameters it passes, all
of them, every time, and its draws as arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.abilities import Samples
from harness.api import Sampling

PARAMS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
"""The :class:`~harness.api.Sampling` fields every sampler passes to its engine, all of them, every
time: an engine default (a model's generation config, a server's top-k 40) never sneaks in."""


def params(s: Sampling) -> dict[str, float | int]:
    return {k: getattr(s, k) for k in PARAMS}


def samples(
    key: str, draws: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]] | None, width: int
) -> Samples:
    """A request's draws as arrays: [n, width] tokens (-1 after a draw stopped early) and logprobs
    (NaN there; None when the engine returned none)."""
    tokens = np.full((len(draws), width), -1, np.int32)
    lps = None if logprobs is None else np.full((len(draws), width), np.nan, np.float32)
    for i, d in enumerate(draws):
        d = list(d)[:width]
        tokens[i, : len(d)] = d
        if lps is not None and logprobs is not None:
            row = [np.nan if v is None else v for v in list(logprobs[i])[:width]]
            lps[i, : len(row)] = row
    return Samples(key, tokens, lps)
