"""An ``rl`` suite's ``[rl_sync]`` table: the steps, the rollouts, the trainer and the bars, validated
with errors naming the file, the table and the key (:mod:`harness.tomlcheck`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from harness.suites import Suite, SuiteError
from harness.tomlcheck import (
    Where,
    check_keys,
    check_table,
    need_choice,
    need_int,
    need_list,
    need_number,
    need_table,
)

TABLE = "rl_sync"
STEP_KINDS = ("checkpoint", "ordinary", "identity", "easy")
"""What a step does to the trainer's weights: nothing (step 0, the checkpoint as loaded), every tensor
moved by a small relative amount, nothing again (an update of identical weights), or only the tensors
that are easy to miss (:func:`harness.kinds.rl.updates.easy_tensors`)."""
DTYPES = ("float32", "bfloat16")
CONTROLS = ("no_reset", "drop_tensor", "not_applied", "trainer_dtype")
"""The planted faults, each its own run (``make rl CONTROL=...``): the prefix cache not reset after an
update; one tensor left out of every transfer; an update the engine never applied (start and finish,
no ``update_weights``); the trainer scoring in another dtype than the suite declares."""

BAR_KEYS: Mapping[str, tuple[float, float, str]] = {
    "token_mult_prob_error": (1.0, 100.0, "max"),
    "gen_kl_error": (0.0, 100.0, "max"),
    "rollout_probs_diff_mean": (0.0, 1.0, "max"),
    "rollout_probs_diff_max": (0.0, 1.0, "max"),
    "probs_pearson": (-1.0, 1.0, "min"),
    "k3_kl": (0.0, 100.0, "max"),
    "frac_over_ln2": (0.0, 1.0, "max"),
    "mean_abs_delta": (0.0, 100.0, "max"),
    "frac_masked": (0.0, 1.0, "max"),
}
"""Per-step bars: the metric, its range, and whether the bar is a most (``max``) or a least (``min``).
Without a ``frac_masked`` bar, any sampled token one side's top-p mask excludes fails the step."""


@dataclass(frozen=True, slots=True)
class RLSettings:
    steps: tuple[str, ...]
    relative: float = 0.02
    easy_relative: float = 0.05
    seed: int = 7
    temperature: float = 0.8
    top_p: float = 0.9
    max_tokens: int = 24
    shared_tokens: int = 64
    tail_tokens: int = 16
    trainer_dtype: str = "float32"
    bars: Mapping[str, float] = field(default_factory=dict)
    growth: float = 4.0
    """A step's mean |Δ logprob| over step 0's (at least ``growth_floor``) above this fails the run."""
    growth_floor: float = 1e-6
    identity_tol: float = 1e-9
    weight_tol: float = 1e-6
    """|engine - sent| <= weight_tol x max |sent|: the tensor arrived."""
    routing_min_agreement: float = 0.99
    pause_tokens: int = 1024
    """Over HTTP, the tokens each request of the pause phase asks for: enough to be in flight when
    ``/pause`` comes (:mod:`harness.kinds.rl.pause`). 128 was too few on tiny-llama: its requests
    had finished, or had every token produced and on its way, before the pause took effect."""
    r3_gain: float = 0.0
    """Routing replay (R3) must lower the mismatch by at least this factor where routes differ."""
    draws: int = 1
    """The cases, in order, form this many draws of equal size: the record gives step 0's figures per
    draw (independent measurements of the pair's floor, to calibrate bars from)."""
    model_bars: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Bars per model (``[rl_sync.model_bars.<model>]``), over ``bars``: a floor set by the model
    (bfloat16 rounding), calibrated on each model's own step 0."""
    bars_from: str = "bars"
    """Which table the bars in force came from (``bars`` or ``model_bars.<model>``)."""

    def for_model(self, model: str) -> RLSettings | None:
        """The settings with ``model``'s bars in force; None when the suite has bars per model and
        none for it, and no common ``bars`` to fall back on."""
        if model in self.model_bars:
            bars = {**self.bars, **self.model_bars[model]}
            return replace(self, bars=bars, model_bars={}, bars_from=f"model_bars.{model}")
        if self.model_bars and not self.bars:
            return None
        return replace(self, model_bars={})

    @property
    def shared_share(self) -> float:
        return self.shared_tokens / (self.shared_tokens + self.tail_tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            k: (dict(v) if isinstance(v, Mapping) else list(v) if isinstance(v, tuple) else v)
            for k, v in ((f, getattr(self, f)) for f in self.__dataclass_fields__)
        }


