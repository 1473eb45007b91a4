"""``invariance``: configurations that must not change one token, and trainer-vs-rollout logprobs.

``make invariance MODEL=… [ENGINE=vllm] [VARIANTS=batch,prefix_cache,…]``. One engine family (the
pinned vLLM), a reference configuration and variants that promise to preserve output — batch
composition, concurrency through the OpenAI server, a warm prefix cache, chunked prefill with a
small token budget, speculative decoding, preemption in a tiny KV pool, a prefix restored through
the KV connector, decode vs prefill logprobs — each run on the same workload and judged on two
tiers, bit-exact and near-tie (:mod:`harness.kinds.invariance.tiers`). No goldens: the reference runs
now, beside the variants, in as few engine starts as the configurations allow
(:mod:`harness.kinds.invariance.plan`). With an ``[rl]`` table the engine also samples seeded rollouts and
the trainer (transformers) scores their tokens: per-token |Δ logprob|, importance ratios and a
sequence KL, judged by ``[compare.rl_logprobs]``.

A refused variant (vLLM's own reason) is ``refused`` and does not fail the run; a crash is an
``error``; a variant that did not happen (no cached token hit, no preemption, nothing drafted) is
``skip`` with why. The record says how many engine starts the run used.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness import compare
from harness.api import Case, EngineInfo, Output, Verdict, failure_verdicts
from harness.compare import build
from harness.engines.base import coerce, parse_options, split_spec
from harness.excerpt import INLINE, first_line
from harness.kinds.base import GateRequest, Judgement, register_kind
from harness.kinds.controls import run_controls
from harness.kinds.invariance.pairs import PAIRS, VariantRun
from harness.kinds.invariance.plan import BASE, PC_COLD, RL_GROUP, ROLLOUT, TOGETHER, Plan, make_plan
from harness.kinds.invariance.run import GroupResult, TrainerResult, run_plan, run_trainer
from harness.kinds.invariance.settings import RL, TIERS, VARIANTS, InvarianceSettings, parse, verdict_name
from harness.kinds.invariance.tiers import (
    Tiers,
    fault_controls,
    first_difference,
    inverse_control,
    judge_pairs,
)
from harness.kinds.invariance.trainer import describe, transform
from harness.kinds.kv.config import store_settings
from harness.provenance import now_utc
from harness.records import Control
from harness.staleness import invariance_reasons
from harness.suites import SuiteError
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True)
class Prepared:
    settings: InvarianceSettings
    plan: Plan
    base: Mapping[str, Any]
    run_dir: Path


@dataclass(frozen=True, slots=True, eq=False)
class Ran:
    results: Mapping[str, GroupResult]
    trainer: TrainerResult | None
    timings: Mapping[str, float]


def base_settings(req: GateRequest, s: InvarianceSettings) -> dict[str, Any]:
    """The reference configuration: the harness's vLLM defaults, the suite's ``[invariance] engine``,
    the engine spec's options (``vllm:block_size=64``), and vLLM's counters kept
    (``disable_log_stats`` off: the preemption and speculative-decoding evidence)."""
    from harness.engines.vllm.runner import default_engine_settings

    name, arg = split_spec(req.candidate)
    if name != "vllm":
        raise SuiteError(f"{req.suite.path}: the invariance kind drives the pinned vLLM (ENGINE=vllm or "
                         f"vllm:<options>); {req.candidate!r} is not supported")
    opts = {k: coerce(v) for k, v in parse_options(arg, req.candidate).items()}
    return {**default_engine_settings(req.model), **s.engine, **opts, "disable_log_stats": False}


def _public(v: Any, run_dir: Path) -> Any:
    """Settings as a record may hold them: the run's scratch folder named, not where it lies."""
    if isinstance(v, str):
        return v.replace(str(run_dir), f"<{run_dir.name}>")
    if isinstance(v, Mapping):
        return {k: _public(x, run_dir) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_public(x, run_dir) for x in v]
    return v


