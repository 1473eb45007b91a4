"""Engine results -> each variant's pairs (reference output, variant output), with the evidence that
the variant really happened: cached tokens for a warm cache or a restored prefix, preemptions for
a small KV pool, drafted tokens for speculative decoding, prompts longer than the token budget for
chunked prefill. A variant whose engine refused or crashed carries that instead of pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.api import Case, Output
from harness.kinds.invariance.plan import (
    ALONE,
    BASE,
    INVERSE,
    KV_RESTORE,
    PC_COLD,
    PC_SHARED,
    PC_WARM,
    REF_LANE,
    SERVER,
    TOGETHER,
    Plan,
)
from harness.kinds.invariance.run import GroupResult
from harness.kinds.invariance.settings import InvarianceSettings
from harness.kinds.invariance.tiers import Pair, prefill_choice


@dataclass(frozen=True, slots=True, eq=False)
class VariantRun:
    name: str
    engines: tuple[str, ...]
    """The engine groups it read (reference first)."""
    pairs: tuple[Pair, ...] = ()
    failure: tuple[str, str, str] | None = None
    """(``refused``|``error``, reason, log tail) when an engine it needs did not run."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """Variant-level facts (counters, budgets, hit counts)."""
    inverse: tuple[Pair, ...] = ()
    """Its references against the inverse engine's outputs of the same prompts."""


def _failure(results: Mapping[str, GroupResult], keys: Sequence[str]) -> tuple[str, str, str] | None:
    for k in keys:
        r = results.get(k)
        if r is None:
            return ("error", f"the {k} engine did not run", "")
        if not r.ok:
            status = r.status if r.status in ("refused", "error") else "error"
            reason = r.reason if k == keys[-1] else f"the reference ({k}) engine: {status}: {r.reason}"
            return (status, reason, r.log_tail)
    return None


def _inverse(results: Mapping[str, GroupResult], refs: Sequence[tuple[Case, Output, str]]
             ) -> tuple[Pair, ...]:
    inv = results.get(INVERSE)
    if inv is None or not inv.ok:
        return ()
    return tuple(Pair(case, ref, inv.output(TOGETHER, base_id)) for case, ref, base_id in refs)


def _with_id(case: Case, cid: str) -> Case:
    return Case(cid, case.prompt_ids, case.prompt_text, case.tags)


def _simple(name: str, plan: Plan, results: Mapping[str, GroupResult], ref: tuple[str, str],
            cand: tuple[str, str], facts: Callable[[Case], dict[str, Any]] | None = None,
            evidence: Mapping[str, Any] | None = None, not_evidence: str | None = None) -> VariantRun:
    """Every case: (reference group, pass) against (variant group, pass), same request key."""
    engines = tuple(dict.fromkeys((ref[0], cand[0])))
    fail = _failure(results, engines)
    if fail is not None:
        return VariantRun(name, engines, failure=fail)
    r, c = results[ref[0]], results[cand[0]]
    pairs, refs = [], []
    for case in plan.cases:
        o = r.output(ref[1], case.id)
        pairs.append(Pair(case, o, c.output(cand[1], case.id), facts(case) if facts else {}, not_evidence))
        refs.append((case, o, case.id))
    return VariantRun(name, engines, tuple(pairs), None, dict(evidence or {}), _inverse(results, refs))


