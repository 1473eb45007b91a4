"""An invariance suite's settings: the variants, the tier that gates each, the rollout check.

A suite of ``kind = "invariance"`` names configurations that must not change one token and says
how each is judged::

    [compare.bit_exact]            # tier 1: the same tokens and the same logprobs, bit for bit
    gate = false
    [compare.near_tie]             # tier 2: a divergence only where the reference was undecided
    gate = true
    threshold_nats = 0.5
    [compare.rl_logprobs]          # trainer vs rollout logprobs (with an [rl] table)
    max_mean_abs = 1e-3

    [invariance]
    variants = ["batch", "prefix_cache", ...]      # default: every variant
    inverse = { dtype = "bfloat16" }               # the inverse control's engine change

    [invariance.chunked_prefill]                    # one table per variant, all optional
    gate = "bit_exact"                              # the gating tier: bit_exact | near_tie | none
    engine = { max_num_batched_tokens = 32, max_num_seqs = 16 }

    [rl]
    seeds = [1, 2]
    temperature = 0.8
    top_p = 0.9
    logprobs_mode = "processed_logprobs"

A variant without ``gate`` is gated by every tier whose ``[compare]`` table says ``gate = true``.
Every error names the file, the table and the field. Light on purpose (no engine imports): the
feature catalog asks it which verdict names a suite produces (:func:`verdict_names`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.registry import Registry, unknown
from harness.suites import SuiteError
from harness.tomlcheck import (
    Where,
    check_keys,
    check_table,
    need_choice,
    need_int,
    need_list,
    need_number,
    need_str,
    need_table,
)

TIERS = ("bit_exact", "near_tie")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
"""The vLLM ``logprobs_mode`` values a rollout may return and the trainer can reproduce (the
``*_logits`` modes are not logprobs)."""


class InvarianceError(SuiteError):
    """A malformed ``[invariance]`` or ``[rl]`` table; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Variant:
    """One configuration change that must preserve output, and what its reference is."""

    name: str
    title: str
    reference: str
    """What the outputs are compared against, in words (goes into the record)."""
    engine: Mapping[str, Any] = field(default_factory=dict)
    """The default engine change of the side under test (LLM kwargs), when it needs its own engine."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Other fields its table may hold, with their defaults."""


VARIANTS: Registry[Variant] = Registry("invariance variant")


def _variant(v: Variant) -> Variant:
    return VARIANTS.register(v.name, help=v.title)(v)


_variant(Variant("batch", "each prompt alone vs all prompts in one batch",
                 "every prompt submitted alone, one generate call each, same engine"))
_variant(Variant("concurrency", "4 and 8 requests in flight vs 1, through the OpenAI server",
                 "the same server at concurrency 1", params={"levels": [1, 4, 8]}))
_variant(Variant("prefix_cache", "a warm prefix cache vs a cold one (the same prompts again; prompts "
                                 "sharing a prefix)",
                 "the prompts computed from an empty cache, same engine"))
_variant(Variant("chunked_prefill", "chunked prefill with a small token budget vs whole prefill",
                 "the base engine (token budget 4096: every prompt prefilled whole)",
                 engine={"max_num_batched_tokens": 32, "max_num_seqs": 16}))
