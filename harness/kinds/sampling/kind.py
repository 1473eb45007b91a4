"""``sampling``: does an engine's sampler draw from the distribution its parameters promise?

prepare: the suite's ``[sampling_gate]`` table; the oracle's greedy continuations and raw logits at
the tests' prefixes (the pinned vLLM, one start; ``make sampling`` shares one oracle run between
its candidates); the candidate's runner, made from its spec as in every gate, and its
:class:`~harness.abilities.Sampler` ability (an engine without one is refused, naming those with one)
with its documented chain; the tests, each with its reference and its number of draws
(:mod:`harness.kinds.sampling.plan`).
run: the candidate draws, in one engine start — every test, then the determinism lanes.
judge: support checks, fits under Holm, determinism, logprobs (:mod:`harness.kinds.sampling.judge`);
the planted samplers through the same judge, with the power stated against each, and the correct
double's false-positive rate (:mod:`harness.kinds.sampling.doubles`).

A parameter the engine does not have (transformers' presence penalty) gives ``refused`` verdicts
and stays out of the gates: the record judges what the engine offers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.abilities import Sampler, SamplerTraits, Samples
from harness.api import EngineFailed, EngineInfo, EngineRefused, Runner, Verdict, failure_verdicts
from harness.engines import RunnerContext, make_runner
from harness.excerpt import first_line
from harness.kinds.base import GateRequest, Judgement, engine_info, register_kind, say
from harness.kinds.sampling.settings import GateSettings, gate_settings
from harness.sampling.transforms import CHAINS
from harness.staleness import reference_reasons
from harness.workspace import Workspace

if TYPE_CHECKING:  # the statistics (scipy) load when a sampling gate runs, not with the kinds
    from harness.kinds.sampling.draws import OracleRows
    from harness.kinds.sampling.plan import Plan

SAMPLING_ENGINES = ("vllm", "hf", "llamacpp", "openai:<url>", "vllm-server")
"""The engines whose runner has the :class:`~harness.abilities.Sampler` ability (named in a refusal)."""
CONCURRENCY = 8
"""Requests in flight for an engine that takes several (a server), unless the gate names one."""


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    gs: GateSettings
    rows: tuple[OracleRows, ...]
    oracle: Mapping[str, Any]
    runner: Runner | None
    traits: SamplerTraits | None
    plan: Plan | None
    failure: tuple[str, str] | None = None
    """(``refused``|``error``, reason) when the candidate cannot draw (no runner, no sampler)."""


@dataclass(frozen=True, slots=True, eq=False)
class Ran:
    results: Mapping[str, Mapping[str, Samples]] = field(default_factory=dict)
    info: EngineInfo | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    failure: tuple[str, str, str] | None = None
    """(``refused``|``error``, reason, log tail)."""



class SamplingKind:
    name = "sampling"
    default_candidate = "vllm"
    tables = ("sampling_gate",)
    stale = staticmethod(reference_reasons)
    """The oracle ran beside the candidate (``rec.oracle``: its spec and version), as in an A/B."""

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        gs = gate_settings(req.suite)
        given = req.options.get("oracle")
        if given is None:
            say(req, f"oracle: the pinned vLLM, greedy + raw logits for {len(req.suite.cases)} cases")
            from harness.kinds.sampling.oracle import oracle_rows

            rows, prov = oracle_rows(ws, req.model, req.suite, gs)
        else:
            rows, prov = given
        ctx = RunnerContext(run_dir=ws.runs, name=req.candidate, concurrency=req.concurrency or CONCURRENCY)
        runner = None
        try:
            runner = req.runner or make_runner(req.candidate, req.model, ctx)
            if not isinstance(runner, Sampler):
                raise EngineRefused(
                    f"{req.candidate}: this engine cannot draw with its own sampler (its runner has no "
                    f"Sampler ability); engines that can: {', '.join(SAMPLING_ENGINES)}"
                )
            traits = runner.sampler_traits()
        except EngineRefused as e:
            return Prepared(gs, tuple(rows), prov, runner, None, None, ("refused", str(e)))
        from harness.kinds.sampling.plan import make_plan

        plan = make_plan(rows, gs, traits.chain, traits.unsupported)
        return Prepared(gs, tuple(rows), prov, runner, traits, plan)

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> Ran:
        s, plan, traits = prepared.runner, prepared.plan, prepared.traits
        if not isinstance(s, Sampler) or plan is None or traits is None:
            return Ran()
        lanes = ("repeat", "alone") if traits.seed_scope == "request" else ("repeat",)
        say(req, f"{req.candidate}: {plan.total_draws} draws over {len(plan.tests)} tests, "
                  f"lanes {', '.join(lanes)}")
        t0 = time.perf_counter()
        try:  # no start: the engine starts what its draws need (the Sampler ability's contract)
            results = s.sample(plan.passes(lanes))
            facts = s.facts()
            return Ran(
                results, s.info(), {**dict(facts.timings), "candidate_wall_s": time.perf_counter() - t0}
            )
        except EngineRefused as e:
            return Ran(failure=("refused", str(e), ""))
        except EngineFailed as e:
            return Ran(failure=("error", str(e), e.log_tail))
        finally:
            s.close()

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared, ran: Ran) -> Judgement:
        from harness.kinds.sampling import doubles, judge

        plan, decode = prepared.plan, req.model.decode
        oracle = {"role": "reference distribution", **dict(prepared.oracle)}
        failure = prepared.failure or (ran.failure[:2] if ran.failure else None)
        if failure is not None or plan is None or prepared.traits is None:
            status, reason = failure or ("error", "no sampling plan")
            tail = ran.failure[2] if ran.failure else ""
            info = engine_info(prepared.runner, req.candidate)
            names = sorted({f"sampling.{s.param}" for s in prepared.gs.settings})
            vs = tuple(failure_verdicts(names, ["all"], status, reason, tail))  # type: ignore[arg-type]
            return Judgement(
                label=req.candidate,
                candidate=info,
                verdicts=vs,
                gates=tuple(names),
                controls=(),
                summary=f"{req.suite.name}: {req.candidate} {status}: {first_line(reason)}",
                extra={"engine_refused": reason} if status == "refused" else {},
                reference=oracle,
            )
        traits = prepared.traits
        t0 = time.perf_counter()
        verdicts, outs, rejected = judge.verdicts(plan, ran.results, traits, decode)
        t_judge = time.perf_counter() - t0
        say(
            req,
            f"{req.candidate}: judged; running the planted samplers and "
            f"{prepared.gs.control_repetitions} repetitions of the correct one",
        )
        t0 = time.perf_counter()
        controls, facts = doubles.controls(plan, traits, decode)
        t_controls = time.perf_counter() - t0
        gated = [v for v in verdicts if v.status != "refused" or v.comparator in (judge.SEED, judge.LOGPROBS)]
        gates = tuple(dict.fromkeys(v.comparator for v in gated))
        draws = plan.total_draws
        det = sum(r.n for p in plan.passes() for r in p.requests if r.key.endswith("#det"))
        wall = float(ran.timings.get("sample_wall_s") or ran.timings.get("candidate_wall_s") or 0.0)
        extra = {
            "sampling": {
                "chain": CHAINS.get(traits.chain).to_json(),
                "traits": {
                    "chain": traits.chain,
                    "logprobs_mode": traits.logprobs_mode,
                    "seed_scope": traits.seed_scope,
                    "unsupported": dict(traits.unsupported),
                },
                "gate": prepared.gs.to_json(),
                "fits": sum(t.runs for t in plan.tests),
                "level": plan.level,
                "budget": {
                    "draws": draws,
                    "determinism_draws": det,
                    "wall_s": wall,
                    "draws_per_s": draws / wall if wall else None,
                },
                **judge.summary(outs, rejected, decode),
                "planted": {k: v for k, v in facts.items() if k != "false_positive"},
                "control_sites": [x.to_json() for x in plan.sites],
                "false_positive": facts.get("false_positive", {}),
                "skipped_cases": list(plan.skipped),
                "passed_over": list(plan.passed_over),
            }
        }
        timings = {
            **{k: float(v) for k, v in ran.timings.items()},
            "judge_s": t_judge,
            "controls_s": t_controls,
            **{f"oracle_{k}": float(v) for k, v in (prepared.oracle.get("timings") or {}).items()},
        }
        info = ran.info or engine_info(prepared.runner, req.candidate)
        return Judgement(
            label=req.candidate,
            candidate=info,
            verdicts=tuple(verdicts),
            gates=gates,
            controls=tuple(controls),
            summary=_summary(req.suite.name, verdicts, extra["sampling"]),
            timings=timings,
            extra=extra,
            reference=oracle,
        )



def _summary(suite: str, verdicts: list[Verdict], facts: Mapping[str, Any]) -> str:
    from harness.kinds.sampling import judge

    tests = [v for v in verdicts if v.comparator not in (judge.SEED, judge.LOGPROBS)]
    judged = [v for v in tests if v.status in ("pass", "fail")]
    fails = [v for v in judged if v.status == "fail"]
    refused = sorted({v.comparator.partition(".")[2] for v in tests if v.status == "refused"})
    seed = [v for v in verdicts if v.comparator == judge.SEED and v.status in ("pass", "fail")]
    lp = [v for v in verdicts if v.comparator == judge.LOGPROBS and v.status in ("pass", "fail")]
    fp = facts.get("false_positive") or {}
    text = (
        f"{suite}: {len(judged) - len(fails)}/{len(judged)} tests pass (Holm, alpha "
        f"{facts['gate']['alpha']:g}, {facts['fits']} fits)"
    )
    if fails:
        text += f"; FAIL {', '.join(sorted({v.comparator.partition('.')[2] for v in fails}))}"
    if refused:
        text += f"; refused {', '.join(refused)}"
    if seed:
        text += f"; seed {sum(v.status == 'pass' for v in seed)}/{len(seed)} lanes"
    if lp:
        text += f"; {facts['traits']['logprobs_mode']} {sum(v.status == 'pass' for v in lp)}/{len(lp)}"
    text += f"; {facts['budget']['draws']} draws"
    if fp.get("repetitions"):
        text += f"; correct double {fp['failures']}/{fp['repetitions']} false positives"
    return text


register_kind(SamplingKind(), help="sampler parity: support, goodness of fit, determinism, logprobs")