def parse(suite: Suite) -> RLSettings:
    w = Where(suite.path, (TABLE,), error=SuiteError)
    raw = need_table(suite.extra, TABLE, Where(suite.path, error=SuiteError))
    check_keys(
        raw,
        w,
        (
            "steps",
            "relative",
            "easy_relative",
            "seed",
            "temperature",
            "top_p",
            "max_tokens",
            "shared_tokens",
            "tail_tokens",
            "trainer_dtype",
            "bars",
            "growth",
            "growth_floor",
            "identity_tol",
            "weight_tol",
            "routing_min_agreement",
            "pause_tokens",
            "draws",
            "model_bars",
        ),
    )
    steps = tuple(need_list(raw, "steps", w, of=str))
    for i, s in enumerate(steps):
        if s not in STEP_KINDS:
            raise (w / "steps").fail(f"step {i} is {s!r}; valid: {', '.join(STEP_KINDS)}")
    if steps[0] != "checkpoint" or "checkpoint" in steps[1:]:
        raise (w / "steps").fail("must start with 'checkpoint' (step 0) and hold it once")
    if len(steps) < 2:
        raise (w / "steps").fail("needs at least one update after the checkpoint")
    bars = _bars(need_table(raw, "bars", w, {}), w / "bars")
    mw = w / "model_bars"
    model_bars = {
        m: _bars(check_table(t, mw / m), mw / m) for m, t in need_table(raw, "model_bars", w, {}).items()
    }
    if not bars and not model_bars:
        raise (w / "bars").fail(f"names no bar; give at least one of {', '.join(BAR_KEYS)}")
    for m, mb in model_bars.items():
        if not mb:
            raise (mw / m).fail(f"names no bar; give at least one of {', '.join(BAR_KEYS)}")
    s = RLSettings(
        steps=steps,
        relative=need_number(raw, "relative", w, 0.02, lo=0.0, hi=1.0, lo_open=True),
        easy_relative=need_number(raw, "easy_relative", w, 0.05, lo=0.0, hi=1.0, lo_open=True),
        seed=need_int(raw, "seed", w, 7, lo=0),
        temperature=need_number(raw, "temperature", w, 0.8, lo=0.0, hi=10.0, lo_open=True),
        top_p=need_number(raw, "top_p", w, 0.9, lo=0.0, hi=1.0, lo_open=True),
        max_tokens=need_int(raw, "max_tokens", w, 24, lo=1),
        shared_tokens=need_int(raw, "shared_tokens", w, 64, lo=1),
        tail_tokens=need_int(raw, "tail_tokens", w, 16, lo=1),
        trainer_dtype=need_choice(raw, "trainer_dtype", w, DTYPES, "float32"),
        bars=bars,
        growth=need_number(raw, "growth", w, 4.0, lo=1.0, hi=1e6),
        growth_floor=need_number(raw, "growth_floor", w, 1e-6, lo=0.0, hi=1.0, lo_open=True),
        identity_tol=need_number(raw, "identity_tol", w, 1e-9, lo=0.0, hi=1.0),
        weight_tol=need_number(raw, "weight_tol", w, 1e-6, lo=0.0, hi=1.0),
        routing_min_agreement=need_number(raw, "routing_min_agreement", w, 0.99, lo=0.0, hi=1.0),
        pause_tokens=need_int(raw, "pause_tokens", w, 1024, lo=2),
        draws=need_int(raw, "draws", w, 1, lo=1),
        model_bars=model_bars,
    )
    if s.shared_share < 0.8:
        raise (w / "shared_tokens").fail(
            f"shares {100 * s.shared_share:.0f}% of each prompt with the step "
            f"before (shared_tokens {s.shared_tokens}, tail_tokens "
            f"{s.tail_tokens}); the gate needs at least 80%"
        )
    if len(suite.cases) % s.draws:
        raise (w / "draws").fail(f"{len(suite.cases)} cases do not split into {s.draws} draws of equal size")
    for c in suite.cases:
        if c.ids is not None and len(c.ids) < s.shared_tokens:
            raise SuiteError(
                f"{suite.path}: case {c.id!r} holds {len(c.ids)} ids, fewer than "
                f"[{TABLE}] shared_tokens {s.shared_tokens}"
            )
    return s


def _bars(raw: Mapping[str, Any], w: Where) -> dict[str, float]:
    check_keys(raw, w, tuple(BAR_KEYS))
    return {k: need_number(raw, k, w, lo=lo, hi=hi) for k, (lo, hi, _) in BAR_KEYS.items() if k in raw}


VERDICTS = (
    "rl_sync", "rl_growth", "rl_identity", "rl_weights", "rl_version", "rl_routing", "rl_pause", "rl_control",
)  # fmt: skip


def verdict_names(raw: Mapping[str, Any]) -> list[str]:
    """Every verdict name a run of the raw suite can give (FEATURES.md rows name them)."""
    table = raw.get(TABLE)
    table = table if isinstance(table, Mapping) else {}
    tables = [table.get("bars"), *dict(table.get("model_bars") or {}).values()]
    keys = {k for t in tables if isinstance(t, Mapping) for k in t}
    return [*VERDICTS, *(f"rl.{k}" for k in BAR_KEYS if k in keys)]