class Invariance:
    name = "invariance"
    default_candidate = "vllm"
    stale = staticmethod(invariance_reasons)
    """Records no goldens: the suite version, the model digest, and the engine ran the pin."""
    tables = ("invariance", "rl")

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        s = parse(req.suite, req.options.get("variants"))
        base = base_settings(req, s)
        stamp = now_utc().replace(":", "").replace("-", "")
        name = f"inv-{stamp}-{req.suite.name}-{req.model.slug}-{secrets.token_hex(3)}"
        run_dir = (ws.runs / name).resolve()
        cases = req.suite.build_cases(req.model.encode, req.model.limits)  # a prompt too long is bad input
        n_gen = req.suite.sampling.max_tokens
        for v in s.variants:  # an engine with a shorter context (the preemption pool) must fit every case
            limit = v.engine.get("max_model_len")
            long = [c for c in cases if isinstance(limit, int) and len(c.prompt_ids) + n_gen > limit]
            if long:
                raise SuiteError(f"{req.suite.path} [invariance.{v.name}]: engine max_model_len {limit} is "
                                 f"shorter than case {long[0].id!r} ({len(long[0].prompt_ids)} prompt "
                                 f"tokens + max_tokens {n_gen})")
        store = run_dir / "kv-store"
        plan = make_plan(s, cases, base, lambda settings, chunk: store_settings(settings, chunk, store))
        return Prepared(s, plan, base, run_dir)

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> Ran:
        ran = req.options.get("ran")
        if ran is not None:  # results of engines that already ran (tests)
            return ran
        from harness.engines.vllm.runner import START_TIMEOUT_S

        t0 = time.perf_counter()
        progress = req.options.get("progress")
        results = run_plan(prepared.plan, req.model, req.suite.sampling, prepared.run_dir, START_TIMEOUT_S,
                           progress)
        trainer = None
        rl = prepared.settings.rl
        if rl is not None:
            group = results.get(BASE if ROLLOUT in _passes(prepared.plan, BASE) else RL_GROUP)
            if group is not None and group.ok:
                if progress:
                    progress(f"trainer {rl.trainer}: scoring {len(prepared.plan.rollouts)} rollouts")
                cases = {c.id: c for c in prepared.plan.cases}
                rollouts = {key: (cases[cid], group.output(ROLLOUT, key))
                            for key, (cid, _seed) in prepared.plan.rollouts.items()}
                trainer = run_trainer(rl.trainer, req.model, rollouts,
                                      transform(rl.logprobs_mode, rl.temperature, rl.top_p, rl.top_k),
                                      req.suite.sampling.logprobs, prepared.run_dir / "trainer")
        return Ran(results, trainer, {"run_wall_s": time.perf_counter() - t0})

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared, ran: Ran) -> Judgement:
        s, plan, suite = prepared.settings, prepared.plan, req.suite
        tiers = Tiers(build("bit_exact", {}, req.model.decode),  # type: ignore[arg-type]
                      build("near_tie", suite.params("near_tie"), req.model.decode))  # type: ignore[arg-type]
        inverse_setting = ",".join(f"{k}={v}" for k, v in s.inverse.items())
        verdicts: list[Verdict] = []
        controls: list[Control] = []
        gates: list[str] = []
        refused_gates: list[str] = []
        info: dict[str, Any] = {}
        for v in s.variants:
            vr = PAIRS[v.name](plan, s, ran.results)
            vr = _transformed(vr, req)
            meta = VARIANTS.get(v.name)
            entry: dict[str, Any] = {"title": meta.title, "reference": meta.reference,
                                     "gate": list(v.gates) or "none", "engines": list(vr.engines),
                                     "evidence": dict(vr.evidence)}
            if vr.failure is not None:
                status, reason, tail = vr.failure
                ids = [c.id for c in plan.cases]
                verdicts += failure_verdicts([verdict_name(v.name, t) for t in TIERS], ids, status, reason,
                                             tail)
                entry.update(result=status, reason=reason)
                names = [verdict_name(v.name, t) for t in v.gates]
                (refused_gates if status == "refused" else gates).extend(names)
                info[v.name] = entry
                continue
            vs = judge_pairs(v.name, vr.pairs, tiers)
            if any(p.not_evidence is None for p in vr.pairs):
                # pairs the variant did not touch (a prompt shorter than a cached block) prove nothing
                # either way: listed with their judgement, kept out of the verdicts
                skipped: dict[str, dict[str, Any]] = {}
                for x in vs:
                    if x.status == "skip":
                        d = skipped.setdefault(x.case_id, {"why": x.evidence.get("not_evidence")})
                        d[x.comparator.rpartition(".")[2]] = x.evidence.get("judged")
                if skipped:
                    entry["not_evidence"] = skipped
                vs = [x for x in vs if x.status != "skip"]
            verdicts += vs
            gates += [verdict_name(v.name, t) for t in v.gates]
            evidence_refs = [(p.case, p.reference) for p in vr.pairs if p.not_evidence is None]
            all_refs = [(p.case, p.reference) for p in vr.pairs]
            controls += fault_controls(v.name, evidence_refs or all_refs, tiers)
            inv_group = ran.results.get("inverse")
            why_not = None if inv_group is not None and inv_group.ok else (
                f"the inverse engine ({inverse_setting}) " + (f"{inv_group.status}: {inv_group.reason}"
                                                              if inv_group is not None else "did not run"))
            inv, ctl = inverse_control(v.name, vr.inverse, tiers, inverse_setting, why_not)
            controls.append(ctl)
            entry.update(_tally(v.name, vs), inverse=inv.to_json(),
                         first_difference=first_difference(vs, v.name))
            info[v.name] = entry
        if not gates and refused_gates:
            gates = refused_gates  # every variant was refused: the run is refused, not empty
        rl_extra: dict[str, Any] = {}
        if s.rl is not None:
            rv, rc, rl_extra, rl_gated = self._rl(req, prepared, ran)
            verdicts += rv
            controls += rc
            gates += ["rl_logprobs"] if rl_gated else []
        starts = [k for k, r in ran.results.items() if r.status != "not run"]
        extra = {"invariance": {
            "variants": info, "engine_starts": len(starts) + (1 if ran.trainer is not None else 0),
            "vllm_engine_starts": len(starts), "inverse": inverse_setting,
            "engines": {k: _engine_entry(r, prepared) for k, r in ran.results.items()},
            "repeatability": _repeatability(ran.results, tiers, plan),
            "run_dir": prepared.run_dir.name}}
        if rl_extra:
            extra["rl"] = rl_extra
        timings: dict[str, float] = dict(ran.timings)
        for k, r in ran.results.items():
            timings.update({f"{k}_{t}": float(x) for t, x in r.timings.items()})
        if ran.trainer is not None:
            timings.update({k: float(x) for k, x in ran.trainer.timings.items()})
        version = next((r.version for r in ran.results.values() if r.ok and r.version), "unknown")
        settings = _public(dict(prepared.base), prepared.run_dir)
        cand = EngineInfo(req.candidate, "vllm", version, settings=settings)
        summary = _summary(suite.name, s, info, rl_extra, extra["invariance"]["engine_starts"])
        return Judgement(label=f"inv-{req.candidate}", candidate=cand, verdicts=tuple(verdicts),
                         gates=tuple(dict.fromkeys(gates)), controls=tuple(controls), summary=summary,
                         timings=timings, extra=extra,
                         reference={"role": "reference configuration", "spec": req.candidate,
                                    "engine": "vllm", "version": version, "settings": settings})

    def _rl(self, req: GateRequest, prepared: Prepared, ran: Ran
            ) -> tuple[list[Verdict], list[Control], dict[str, Any], bool]:
        rl = prepared.settings.rl
        assert rl is not None
        spec = req.suite.comparator("rl_logprobs")
        assert spec is not None
        comp = build("rl_logprobs", spec.params, req.model.decode)
        plan = prepared.plan
        group_key = BASE if ROLLOUT in _passes(plan, BASE) else RL_GROUP
        group = ran.results.get(group_key)
        keys = list(plan.rollouts)
        extra: dict[str, Any] = {"seeds": list(rl.seeds), "temperature": rl.temperature, "top_p": rl.top_p,
                                 "top_k": rl.top_k, "max_tokens": rl.max_tokens, "rollout_engine": group_key,
                                 "asked_logprobs_mode": rl.logprobs_mode, "trainer": rl.trainer}
        if group is None or not group.ok:
            status = group.status if group is not None and group.status in ("refused", "error") else "error"
            reason = group.reason if group is not None else f"the {group_key} engine did not run"
            return (failure_verdicts(["rl_logprobs"], keys, status, reason, who="rollout engine"),
                    [], {**extra, "result": status, "reason": reason}, spec.gate and status != "refused")
        returned = str(group.meta.get("logprobs_mode") or "")
        extra["returned_logprobs_mode"] = returned
        extra["mode"] = describe(returned or rl.logprobs_mode, rl.temperature, rl.top_p, rl.top_k)
        rollouts = {k: group.output(ROLLOUT, k) for k in keys}
        by_id = {c.id: c for c in plan.cases}
        cases = [Case(k, by_id[plan.rollouts[k][0]].prompt_ids) for k in keys]
        tr = ran.trainer
        if tr is None or tr.status != "ok" or returned != rl.logprobs_mode:
            why = (f"the engine returned {returned!r} logprobs, the suite asked {rl.logprobs_mode!r}"
                   if tr is not None and tr.status == "ok" else
                   (tr.reason if tr is not None else "the trainer did not run"))
            status = tr.status if tr is not None and tr.status in ("refused", "error") else "error"
            return (failure_verdicts(["rl_logprobs"], keys, status, why),
                    [], {**extra, "result": status, "reason": why}, spec.gate and status != "refused")
        scores = dict(tr.scores)
        if req.transform is not None:
            scores = {o.case_id: o for o in req.transform(list(scores.values()))}
        verdicts = []
        for case in cases:
            cand = scores.get(case.id) or Output(case.id, (), error="the trainer returned no score")
            verdicts.append(comp.compare(rollouts[case.id], cand, case))
        scored = [c for c in cases if c.id in scores]
        pooled = comp.compare_run([rollouts[c.id] for c in scored], [scores[c.id] for c in scored], scored)
        verdicts.append(pooled)
        controls = run_controls(comp, compare.unit("rl_logprobs").controls, cases,
                                {k: o for k, o in rollouts.items() if o.error is None})
        extra.update(trainer_engine=dict(tr.info), pooled=dict(pooled.evidence), result=pooled.status)
        return verdicts, controls, extra, spec.gate


