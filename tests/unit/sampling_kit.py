"""Synthetic oracles for the sampling gate's unit tests: logits shaped like a language model's at
a repetitive position (a few tokens dominate, the tokens already drawn are likely again), so that
every parameter — penalties included — changes what an engine must draw."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.abilities import SamplerTraits
from harness.api import Case, Sampling
from harness.kinds.sampling.draws import OracleRows
from harness.kinds.sampling.settings import GateSettings, Setting

V = 400
REPEATED = (5, 6, 7)


def oracle(
    n_cases: int = 2,
    seed: int = 0,
    prompt_len: int = 7,
    tokens: int = 64,
    vocab: int = V,
    spread: float = 1.5,
) -> list[OracleRows]:
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n_cases):
        prompt = tuple(int(x) for x in rng.integers(20, vocab, prompt_len))
        greedy = tuple(int(rng.choice(REPEATED)) for _ in range(tokens))
        rows = {}
        for t in range(tokens):
            x = rng.standard_normal(vocab) * spread
            x[list(REPEATED)] += 3.0
            x[greedy[t]] += 2.5
            rows[t] = x.astype(np.float32)
        out.append(OracleRows(Case(f"c{c}", prompt), greedy, rows))
    return out


def S(**kw: float) -> Sampling:  # noqa: N802 - reads like the suite table
    return Sampling(1, 1, **{"temperature": 1.0, **kw})  # type: ignore[arg-type]


SETTINGS: tuple[Setting, ...] = (
    Setting("t07", "temperature", S(temperature=0.7)),
    Setting("k5", "top_k", S(top_k=5)),
    Setting("p08", "top_p", S(top_p=0.8)),
    Setting("mp10", "min_p", S(min_p=0.1)),
    Setting("t06p08", "order", S(temperature=0.6, top_p=0.8)),
    Setting("rep13", "repetition_penalty", S(repetition_penalty=1.3), 1),
    Setting("pres10", "presence_penalty", S(presence_penalty=1.0), 1),
    Setting("freq08", "frequency_penalty", S(frequency_penalty=0.8), 2),
)


def settings(only: Sequence[str] | None = None, **kw: float) -> GateSettings:
    chosen = tuple(s for s in SETTINGS if only is None or s.id in only)
    return GateSettings(chosen, **{"target_tv": 0.15, "control_repetitions": 0, **kw})  # type: ignore[arg-type]


def traits(chain: str = "vllm", mode: str = "raw_logprobs", scope: str = "request") -> SamplerTraits:
    return SamplerTraits(chain, mode, scope)  # type: ignore[arg-type]