_variant(Variant("spec_decode", "n-gram speculative decoding vs none",
                 "the base engine, no speculative decoding",
                 engine={"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 3, "prompt_lookup_min": 2}}))
_variant(Variant("preemption", "a KV pool so small the scheduler preempts and recomputes vs a large one",
                 "the base engine, whose KV pool holds every request at once",
                 engine={"num_gpu_blocks_override": 8, "max_model_len": 224}))
# vLLM refuses to start when one request of max_model_len cannot fit the pool ("To serve at least one
# request with the model's max seq len (4096) ... the estimated maximum model length is 224"): 8
# blocks of 32, less the one block vLLM keeps back, hold 224 tokens.
_variant(Variant("kv_connector", "a prompt prefix restored through the KV connector vs recomputed",
                 "the same prompts in the same batch reading no cache (the KV round trip's ref lane)",
                 params={"chunk_size": 32}))
_variant(Variant("decode_prefill", "each generated token's decode logprob vs the same token rescored by "
                                   "prefill",
                 "the generation's own logprobs (decode path); candidate: one prefill over prompt + "
                 "generation (prompt_logprobs), its greedy choice at every position"))

RL = "rl"
"""The selection name of the trainer-vs-rollout check (``--variants batch,rl``)."""


def verdict_name(variant: str, tier: str) -> str:
    """The comparator name of one variant's tier in records: ``inv_batch.bit_exact``."""
    return f"inv_{variant}.{tier}"


def verdict_names(raw: Mapping[str, Any]) -> list[str]:
    """Every verdict name a (raw, parsed-TOML) invariance suite can produce: what FEATURES.md rows
    may name in ``prove``."""
    inv = raw.get("invariance") if isinstance(raw.get("invariance"), Mapping) else {}
    names = inv.get("variants", VARIANTS.names()) if isinstance(inv, Mapping) else VARIANTS.names()
    tiers = [t for t in TIERS if t in (raw.get("compare") or {})]
    out = [verdict_name(v, t) for v in names if isinstance(v, str) for t in tiers]
    if "rl_logprobs" in (raw.get("compare") or {}):
        out.append("rl_logprobs")
    return out


@dataclass(frozen=True, slots=True)
class VariantSettings:
    name: str
    gates: tuple[str, ...]
    """The tiers whose failure fails the run (empty: reported only)."""
    engine: Mapping[str, Any]
    params: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RLSettings:
    seeds: tuple[int, ...]
    temperature: float
    top_p: float
    top_k: int
    """0: no top-k (vLLM's ``-1``/``0``)."""
    logprobs_mode: str
    max_tokens: int
    trainer: str
    """The engine spec that scores the rollouts (teacher forcing): ``hf``."""
    cases: tuple[str, ...] = ()
    """Case ids rolled out (empty: every case)."""


@dataclass(frozen=True, slots=True)
class InvarianceSettings:
    variants: tuple[VariantSettings, ...]
    inverse: Mapping[str, Any]
    """The engine change of the inverse control (LLM kwargs): a setting the engine promises no
    invariance for."""
    engine: Mapping[str, Any]
    """LLM kwargs every engine of the run gets on top of the harness defaults."""
    rl: RLSettings | None

    def variant(self, name: str) -> VariantSettings | None:
        return next((v for v in self.variants if v.name == name), None)


def parse(suite: Any, select: Sequence[str] | None = None) -> InvarianceSettings:
    """The settings of ``suite`` (a :class:`~harness.suites.Suite`), keeping only the variants in
    ``select`` (names of variants and ``rl``; None: the suite's own list)."""
    top = Where(suite.path, error=InvarianceError)
    where = top / "invariance"
    inv = need_table(suite.extra, "invariance", top, {})
    check_keys(inv, where, ("variants", "inverse", "engine", *VARIANTS.names()))
    names = need_list(inv, "variants", where, VARIANTS.names(), what="variant names")
    for n in names:
        if n not in VARIANTS:
            raise (where / "variants").fail(str(unknown("variant", n, VARIANTS.names())))
    compare = {s.name: s for s in suite.comparators}
    missing = [t for t in TIERS if t not in compare]
    if missing:
        raise top.fail(f"an invariance suite needs [compare.{missing[0]}] (the tiers are "
                       f"{' and '.join(TIERS)})")
    default_gates = tuple(t for t in TIERS if compare[t].gate)
    rl_table = suite.extra.get("rl")
    selected = list(select) if select is not None else [*names, *([RL] if rl_table is not None else [])]
    for n in selected:
        if n not in VARIANTS and n != RL:
            raise unknown("variant", n, [*VARIANTS.names(), RL])
    variants = []
    for n in names:
        if n not in selected:
            continue
        base = VARIANTS.get(n)
        t = need_table(inv, n, where, {})
        vw = where / n
        check_keys(t, vw, ("gate", "engine", *base.params))
        gate = need_choice(t, "gate", vw, (*TIERS, "none")) if "gate" in t else None
        gates = default_gates if gate is None else () if gate == "none" else (gate,)
        engine = {**base.engine, **need_table(t, "engine", vw, {})}
        params = {**base.params, **{k: v for k, v in t.items() if k in base.params}}
        if n == "concurrency":
            lv = need_list(params, "levels", vw, of=int, lo=1)
            if len(lv) < 2:
                raise (vw / "levels").fail(f"expected >= 2 concurrencies >= 1 (the first is the reference), "
                                           f"got {lv!r}")
        if n == "kv_connector":
            need_int(params, "chunk_size", vw, lo=1)
        variants.append(VariantSettings(n, gates, engine, params))
    inverse = need_table(inv, "inverse", where, {}) or {"dtype": "bfloat16"}
    rl = _rl(suite, rl_table, compare) if RL in selected and rl_table is not None else None
    if rl_table is None and "rl_logprobs" in compare:
        raise top.fail("[compare.rl_logprobs] needs an [rl] table (seeds, temperature, top_p, logprobs_mode)")
    if not variants and rl is None:
        raise where.fail(f"nothing to run: no variant selected ({', '.join(selected) or 'none'})")
    return InvarianceSettings(tuple(variants), inverse, need_table(inv, "engine", where, {}), rl)


RL_KEYS = ("seeds", "temperature", "top_p", "top_k", "logprobs_mode", "max_tokens", "trainer", "cases")


def _rl(suite: Any, t: Any, compare: Mapping[str, Any]) -> RLSettings:
    where = Where(suite.path, ("rl",), InvarianceError)
    t = check_table(t, where)
    if "rl_logprobs" not in compare:
        raise where.fail("needs [compare.rl_logprobs] (its bars judge the rollouts)")
    check_keys(t, where, RL_KEYS)
    seeds = need_list(t, "seeds", where, [1], of=int)
    temp = need_number(t, "temperature", where, 1.0, lo=0, lo_open=True, hint=" (rollouts sample)")
    top_p = need_number(t, "top_p", where, 1.0, lo=0, hi=1, lo_open=True)
    top_k = need_int(t, "top_k", where, 0, lo=0, hint=" (0: off)")
    mode = need_choice(t, "logprobs_mode", where, LOGPROBS_MODES, "processed_logprobs",
                       hint=" (vLLM's raw_logits/processed_logits are not logprobs)")
    mt = need_int(t, "max_tokens", where, suite.sampling.max_tokens, lo=1)
    trainer = need_str(t, "trainer", where, "hf")
    ids = {c.id for c in suite.cases}
    cases = need_list(t, "cases", where, [], nonempty=False)
    if any(c not in ids for c in cases):
        raise (where / "cases").fail(f"expected a list of case ids of the suite ({', '.join(sorted(ids))}), "
                                     f"got {cases!r}")
    return RLSettings(tuple(seeds), temp, top_p, top_k, mode, mt, trainer, tuple(cases))