register_kind(Invariance(), help="configurations that must not change one token (bit-exact / near-tie), "
                                  "trainer vs rollout logprobs")


def _passes(plan: Plan, group: str) -> list[str]:
    g = plan.group(group)
    return [p.name for p in g.passes] if g is not None else []


def _transformed(vr: VariantRun, req: GateRequest) -> VariantRun:
    """The variant's outputs rewritten by the request's transform (planted faults in tests)."""
    if req.transform is None or not vr.pairs:
        return vr
    cands = req.transform([p.candidate for p in vr.pairs])
    return replace(vr, pairs=tuple(replace(p, candidate=c) for p, c in zip(vr.pairs, cands, strict=True)))


def _tally(variant: str, vs: Sequence[Verdict]) -> dict[str, Any]:
    """Counts per tier and the tier the variant reached: bit_exact, near_tie, none, or not evidence."""
    out: dict[str, Any] = {}
    for tier in TIERS:
        mine = [v for v in vs if v.comparator == verdict_name(variant, tier)]
        out[tier] = {s: sum(v.status == s for v in mine) for s in ("pass", "fail", "error", "skip")
                     if any(v.status == s for v in mine)}
    judged = [v for v in vs if v.status != "skip"]
    if not judged:
        out["result"] = "not evidence"
    elif all(v.status == "pass" for v in judged):
        out["result"] = "bit_exact"
    elif all(v.status == "pass" for v in judged if v.comparator == verdict_name(variant, "near_tie")):
        out["result"] = "near_tie"
    elif any(v.status == "error" for v in judged):
        out["result"] = "error"
    else:
        out["result"] = "neither"
    return out


