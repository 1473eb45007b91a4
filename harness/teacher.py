"""Teacher forcing: the candidate scores the oracle's sequence, so positions stay aligned.

Once greedy outputs diverge, the two engines continue from different prefixes and nothing after
the divergence can be compared. A distribution comparator (KL, NMSE, drift) therefore asks the
candidate for its next-token distribution at every position of *prompt + oracle continuation*.

A runner that can do this implements :class:`harness.abilities.Scorer`; the others are judged until
their first divergence (their own outputs stand in for the scores) and every report says so.

Scores must go through the path the candidate decodes with. vLLM scores with ``prompt_logprobs``
(one prefill pass); transformers with a plain cache scores with one forward pass, and with a
quantized KV cache one token per step, because a single forward pass attends to the unquantized
keys and values and would hide exactly the error under test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from harness.abilities import Scorer
from harness.api import Case, Output, Runner, Sampling

How = Literal["teacher-forced", "until-first-divergence"]


@dataclass(frozen=True, slots=True, eq=False)
class Scored:
    outputs: list[Output]
    """What the candidate generated on its own (strict / near-tie judge these)."""
    scores: list[Output]
    """What the distribution comparators judge: teacher-forced scores, or ``outputs`` again."""
    how: How


def run_and_score(runner: Runner, cases: Sequence[Case], sampling: Sampling,
                  oracle: Mapping[str, Output], k: int | None = None) -> Scored:
    """Generate with ``runner`` and, when it can, score the oracle's continuation of every case."""
    k = sampling.logprobs if k is None else k
    if isinstance(runner, Scorer):
        conts = {c.id: oracle[c.id].token_ids for c in cases if c.id in oracle}
        outputs, scores = runner.run_and_score(cases, sampling, conts, k)
        return Scored(outputs, scores, "teacher-forced")
    outputs = runner.run(cases, sampling)
    return Scored(outputs, outputs, "until-first-divergence")


def scored_output(case_id: str, continuation: Sequence[int], top_ids: object, top_logprobs: object,
                  chosen: object, full: object = None) -> Output:
    """The :class:`Output` form of a score (engines build theirs with this). ``full``: the whole
    distributions ``[n, V]`` (an array or a memory map, kept as it is, never copied)."""
    import numpy as np

    n = len(continuation)
    return Output(case_id, tuple(int(t) for t in continuation),
                  top_ids=np.asarray(top_ids, np.int32).reshape(n, -1),
                  top_logprobs=np.asarray(top_logprobs, np.float32).reshape(n, -1),
                  chosen_logprobs=np.asarray(chosen, np.float32).reshape(n), finish_reason="scored",
                  full_logprobs=full if full is None or isinstance(full, np.ndarray) else np.asarray(full))