def batch(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    return _simple("batch", plan, results, (BASE, ALONE), (BASE, TOGETHER),
                   evidence={"batch_size": len(plan.cases)})


def chunked_prefill(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    v = s.variant("chunked_prefill")
    assert v is not None
    budget = int(v.engine.get("max_num_batched_tokens", 0) or 0)
    long = [c.id for c in plan.cases if budget and len(c.prompt_ids) > budget]
    why = None if long else (f"no prompt is longer than the token budget {budget}: no prefill was chunked")
    return _simple("chunked_prefill", plan, results, (BASE, TOGETHER), ("chunked_prefill", TOGETHER),
                   facts=lambda c: {"prompt_len": len(c.prompt_ids),
                                    "prefill_chunked": len(c.prompt_ids) > budget},
                   evidence={"max_num_batched_tokens": budget, "prompts_chunked": len(long)},
                   not_evidence=why)


def _counter(results: Mapping[str, GroupResult], group: str, name: str) -> float | None:
    r = results.get(group)
    if r is None or not r.ok:
        return None
    c = r.counters.get(TOGETHER) or {}
    v = c.get(name)
    return float(v) if isinstance(v, int | float) else None


def preemption(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    n = _counter(results, "preemption", "vllm:num_preemptions")
    r = results.get("preemption")
    unreadable = (r.counters.get(TOGETHER) or {}).get("unreadable") if r is not None and r.ok else None
    why = (f"vLLM's counters could not be read ({unreadable}): preemption unproven" if unreadable else
           "the engine never preempted (vllm:num_preemptions 0): the KV pool was not small enough"
           if not n else None)
    ev = {"num_preemptions": n, "num_gpu_blocks": (r.meta.get("num_gpu_blocks") if r is not None else None),
          "block_size": (r.meta.get("block_size") if r is not None else None)}
    return _simple("preemption", plan, results, (BASE, TOGETHER), ("preemption", TOGETHER), evidence=ev,
                   not_evidence=why)


def spec_decode(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    drafts = _counter(results, "spec_decode", "vllm:spec_decode_num_draft_tokens")
    accepted = _counter(results, "spec_decode", "vllm:spec_decode_num_accepted_tokens")
    why = None if drafts else ("no token was drafted (vllm:spec_decode_num_draft_tokens 0): nothing was "
                               "speculated")
    ev = {"draft_tokens": drafts, "accepted_tokens": accepted,
          "acceptance_rate": (accepted / drafts) if drafts and accepted is not None else None}
    return _simple("spec_decode", plan, results, (BASE, TOGETHER), ("spec_decode", TOGETHER), evidence=ev,
                   not_evidence=why)


def decode_prefill(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    from harness.kinds.invariance.tiers import all_positions

    fail = _failure(results, (BASE,))
    if fail is not None:
        return VariantRun("decode_prefill", (BASE,), failure=fail)
    base = results[BASE]
    scores = base.scores.get(TOGETHER, {})
    pairs, refs = [], []
    for case in plan.cases:
        dec = base.output(TOGETHER, case.id)
        sc = scores.get(case.id)
        cand = (prefill_choice(sc, case.id) if sc is not None
                else Output(case.id, (), error="no prefill score"))
        pairs.append(Pair(case, dec, cand, all_positions(dec, sc) if sc is not None else {}))
        refs.append((case, dec, case.id))
    inv = results.get(INVERSE)
    inverse: tuple[Pair, ...] = ()
    if inv is not None and inv.ok:
        inverse = tuple(Pair(case, dec, prefill_choice(inv.scores.get(TOGETHER, {}).get(bid) or Output(
            bid, (), error="the inverse engine returned no prefill score"), bid)) for case, dec, bid in refs)
    return VariantRun("decode_prefill", (BASE,), tuple(pairs), None,
                      {"how": "prefill = one forward pass over prompt + generation (prompt_logprobs)"},
                      inverse)


def prefix_cache(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    fail = _failure(results, (BASE,))
    if fail is not None:
        return VariantRun("prefix_cache", (BASE,), failure=fail)
    base = results[BASE]
    by_id = {c.id: c for c in plan.cases}
    pairs, refs = [], []
    cold_hits = {k: v for k, v in base.cached.get(PC_COLD, {}).items() if v}
    for case in plan.cases:
        cold = base.output(PC_COLD, case.id)
        hit = base.cached.get(PC_WARM, {}).get(case.id)
        why = (f"the warm pass hit no cached token (prompt {len(case.prompt_ids)} tokens; only whole "
               f"blocks are cached)" if not hit else None)
        pairs.append(Pair(case, cold, base.output(PC_WARM, case.id),
                          {"num_cached_tokens": hit, "prompt_len": len(case.prompt_ids),
                           "how": "same prompt"},
                          why))
        refs.append((case, cold, case.id))
    for member, donor in plan.shared.items():
        case = by_id[member]
        hit = base.cached.get(PC_SHARED, {}).get(member)
        why = f"no cached token from {donor}'s prefix was hit" if not hit else None
        sid = f"{member}+shared"
        cold = base.output(PC_COLD, member)
        pairs.append(Pair(_with_id(case, sid), cold, base.output(PC_SHARED, member),
                          {"num_cached_tokens": hit, "prompt_len": len(case.prompt_ids),
                           "how": f"prefix shared with {donor}, which ran first"}, why))
        refs.append((_with_id(case, sid), cold, member))
    ev = {"warm_cases_hit": sum(1 for p in pairs if p.not_evidence is None),
          "cold_pass_cached_tokens": sum(cold_hits.values())}
    if cold_hits:  # the cold pass must compute everything, else it is no reference
        why = f"the cold pass itself hit the cache ({cold_hits})"
        pairs = [Pair(p.case, p.reference, p.candidate, p.facts, why) for p in pairs]
    return VariantRun("prefix_cache", (BASE,), tuple(pairs), None, ev, _inverse(results, refs))


def kv_connector(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    key = "kv_connector"
    fail = _failure(results, (key,))
    if fail is not None:
        return VariantRun(key, (key,), failure=fail)
    r = results[key]
    pairs, refs = [], []
    v = s.variant(key)
    chunk = int(v.params["chunk_size"]) if v is not None else 0
    for case in plan.cases:
        hit = r.cached.get(KV_RESTORE, {}).get(case.id)
        ref = r.output(KV_RESTORE, case.id + REF_LANE)
        why = (f"nothing was restored (prompt {len(case.prompt_ids)} tokens, chunk {chunk}: the connector "
               f"restores whole chunks and leaves the last token to compute)" if not hit else None)
        pairs.append(Pair(case, ref, r.output(KV_RESTORE, case.id),
                          {"num_cached_tokens": hit, "prompt_len": len(case.prompt_ids),
                           "ref_lane_cached_tokens": r.cached.get(KV_RESTORE, {}).get(case.id + REF_LANE)},
                          why))
        refs.append((case, ref, case.id))
    ev = {"chunk_size": chunk, "restored_cases": sum(1 for p in pairs if p.not_evidence is None),
          "connector": "HarnessKVConnector (kv_both), lanes clean (served from the store) and ref (reads "
                       "no cache)"}
    return VariantRun(key, (key,), tuple(pairs), None, ev, _inverse(results, refs))


def concurrency(plan: Plan, s: InvarianceSettings, results: Mapping[str, GroupResult]) -> VariantRun:
    v = s.variant("concurrency")
    assert v is not None
    fail = _failure(results, (SERVER,))
    if fail is not None:
        return VariantRun("concurrency", (SERVER,), failure=fail)
    r = results[SERVER]
    levels = [int(x) for x in v.params["levels"]]
    ref_level, others = levels[0], levels[1:]
    pairs, refs = [], []
    for case in plan.cases:
        ref = r.output(f"c{ref_level}", case.id)
        refs.append((case, ref, case.id))
        for c in others:
            pairs.append(Pair(_with_id(case, f"{case.id}@c{c}"), ref, r.output(f"c{c}", case.id),
                              {"concurrency": c, "reference_concurrency": ref_level}))
    return VariantRun("concurrency", (SERVER,), tuple(pairs), None,
                      {"levels": levels, "server_args": r.meta.get("server_args")}, _inverse(results, refs))


PAIRS: Mapping[str, Callable[[Plan, InvarianceSettings, Mapping[str, GroupResult]], VariantRun]] = {
    "batch": batch, "concurrency": concurrency, "prefix_cache": prefix_cache,
    "chunked_prefill": chunked_prefill, "spec_decode": spec_decode, "preemption": preemption,
    "kv_connector": kv_connector, "decode_prefill": decode_prefill}
"""Variant name -> how its pairs are read from the engine results."""