def _engine_entry(r: GroupResult, prepared: Prepared) -> dict[str, Any]:
    g = prepared.plan.group(r.key)
    changed = {k: v for k, v in r.settings.items() if prepared.base.get(k, object()) != v}
    removed = sorted(k for k in prepared.base if k not in r.settings)
    return {"serves": list(g.serves) if g is not None else [], "status": r.status,
            **({"reason": r.reason} if r.reason else {}), "version": r.version,
            "settings_vs_base": _public(changed, prepared.run_dir),
            **({"without": removed} if removed else {}),
            "passes": [p.name for p in g.passes] if g is not None else [],
            "levels": list(g.levels) if g is not None else [],
            "engine_start_s": r.timings.get("engine_start_s"), "wall_s": r.timings.get("wall_s"),
            "counters": {p: dict(c) for p, c in r.counters.items() if any(c.values())},
            "logprobs_mode": r.meta.get("logprobs_mode"), "num_gpu_blocks": r.meta.get("num_gpu_blocks")}


def _repeatability(results: Mapping[str, GroupResult], tiers: Tiers, plan: Plan) -> dict[str, Any] | None:
    """The same configuration twice in one engine (all prompts together, then again after a cache
    reset): the floor under every bit-exact claim."""
    base = results.get(BASE)
    if base is None or not base.ok or TOGETHER not in base.outputs or PC_COLD not in base.outputs:
        return None
    n = sum(tiers.exact.compare(base.output(TOGETHER, c.id), base.output(PC_COLD, c.id), c).status == "pass"
            for c in plan.cases)
    return {"passes": [TOGETHER, PC_COLD], "bit_exact": f"{n}/{len(plan.cases)}"}


