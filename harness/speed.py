"""Speed beside correctness: output tokens/s and time to first token, candidate against oracle.

An absolute tok/s says more about the machine than about the engine, so a record states a *ratio*
measured in one run: the candidate and the pinned oracle replay the same cases at the same
concurrency on the same machine, e.g. ``candidate/oracle = 0.93x output tok/s at c8``.

Both sides are measured the same way: a closed loop that keeps ``concurrency`` requests in flight
until the workload is done. ``wall_s`` runs from the first request sent to the last one finished;
TTFT is per request, from sending it to its first generated token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from harness.excerpt import clip


@dataclass(frozen=True, slots=True)
class Speed:
    """How fast one engine replayed one workload at one concurrency."""

    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    ttft_s: tuple[float, ...] = ()
    """Per request that produced a token; empty when the engine cannot tell (no streaming)."""
    method: str = ""
    """How it was measured: ``http-stream``, ``vllm-offline``, ``subprocess``, ``sequential``."""

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    def ttft_ms(self, q: float) -> float | None:
        """The ``q`` quantile (0..1, nearest rank) of TTFT in milliseconds, or None."""
        if not self.ttft_s:
            return None
        xs = sorted(self.ttft_s)
        return 1000.0 * xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "concurrency": self.concurrency, "requests": self.requests,
            "output_tokens": self.output_tokens, "wall_s": round(self.wall_s, 4),
            "output_tok_s": round(self.output_tok_s, 2) if self.wall_s > 0 else None,
            "method": self.method,
        }
        if self.ttft_s:
            out["ttft_ms"] = {"p50": round(self.ttft_ms(0.5) or 0, 2),
                              "p90": round(self.ttft_ms(0.9) or 0, 2),
                              "max": round(1000 * max(self.ttft_s), 2)}
        return out

    @classmethod
    def from_timings(cls, timings: Mapping[str, float], concurrency: int, requests: int,
                     method: str) -> Speed | None:
        """For runners that only report ``output_tokens`` and ``generate_s`` (no TTFT)."""
        if "output_tokens" not in timings or not timings.get("generate_s"):
            return None
        return cls(concurrency, requests, int(timings["output_tokens"]), float(timings["generate_s"]),
                   (), method)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (b > 0) or math.isnan(a):
        return None
    return round(a / b, 3)


def speed_report(candidate: Speed | None, oracle: Speed | None, oracle_missing: str = "") -> dict[str, Any]:
    """The ``speed`` entry of a record: both sides, their ratios, and one sentence saying it.

    ``oracle_missing`` says why there is no oracle side (then there is no ratio either: a bare
    candidate number is kept but never stated as a result).
    """
    out: dict[str, Any] = {"candidate": candidate.to_json() if candidate else None,
                           "oracle": oracle.to_json() if oracle else None}
    if candidate is None:
        out["statement"] = "candidate speed not measured"
        return out
    c = candidate.concurrency
    out["concurrency"] = c
    if oracle is None:
        out["statement"] = f"no speed ratio at c{c}: {oracle_missing or 'oracle speed not measured'}"
        return out
    if oracle.concurrency != c or oracle.requests != candidate.requests:
        out["statement"] = (f"no speed ratio: candidate ran {candidate.requests} requests at c{c}, "
                            f"oracle {oracle.requests} at c{oracle.concurrency}")
        return out
    tok = _ratio(candidate.output_tok_s, oracle.output_tok_s)
    ttft = _ratio(candidate.ttft_ms(0.5), oracle.ttft_ms(0.5))
    out["ratio"] = {"output_tok_s": tok, "ttft_p50": ttft}
    text = f"candidate/oracle = {tok:.2f}x output tok/s at c{c}" if tok is not None else (
        f"no throughput ratio at c{c}")
    if ttft is not None:
        text += f", TTFT p50 {ttft:.2f}x"
    out["statement"] = text
    return out


class Measured(Protocol):
    """What speed reads of an engine's run: :class:`harness.api.RunFacts` (this module sits below the
    contracts, which name :class:`Speed`)."""

    @property
    def speed(self) -> Speed | None: ...
    @property
    def timings(self) -> Mapping[str, float]: ...
    @property
    def batched(self) -> bool: ...


def candidate_speed(facts: Measured, requests: int, concurrency: int | None) -> Speed | None:
    """The engine's own :class:`Speed`, or one built from its ``timings`` (no TTFT then)."""
    if facts.speed is not None:
        return facts.speed
    # Without a concurrency of its own a runner batches everything (vLLM) or goes one by one.
    c = concurrency or (requests if facts.batched else 1)
    return Speed.from_timings(facts.timings, c, requests, "batch" if facts.batched else "sequential")


OracleSpeed = Callable[[int], Speed]
"""Measures the oracle on the same workload at a concurrency (one engine start)."""


def speed_extra(facts: Measured | None, requests: int, concurrency: int | None,
                oracle: Speed | str | OracleSpeed | None) -> dict[str, Any]:
    """The record's ``speed`` entry: the candidate's, the oracle's, and their ratio.

    ``facts``: the candidate's (None: it did not run). ``oracle``: a :class:`Speed` measured earlier
    in the same run (``make matrix``), a function that measures it now (after the candidate has
    stopped, so the two never share the CPU), a string saying why there is none, or None (not
    asked: ``make gate SPEED=1`` asks).
    """
    cand = candidate_speed(facts, requests, concurrency) if facts is not None else None
    if cand is None:
        return {"speed": speed_report(None, None)}
    if isinstance(oracle, Speed):
        return {"speed": speed_report(cand, oracle)}
    if isinstance(oracle, str):
        return {"speed": speed_report(cand, None, oracle)}
    if oracle is None:
        return {"speed": speed_report(cand, None, "oracle speed not measured (make gate SPEED=1, "
                                                  "harness gate --speed)")}
    try:
        measured = oracle(cand.concurrency)
    except Exception as e:  # noqa: BLE001 - a speed measurement never fails a correctness gate
        return {"speed": speed_report(cand, None, clip(f"oracle speed run failed: {type(e).__name__}: {e}"))}
    return {"speed": speed_report(cand, measured)}
