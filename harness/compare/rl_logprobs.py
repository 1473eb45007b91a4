"""rl_logprobs: the trainer's logprobs of the rollout engine's sampled tokens against the engine's own.

Reinforcement-learning pipelines sample with an inference engine (the rollout) and compute the
policy's logprobs of the same tokens with a training framework (the trainer, teacher forcing). A
gap between the two is an off-policy error every importance-sampling correction inherits. Per
sampled token, with Δ = trainer logprob - rollout logprob:

* ``|Δ|``: mean, p99, max (nats);
* the importance ratio ``r = exp(Δ)`` = π_trainer / π_rollout: mean, p99, max, and the share of
  tokens outside ``[ratio_low, ratio_high]`` (default [0.8, 1.25], a PPO-style clip range);
* a sequence-level KL(rollout ‖ trainer) estimate from the rollout's own samples: ``k1`` = -ΣΔ per
  sequence (unbiased, can be negative) and ``k3`` = Σ(r - 1 - Δ) (unbiased, never negative, lower
  variance), in nats per sequence, averaged over sequences;
* ``support_mismatch``: tokens one side gives -inf or NaN (a top-p mask drawn differently) — the
  ratio is 0 or infinite there, so they are counted apart and kept out of the statistics.

The oracle side of :meth:`RLLogprobs.compare` is the rollout, the candidate the trainer's score.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.explain import engine_error
from harness.compare.kernels.planting import OVER_BAR
from harness.compare.unit import TOKENS, ControlSet, Mutation, Needs, Planted, Unit, param

RUN = "(run)"
"""The case id of the verdict that pools every sampled token of a run."""


def finite_pairs(rollout: Sequence[np.ndarray], trainer: Sequence[np.ndarray]
                 ) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Each sequence's chosen-token logprobs of rollout and trainer as float64, the positions where
    either side is not finite left out; and how many were (the support mismatch)."""
    pairs, bad = [], 0
    for r, t in zip(rollout, trainer, strict=True):
        r, t = np.asarray(r, np.float64), np.asarray(t, np.float64)
        if r.shape != t.shape:
            raise ValueError(f"rollout and trainer lengths differ: {r.shape} vs {t.shape}")
        ok = np.isfinite(r) & np.isfinite(t)
        bad += int((~ok).sum())
        pairs.append((r[ok], t[ok]))
    return pairs, bad


def rl_stats(rollout: Sequence[np.ndarray], trainer: Sequence[np.ndarray], low: float = 0.8,
             high: float = 1.25) -> dict[str, float]:
    """The statistics above over one or more sequences (``rollout[i]`` and ``trainer[i]``: the
    chosen-token logprobs of sequence i, same length)."""
    deltas, k1, k3 = [], [], []
    pairs, mism = finite_pairs(rollout, trainer)
    for r, t in pairs:
        d = t - r
        deltas.append(d)
        k1.append(float(-d.sum()))
        k3.append(float((np.exp(d) - 1.0 - d).sum()))
    d = np.concatenate(deltas) if deltas else np.zeros(0)
    if not d.size:
        return {"tokens": 0, "sequences": len(k1), "support_mismatch": mism}
    a, ratio = np.abs(d), np.exp(d)
    return {"tokens": int(d.size), "sequences": len(k1), "support_mismatch": mism,
            "mean_abs_delta": float(a.mean()), "p99_abs_delta": float(np.quantile(a, 0.99)),
            "max_abs_delta": float(a.max()), "mean_delta": float(d.mean()),
            "ratio_mean": float(ratio.mean()), "ratio_p99": float(np.quantile(ratio, 0.99)),
            "ratio_max": float(ratio.max()), "ratio_min": float(ratio.min()),
            "ratio_outside": float(((ratio < low) | (ratio > high)).mean()),
            "ratio_low": low, "ratio_high": high,
            "seq_kl_k1": float(np.mean(k1)), "seq_kl_k3": float(np.mean(k3))}


BARS = (("mean_abs_delta", "max_mean_abs"), ("p99_abs_delta", "max_p99_abs"),
        ("max_abs_delta", "max_max_abs"), ("ratio_outside", "max_ratio_outside"),
        ("seq_kl_k3", "max_seq_kl"), ("support_mismatch", "max_support_mismatch"))
"""(statistic, the bar that judges it)."""