def _summary(suite: str, s: InvarianceSettings, info: Mapping[str, Any], rl: Mapping[str, Any],
             starts: int) -> str:
    parts = []
    for v in s.variants:
        e = info.get(v.name, {})
        res = e.get("result")
        if res in ("refused", "error"):
            parts.append(f"{v.name} {res.upper()} ({first_line(str(e.get('reason', '')), INLINE)})")
            continue
        be, nt = e.get("bit_exact", {}), e.get("near_tie", {})
        n = sum(be.values())
        word = {"bit_exact": "bit-exact", "near_tie": "near-tie only", "neither": "FAIL", "error": "ERROR",
                "not evidence": "not evidence"}.get(str(res), str(res))
        parts.append(f"{v.name} {word} (bit-exact {be.get('pass', 0)}/{n}, near-tie {nt.get('pass', 0)}/{n}"
                     + (f", {be['skip']} not evidence" if be.get("skip") else "") + ")")
    if rl:
        p = rl.get("pooled") or {}
        if p.get("tokens"):
            parts.append(f"{RL} {rl.get('result')}: |Δ| mean {p['mean_abs_delta']:.2e} "
                         f"max {p['max_abs_delta']:.2e}, ratio outside {100 * p['ratio_outside']:.1f}%, "
                         f"seq KL {p['seq_kl_k3']:.2e}")
        else:
            why = first_line(str(rl.get("reason") or ""), INLINE)
            parts.append(f"{RL} {str(rl.get('result', '')).upper()} ({why})")
    return f"{suite}: " + "; ".join(parts) + f" — {starts} engine starts"
