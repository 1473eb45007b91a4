"""Comparators: each judges one case and returns a Verdict. One registry, one parameter schema.

Every comparator is registered in :data:`COMPARATORS` with the parameters its ``[compare.<name>]``
suite table may hold. A suite is checked against that schema when it loads
(:func:`check_params`): an unknown key is an error naming the file, the table and the key, with
the closest valid keys ("did you mean"), so a typo such as ``threshold_nat`` can never silently
gate at the default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.api import Comparator
from harness.compare.bit_exact import BitExact
from harness.compare.drift import DEFAULT_EDGES, Drift
from harness.compare.kl import KL
from harness.compare.near_tie import NearTie
from harness.compare.nmse import DEFAULT_MAX_NMSE, NMSE
from harness.compare.rl_logprobs import RLLogprobs
from harness.compare.strict import Strict
from harness.registry import Registry, unknown

Decode = Callable[[Sequence[int]], str]
Factory = Callable[[Mapping[str, Any], "Decode | None"], Comparator]


class ParamError(ValueError):
    """A comparator parameter is unknown or has the wrong type; the message names the key."""


@dataclass(frozen=True, slots=True)
class Param:
    """One key of a ``[compare.<name>]`` table."""

    kind: str
    """``number``, ``int``, ``edges`` (a list of ints >= 0) or ``choice``."""
    default: Any
    help: str
    choices: tuple[str, ...] = ()

    def check(self, value: Any, where: str) -> None:
        ok = {
            "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "edges": lambda v: isinstance(v, list | tuple) and bool(v)
            and all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in v),
            "choice": lambda v: v in self.choices,
        }[self.kind](value)
        if not ok:
            want = {"number": "a number", "int": "an int >= 0", "edges": "a list of ints >= 0",
                    "choice": "one of " + ", ".join(repr(c) for c in self.choices)}[self.kind]
            raise ParamError(f"{where}: must be {want}, got {value!r}")


COMPARATORS: Registry[Factory] = Registry("comparator")
"""Comparator name -> factory(params, decode); ``meta`` is its ``{key: Param}`` schema."""

MODES = ("auto", "full", "topk")
_MODE = Param("choice", "auto", "capture mode: exact full-vocab, top-k+rest lower bound, or auto",
              MODES)


def _opt(p: Mapping[str, Any], key: str) -> float | None:
    return None if p.get(key) is None else float(p[key])


@COMPARATORS.register("strict", help="token for token identical", meta={})
def _strict(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    return Strict(decode=decode)


@COMPARATORS.register("near_tie", help="a divergence only where the oracle was nearly undecided", meta={
    "threshold_nats": Param("number", 0.5, "the largest forgiven gap, oracle token minus candidate "
                                           "token (nats)")})
def _near_tie(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    return NearTie(threshold_nats=float(p.get("threshold_nats", 0.5)), decode=decode)


@COMPARATORS.register("kl", help="KL(oracle || candidate) per position, teacher-forced", meta={
    "max_mean": Param("number", 1e-3, "bar on the mean KLD (nats)"),
    "max_p99": Param("number", None, "bar on the p99 KLD"),
    "max_max": Param("number", None, "bar on the largest KLD"),
    "min_same_top": Param("number", None, "bar on the share of positions whose top token agrees"),
    "mode": _MODE})
def _kl(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    return KL(max_mean=float(p.get("max_mean", 1e-3)), max_p99=_opt(p, "max_p99"),
              max_max=_opt(p, "max_max"), min_same_top=_opt(p, "min_same_top"),
              mode=p.get("mode", "auto"), decode=decode)


@COMPARATORS.register("drift", help="growth of KL with position (slope per 1000 tokens)", meta={
    "max_slope_per_1k": Param("number", 1e-3, "bar on the KL slope (nats per 1000 positions)"),
    "max_growth": Param("number", None, "bar on last-bucket / first-bucket mean KL"),
    "buckets": Param("edges", list(DEFAULT_EDGES), "position bucket edges"),
    "min_positions": Param("int", 64, "fewer aligned positions: not judged"),
    "mode": _MODE})
def _drift(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    return Drift(max_slope_per_1k=float(p.get("max_slope_per_1k", 1e-3)),
                 max_growth=_opt(p, "max_growth"), edges=tuple(p.get("buckets", DEFAULT_EDGES)),
                 min_positions=int(p.get("min_positions", 64)), mode=p.get("mode", "auto"),
                 decode=decode)


@COMPARATORS.register("nmse", help="normalised squared error of full-vocab logprob vectors", meta={
    "max_nmse": Param("number", DEFAULT_MAX_NMSE, "bar (the cross-device bar of a C++ vLLM port)")})
def _nmse(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    return NMSE(max_nmse=float(p.get("max_nmse", DEFAULT_MAX_NMSE)), decode=decode)


@COMPARATORS.register("bit_exact", help="the same tokens and the same logprobs, bit for bit", meta={})
def _bit_exact(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    return BitExact(decode=decode)


@COMPARATORS.register("rl_logprobs", help="trainer vs rollout logprobs of sampled tokens: |Δ|, importance "
                                          "ratio, sequence KL", meta={
    "max_mean_abs": Param("number", 1e-3, "bar on the mean |Δ logprob| per token (nats)"),
    "max_p99_abs": Param("number", None, "bar on the p99 |Δ logprob|"),
    "max_max_abs": Param("number", None, "bar on the largest |Δ logprob|"),
    "max_ratio_outside": Param("number", 0.0, "bar on the share of tokens whose importance ratio is "
                                              "outside [ratio_low, ratio_high]"),
    "max_seq_kl": Param("number", 1e-3, "bar on the mean sequence KL(rollout || trainer), k3 estimate "
                                        "(nats per sequence)"),
    "max_support_mismatch": Param("int", 0, "bar on tokens one side gives -inf (a top-p mask drawn "
                                            "differently)"),
    "ratio_low": Param("number", 0.8, "lower end of the importance-ratio band"),
    "ratio_high": Param("number", 1.25, "upper end of the importance-ratio band")})
def _rl_logprobs(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    return RLLogprobs(max_mean_abs=float(p.get("max_mean_abs", 1e-3)), max_p99_abs=_opt(p, "max_p99_abs"),
                      max_max_abs=_opt(p, "max_max_abs"),
                      max_ratio_outside=float(p.get("max_ratio_outside", 0.0)),
                      max_seq_kl=_opt(p, "max_seq_kl") if "max_seq_kl" in p else 1e-3,
                      max_support_mismatch=float(p.get("max_support_mismatch", 0)),
                      ratio_low=float(p.get("ratio_low", 0.8)), ratio_high=float(p.get("ratio_high", 1.25)),
                      decode=decode)


# KV comparators judge pages, not Outputs; their modules are imported on use (they pull in torch).
@COMPARATORS.register("byte_equal", help="every restored KV page byte-equal to what was written", meta={})
def _byte_equal(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    from harness.compare.byte_equal import ByteEqual

    return ByteEqual()


@COMPARATORS.register("kv_hits", help="the connector serves the expected prefix and the engine uses it",
                      meta={})
def _kv_hits(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    from harness.compare.kv_hits import KVHits

    return KVHits()


@COMPARATORS.register("sampling", help="the sampling gate's bars: support, fit under Holm, power", meta={
    "alpha": Param("number", 0.01, "family-wise false-positive rate over every fit of a record (Holm)"),
    "power": Param("number", 0.9, "the power every detectable TV is stated at"),
    "target_tv": Param("number", 0.1, "the TV each test draws enough to detect"),
    "min_expected": Param("number", 5.0, "smallest expected count of a cell of its own"),
    "max_cells": Param("int", 16, "cells per fit, the pooled rest included"),
    "boundary_tol": Param("number", 1e-3, "borderline width of a truncation (nats; top-p: probability)"),
    "logprob_tol": Param("number", 1e-3, "largest |engine logprob - reference| (nats)")})
def _sampling(p: Mapping[str, Any], decode: Decode | None) -> Comparator:
    from harness.sampling.bars import SamplingBars

    return SamplingBars(p)


def check_params(name: str, params: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ParamError` (naming ``where``, the table and the key) for an unknown key or a
    value of the wrong type. ``gate`` is the pipeline's, not the comparator's."""
    schema: Mapping[str, Param] = COMPARATORS.entry(name).meta or {}
    for key, value in params.items():
        if key == "gate":
            continue
        if key not in schema:
            raise ParamError(f"{where} [compare.{name}]: "
                             + str(unknown("key", key, schema or ["(no parameters)"])))
        schema[key].check(value, f"{where} [compare.{name}] {key}")


def build(name: str, params: Mapping[str, Any], decode: Decode | None = None) -> Comparator:
    """The comparator registered as ``name``, configured from its (checked) suite table ``params``."""
    check_params(name, params, f"[compare.{name}]")
    return COMPARATORS.get(name)(params, decode)