@dataclass(frozen=True, slots=True)
class RLLogprobs:
    key = "rl_logprobs"
    needs_scores = False
    max_mean_abs: float = param(1e-3, "number", "bar on the mean |Δ logprob| per token (nats)")
    max_p99_abs: float | None = param(None, "number", "bar on the p99 |Δ logprob|")
    max_max_abs: float | None = param(None, "number", "bar on the largest |Δ logprob|")
    max_ratio_outside: float = param(0.0, "number", "bar on the share of tokens whose importance ratio "
                                                    "is outside [ratio_low, ratio_high]")
    max_seq_kl: float = param(1e-3, "number", "bar on the mean sequence KL(rollout || trainer), k3 "
                                              "estimate (nats per sequence)")
    max_support_mismatch: int = param(0, "int", "bar on tokens one side gives -inf (a top-p mask drawn "
                                                "differently)")
    ratio_low: float = param(0.8, "number", "lower end of the importance-ratio band")
    ratio_high: float = param(1.25, "number", "upper end of the importance-ratio band")
    decode: Callable[[Sequence[int]], str] | None = None

    def bars(self) -> dict[str, float]:
        return {bar: float(v) for _, bar in BARS if (v := getattr(self, bar)) is not None}

    def judge(self, case_id: str, stats: dict[str, float]) -> Verdict:
        """A verdict from statistics already computed (one sequence, or a whole run pooled)."""
        if not stats.get("tokens") and not stats.get("support_mismatch"):
            return Verdict(case_id, self.key, "skip", "no sampled tokens to judge", evidence=stats)
        over = [f"{stat} {stats.get(stat, 0.0):.3g} > {bar} {getattr(self, bar):g}"
                for stat, bar in BARS if getattr(self, bar) is not None
                and float(stats.get(stat, 0.0)) > float(getattr(self, bar))]
        g = lambda key: float(stats.get(key, float("nan")))  # noqa: E731
        band = f"[{self.ratio_low:g}, {self.ratio_high:g}]"
        line = (f"|Δ| mean {g('mean_abs_delta'):.2e} p99 {g('p99_abs_delta'):.2e} "
                f"max {g('max_abs_delta'):.2e}, ratio outside {band} {100 * g('ratio_outside'):.2f}%, "
                f"seq KL {g('seq_kl_k3'):.2e} ({stats.get('tokens', 0)} tokens)")
        ev: dict[str, Any] = {**stats, "bars": self.bars()}
        if over:
            return Verdict(case_id, self.key, "fail", f"rl_logprobs FAIL: {over[0]}",
                           detail=f"{case_id}: trainer vs rollout logprobs over the bars:\n  "
                                  + "\n  ".join(over) + f"\n  {line}", evidence=ev)
        return Verdict(case_id, self.key, "pass", line, evidence=ev)

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        if (err := engine_error(self.key, oracle, candidate, case)) is not None:
            return err
        if tuple(oracle.token_ids) != tuple(candidate.token_ids):
            return Verdict(case.id, self.key, "error", "the trainer scored other tokens than the rollout "
                           "sampled", evidence={"rollout": len(oracle.token_ids),
                                                "trainer": len(candidate.token_ids)})
        if oracle.chosen_logprobs is None or candidate.chosen_logprobs is None:
            side = "rollout" if oracle.chosen_logprobs is None else "trainer"
            return Verdict(case.id, self.key, "error", f"the {side} returned no logprobs")
        return self.judge(case.id, rl_stats([oracle.chosen_logprobs], [candidate.chosen_logprobs],
                                            self.ratio_low, self.ratio_high))

    def compare_run(self, oracles: Sequence[Output], candidates: Sequence[Output],
                    cases: Sequence[Case]) -> Verdict:
        """Every sampled token of a run, pooled (the ``(run)`` verdict): the rollouts are the
        ``oracles``, the trainer's scores of their tokens the ``candidates``."""
        good = [(o, c) for o, c in zip(oracles, candidates, strict=True)
                if o.error is None and c.error is None
                and o.chosen_logprobs is not None and c.chosen_logprobs is not None
                and tuple(o.token_ids) == tuple(c.token_ids)]
        rollout = [o.chosen_logprobs for o, _ in good]
        trainer = [c.chosen_logprobs for _, c in good]
        return self.judge(RUN, rl_stats(rollout, trainer, self.ratio_low, self.ratio_high))  # type: ignore[arg-type]


def plant_rl_shift(comp: Any, case: Case, oracle: Output) -> Planted | str:
    """The trainer's logprob of every sampled token lowered by 10x the mean-|Δ| bar."""
    if oracle.chosen_logprobs is None:
        return "the rollout has no logprobs"
    if not oracle.token_ids:
        return "the rollout is empty"
    d = OVER_BAR * float(comp.max_mean_abs)
    chosen = np.asarray(oracle.chosen_logprobs, np.float64) - d
    return Planted(oracle, replace(oracle, chosen_logprobs=chosen.astype(np.float32)),
                   f"every token -{d:g} nats ({OVER_BAR:g}x the mean bar)")


def plant_scored_copy(comp: Any, case: Case, oracle: Output) -> Planted | str:
    if oracle.chosen_logprobs is None:
        return "the rollout has no logprobs"
    return Planted(oracle, replace(oracle), "")


UNIT = Unit(RLLogprobs, "trainer vs rollout logprobs of sampled tokens: |Δ|, importance ratio, sequence KL",
            needs=TOKENS, across_devices="bar", controls=ControlSet(needs=Needs(logprobs=True), mutations=(
                Mutation("trainer logprobs shifted above the bar", "fail", plant_rl_shift),
                Mutation("trainer equals rollout", "pass", plant_scored_copy),
            )))
