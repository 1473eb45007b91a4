"""Variants -> engines: one engine start per distinct configuration, every pass it serves in it.

Engine start dominates (40-200 s on 2 CPU cores; a pass takes seconds), so the plan groups the
variants by the engine configuration they need:

==============  =====================================================================================
``base``        the reference configuration (the harness defaults, vLLM's prefix caching on): each
                prompt alone; all prompts together (rescored by prefill for ``decode_prefill``);
                cold and warm prefix-cache passes; the rollouts when their logprob mode is vLLM's
                default
``chunked_prefill``, ``spec_decode``, ``preemption``  the base configuration with the variant's
                change, all prompts together
``kv_connector`` the harness KV store in both roles (prefix caching off): the prompts once to store
                their pages, then again served from the store (``clean`` lane) beside the same
                prompts reading no cache (``ref`` lane), in one batch
``inverse``     the base configuration with the inverse control's change (``dtype=bfloat16``): all
                prompts together, and the base engine's sequences rescored
``rl``          the base configuration in the rollout's ``logprobs_mode``, when it is not the base's
server          ``concurrency``: one OpenAI server (prefix caching off), the prompts at each level
==============  =====================================================================================

Every request that is not about the prefix cache skips reading it (``skip_reading_prefix_cache``),
so what one pass leaves in the cache cannot serve another; the evidence checks below confirm it
(``num_cached_tokens`` 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.api import Case
from harness.engines.vllm.passes import Group, Pass, Request
from harness.kinds.invariance.settings import InvarianceSettings

# pass names
ALONE, TOGETHER, PC_COLD, PC_WARM, PC_DONORS, PC_SHARED = (
    "alone", "together", "pc_cold", "pc_warm", "pc_donors", "pc_shared")
ROLLOUT, KV_WRITE, KV_RESTORE = "rollout", "kv_write", "kv_restore"
BASE, INVERSE, RL_GROUP, SERVER = "base", "inverse", "rl", "server"
REF_LANE = "@ref"
"""Suffix of a KV-connector request key in the ``ref`` lane (reads no cache)."""
SHARED_TAG = "prefix:"
"""A case tagged ``prefix:<group>`` shares its prompt prefix with the other cases of the group: the
first one warms the cache, the others are judged warm against their cold runs."""


@dataclass(frozen=True, slots=True)
class Plan:
    cases: tuple[Case, ...]
    groups: tuple[Group, ...]
    rollouts: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    """Rollout request key -> (case id, seed)."""
    shared: Mapping[str, str] = field(default_factory=dict)
    """Case id -> the donor case whose prefix warms the cache for it."""

    def group(self, key: str) -> Group | None:
        return next((g for g in self.groups if g.key == key), None)


def shared_groups(cases: Sequence[Case]) -> dict[str, str]:
    """Case id -> donor case id, for every case tagged ``prefix:<g>`` after the first of its group."""
    first: dict[str, str] = {}
    out = {}
    for c in cases:
        for tag in c.tags:
            if tag.startswith(SHARED_TAG):
                g = tag[len(SHARED_TAG):]
                if g in first:
                    out[c.id] = first[g]
                else:
                    first[g] = c.id
    return out


def rollout_key(case_id: str, seed: int) -> str:
    return f"{case_id}#s{seed}"


KVStore = Callable[[Mapping[str, Any], int], dict[str, Any]]
"""(base configuration, chunk size) -> that configuration with the harness KV store as producer and
consumer at once (:func:`harness.kinds.kv.config.store_settings`; the gate kind binds the store's folder,
so this package never imports :mod:`harness.kinds.kv`, which uses it)."""


def make_plan(s: InvarianceSettings, cases: Sequence[Case], base: Mapping[str, Any],
              kv_store: KVStore) -> Plan:
    """The engine starts of a run. ``base``: the reference configuration's ``LLM`` kwargs;
    ``kv_store``: the KV connector variant's configuration."""
    names = {v.name for v in s.variants}
    main = tuple(Request(c.id, c.prompt_ids) for c in cases)
    donors_of = shared_groups(cases)
    base_passes: list[Pass] = []
    if "batch" in names:
        base_passes.append(Pass(ALONE, main, mode="alone"))
    if names & {"batch", "decode_prefill", "chunked_prefill", "spec_decode", "preemption"}:
        base_passes.append(Pass(TOGETHER, main, score_own="decode_prefill" in names))
    if "prefix_cache" in names:
        warm = tuple(Request(r.key, r.prompt_ids, skip_reading=False) for r in main)
        base_passes += [Pass(PC_COLD, main, reset_prefix_cache=True), Pass(PC_WARM, warm)]
        if donors_of:
            by_id = {c.id: c for c in cases}
            donors = tuple(dict.fromkeys(donors_of.values()))
            base_passes += [
                Pass(PC_DONORS, tuple(Request(d, by_id[d].prompt_ids, skip_reading=False) for d in donors),
                     reset_prefix_cache=True),
                Pass(PC_SHARED, tuple(Request(m, by_id[m].prompt_ids, skip_reading=False)
                                      for m in donors_of))]
    groups: list[Group] = []
    rollouts: dict[str, tuple[str, int]] = {}
    rl_pass = None
    if s.rl is not None:
        rl = s.rl
        sampling: dict[str, Any] = {"temperature": rl.temperature, "top_p": rl.top_p,
                                    "max_tokens": rl.max_tokens}
        if rl.top_k:
            sampling["top_k"] = rl.top_k
        reqs = []
        for c in cases:
            if rl.cases and c.id not in rl.cases:
                continue
            for seed in rl.seeds:
                key = rollout_key(c.id, seed)
                rollouts[key] = (c.id, seed)
                reqs.append(Request(key, c.prompt_ids, sampling={**sampling, "seed": seed}))
        rl_pass = Pass(ROLLOUT, tuple(reqs))
        if rl.logprobs_mode == str(base.get("logprobs_mode", "raw_logprobs")):
            base_passes.append(rl_pass)
    base_serves = tuple(n for n in ("batch", "prefix_cache", "decode_prefill", "chunked_prefill",
                                    "spec_decode", "preemption") if n in names)
    if base_passes:
        rl_here = s.rl is not None and rl_pass in base_passes
        groups.append(Group(BASE, dict(base), tuple(base_passes),
                            base_serves + (("rl",) if rl_here else ())))
    for n in ("chunked_prefill", "spec_decode", "preemption"):
        v = s.variant(n)
        if v is not None:
            groups.append(Group(n, {**base, **v.engine}, (Pass(TOGETHER, main),), (n,)))
    kv = s.variant("kv_connector")
    if kv is not None:
        groups.append(Group("kv_connector", kv_store(base, int(kv.params["chunk_size"])),
                            kv_passes(cases), ("kv_connector",)))
    if s.rl is not None and rl_pass is not None and rl_pass not in base_passes:
        groups.append(Group(RL_GROUP, {**base, "logprobs_mode": s.rl.logprobs_mode}, (rl_pass,), ("rl",)))
    conc = s.variant("concurrency")
    if conc is not None:
        settings = {k: v for k, v in {**base, **conc.engine}.items()
                    if k not in ("enable_prefix_caching", "disable_log_stats")}
        groups.append(Group(SERVER, {**settings, "no_enable_prefix_caching": True}, (),
                            ("concurrency",), tuple(int(x) for x in conc.params["levels"])))
    if s.variants:
        score = (BASE, TOGETHER) if "decode_prefill" in names else None
        groups.append(Group(INVERSE, {**base, **s.inverse}, (Pass(TOGETHER, main, score_from=score),),
                            tuple(v.name for v in s.variants)))
    return Plan(tuple(cases), tuple(groups), rollouts, donors_of)


def kv_passes(cases: Sequence[Case]) -> tuple[Pass, ...]:
    """Store every prompt's pages, then the prompts again: served from the store (``clean``) and
    reading no cache (``ref``, passive), in one batch."""
    tag = lambda c, lane, **kw: {"case": c.id, "lane": lane, "capture": False, **kw}  # noqa: E731
    clean = tuple(Request(c.id, c.prompt_ids, skip_reading=False, harness_kv=tag(c, "clean")) for c in cases)
    write, restore = clean, clean
    ref = tuple(Request(c.id + REF_LANE, c.prompt_ids, harness_kv=tag(c, "ref", passive=True)) for c in cases)
    return (Pass(KV_WRITE, write), Pass(KV_RESTORE, restore + ref))
