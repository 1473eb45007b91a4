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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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



def candidate_speed(runner: Any, requests: int, concurrency: int | None) -> Speed | None:
    """The runner's own :class:`Speed`, or one built from its ``timings`` (no TTFT then)."""
    speed = getattr(runner, "speed", None)
    if isinstance(speed, Speed):
        return speed
    timings = getattr(runner, "timings", {}) or {}
    # Without a concurrency of its own a runner batches everything (vLLM) or goes one by one.
    batched = getattr(runner, "concurrency", "absent") is None
    c = concurrency or (requests if batched else 1)
    return Speed.from_timings(timings, c, requests, "batch" if batched else "sequential")


def measure_oracle(model: Any, cases: Any, sampling: Any, concurrency: int, run_dir: Any) -> Speed:
    """Replay ``cases`` on the pinned vLLM at ``concurrency`` (one engine start) and time it."""
    from harness.engines.vllm import VLLMRunner

    runner = VLLMRunner(model, {}, name="oracle-speed", run_dir=run_dir, concurrency=concurrency)
    outs = runner.run(cases, sampling)
    if runner.speed is None:
        raise RuntimeError("the oracle's worker reported no timings")
    failed = [o.case_id for o in outs if o.error]
    if failed:
        raise RuntimeError(f"the oracle failed on {', '.join(failed)}")
    return runner.speed


def speed_extra(runner: Any, cases: Any, sampling: Any, model: Any, run_dir: Any,
                concurrency: int | None, oracle: bool | Speed | str, candidate_ran: bool) -> dict[str, Any]:
    """The record's ``speed`` entry: the candidate's, the oracle's, and their ratio.

    ``oracle``: True measures it now, after the candidate has stopped (they never share the CPU);
    a :class:`Speed` was measured earlier in the same run; a string says why there is none.
    """
    cand = candidate_speed(runner, len(cases), concurrency) if candidate_ran else None
    if cand is None:
        return {"speed": speed_report(None, None)}
    if isinstance(oracle, Speed):
        return {"speed": speed_report(cand, oracle)}
    if isinstance(oracle, str):
        return {"speed": speed_report(cand, None, oracle)}
    if not oracle:
        return {"speed": speed_report(cand, None, "oracle speed not requested (harness gate "
                                                  "--oracle-speed, on by default in the CLI)")}
    try:
        measured = measure_oracle(model, cases, sampling, cand.concurrency, run_dir)
    except Exception as e:  # noqa: BLE001 - a speed measurement never fails a correctness gate
        return {"speed": speed_report(cand, None, f"oracle speed run failed: {type(e).__name__}: {e}"[:300])}
    return {"speed": speed_report(cand, measured)}
