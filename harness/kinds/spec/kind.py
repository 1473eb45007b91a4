"""``spec``: speculative decoding keeps the target's output — token for token under greedy decoding,
the target's distribution under sampling — with acceptance recorded per run.

``make spec MODEL=… [SUITE=spec] [CONTROL=accept_all|draft_dist|bonus_shift]
[CANDIDATE=vllm:repair=expand]``.
prepare: the suite's ``[spec]`` table and cases. run: two starts of the pinned vLLM
(:mod:`harness.kinds.spec.run`): the reference without speculation, the candidate with the suite's
``speculative_config`` (and the planted control). judge: :mod:`harness.kinds.spec.judge`; the
in-memory controls (a lossy double and the reference itself through the same fit); acceptance from
vLLM's counters beside the schedule replayed by the host (:mod:`harness.kinds.spec.drafts`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.api import Case, EngineInfo, Verdict, failure_verdicts
from harness.engines.base import split_spec
from harness.excerpt import first_line
from harness.kinds.base import GateRequest, Judgement, register_kind, say
from harness.kinds.spec.settings import SpecSettings, parse
from harness.provenance import now_utc
from harness.records import GOLDEN_CHECK, Control
from harness.staleness import invariance_reasons
from harness.suites import SuiteError
from harness.workspace import Workspace

if TYPE_CHECKING:  # the statistics (scipy) load when a spec gate judges, not with the kinds
    from harness.kinds.spec import judge as J

CONTROLS = ("accept_all", "draft_dist", "bonus_shift")
FAMILIES = {"vllm": "vllm", "hf": "transformers", "llamacpp": "llama.cpp"}
"""The candidate families the gate drives -> their engine's name."""


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    s: SpecSettings
    cases: tuple[Case, ...]
    sampled: tuple[Case, ...]
    run_dir: Path
    control: str | None
    draw_cap: int | None = None
    """``DRAWS=``: the run's cap below the suite's ``max_draws`` (None: the suite's)."""
    repair: str | None = None
    """``vllm:repair=NAME``: a located engine defect put right in the worker (``REPAIRS``)."""


@dataclass(frozen=True, slots=True, eq=False)
class Ran:
    ref: Any = None
    cand: Any = None
    tests: tuple[J.Test, ...] = ()
    plan: dict[tuple[str, float, int], int] = field(default_factory=dict)
    chosen: tuple[str, ...] = ()
    attributed: bool = False
    predicted: dict[str, int] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


class SpecKind:
    name = "spec"
    default_candidate = "vllm"
    tables = ("spec",)
    stale = staticmethod(invariance_reasons)
    """No goldens: the suite version, the model digest, and the engine ran the pin."""

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        s = parse(req.suite)
        name, arg = split_spec(req.candidate)
        fix = _repair(req.candidate, name, arg)
        if name not in FAMILIES or (arg and fix is None):
            raise SuiteError(
                f"{req.suite.path}: the spec kind drives the pinned vLLM offline (CANDIDATE=vllm), "
                "transformers' assisted generation (CANDIDATE=hf) or llama-cpp-python's prompt lookup "
                f"(CANDIDATE=llamacpp); {req.candidate!r} is not supported"
            )
        control = req.options.get("control") or None
        if control is not None and name != "vllm":
            raise SuiteError(f"CONTROL={control!r}: the planted controls live in vLLM's rejection sampler")
        if name != "vllm":  # assisted generation and Llama.generate take one sequence at a time
            s = replace(s, concurrency=(1,))
        if control is not None and control not in CONTROLS:
            raise SuiteError(f"CONTROL={control!r}: valid planted controls are {', '.join(CONTROLS)}")
        cap = req.options.get("max_draws")
        s = with_draw_cap(s, cap)
        cases = tuple(req.suite.build_cases(req.model.encode, req.model.limits))
        sampled = tuple(c for c in cases if s.sampled_tag in c.tags)
        stamp = now_utc().replace(":", "").replace("-", "")
        run_dir = (ws.runs / f"spec-{stamp}-{req.model.slug}-{secrets.token_hex(3)}").resolve()
        return Prepared(s, cases, sampled, run_dir, control, cap, fix)

    def run(self, ws: Workspace, req: GateRequest, p: Prepared) -> Ran:
        from harness.engines.vllm.runner import default_engine_settings
        from harness.kinds.spec import run as R
        from harness.kinds.spec.drafts import counts, drafter_for

        family = split_spec(req.candidate)[0]
        base = (
            {**default_engine_settings(req.model), "disable_log_stats": False}
            if family != "llamacpp"
            else {"gguf": "f32", "n_ctx": 512}
        )
        t0 = time.perf_counter()
        say(
            req,
            f"reference: {family} without speculation, {len(p.cases)} cases greedy, rows of {len(p.sampled)}",
            echo="spec",
        )
        ref = R.start(
            "reference",
            req.model,
            {**base, "max_logprobs": -1},
            R.reference_passes(
                p.cases, p.sampled, p.s, req.suite.sampling.max_tokens, max(1, req.suite.sampling.logprobs)
            ),
            p.run_dir,
            family=family,
        )
        timings = {"reference_wall_s": R.wall(t0)}
        if ref.status != "ok":
            return Ran(ref=ref, timings=timings)
        # the host replays the schedule with the engine's own lookup (vLLM's, llama-cpp-python's)
        propose = drafter_for(p.s.speculative_config, int(base.get("max_model_len") or 0), family)
        rows = R.load_rows(ref)
        chosen = R.choose(p.sampled, rows, p.s, propose)
        tests = R.tests_for(chosen, rows, p.s, propose)
        plan = R.plan_draws(tests, rows, p.s)
        engine = {**base, "speculative_config": _drafter_config(ws, p.s.speculative_config)}
        say(
            req,
            f"candidate: {p.s.method}"
            + (f" + control {p.control}" if p.control else "")
            + (f" + repair {p.repair}" if p.repair else "")
            + f", {sum(plan.values())} draws over {len(tests)} tests",
            echo="spec",
        )
        t1 = time.perf_counter()
        cand = R.start(
            "speculative",
            req.model,
            engine,
            [
                *R.reference_passes(
                    p.cases, (), p.s, req.suite.sampling.max_tokens, max(1, req.suite.sampling.logprobs)
                ),
                *R.draw_passes(chosen, plan, p.s),
            ],
            p.run_dir,
            p.control,
            family,
            engine["speculative_config"],
            p.repair,
        )
        timings["candidate_wall_s"] = R.wall(t1)
        predicted: dict[str, int] = {}
        if propose is not None and cand.status == "ok":
            for d in cand.lines("case", "greedy"):
                c = next(c for c in p.cases if c.id == d["key"])
                for k, v in counts(c.prompt_ids, d["token_ids"], propose).items():
                    predicted[k] = predicted.get(k, 0) + v
        return Ran(
            ref,
            cand,
            tuple(tests),
            plan,
            tuple(c.id for c in chosen),
            propose is not None,
            predicted,
            engine,
            timings,
        )

    def judge(self, ws: Workspace, req: GateRequest, p: Prepared, ran: Ran) -> Judgement:
        from harness.kinds.spec import judge as J
        from harness.kinds.spec.report import extra_of, summary_of

        meta = ran.cand.meta if ran.cand is not None and ran.cand.status == "ok" else {}
        family = split_spec(req.candidate)[0]
        name = req.candidate + (f"+{p.control}" if p.control else "")
        engine = FAMILIES[family]
        settings = {**ran.engine, **({"repair": p.repair} if p.repair else {})}
        info = EngineInfo(name, engine, str(meta.get("version", "unknown")), settings=settings)
        label = (
            f"{family}-{p.s.method}"
            + (f"-{p.control}" if p.control else "")
            + (f"-repair-{p.repair}" if p.repair else "")
        )
        failed = next((x for x in (ran.ref, ran.cand) if x is None or x.status != "ok"), "none")
        if failed != "none":
            x = failed
            status = x.status if x is not None else "error"
            reason = x.reason if x is not None else "not run"
            vs = tuple(
                failure_verdicts(
                    [J.GREEDY, J.SAMPLED],
                    ["all"],
                    status,
                    reason,  # type: ignore[arg-type]
                    x.log_tail if x is not None else "",
                )
            )
            return Judgement(
                label=label,
                candidate=info,
                verdicts=vs,
                gates=(J.GREEDY, J.SAMPLED),
                controls=(),
                summary=f"{req.suite.name}: {p.s.method} {status}: {first_line(reason)}",
                extra={"engine_refused": reason} if status == "refused" else {},
                timings=ran.timings,
            )
        refs = {d["key"]: d for d in ran.ref.lines("case", "greedy")}
        cands = {d["key"]: d for d in ran.cand.lines("case", "greedy")}

        def side(d: dict[str, Any]) -> J.Side:
            return J.Side(
                tuple(d["token_ids"]),
                tuple(tuple(x) for x in d.get("top_ids") or ()),
                tuple(tuple(x) for x in d.get("top_logprobs") or ()),
            )

        verdicts: list[Verdict] = [
            J.greedy_verdict(c.id, side(refs[c.id]), side(cands[c.id]), p.s.near_tie_nats)
            for c in p.cases
            if c.id in refs and c.id in cands
        ]
        from harness.kinds.spec.run import draws_of

        draws = draws_of(ran.cand)
        tokens = [
            J.judged(
                t, draws.get((f"t{t.temperature:g}/c{t.concurrency}", t.case_id), np.zeros((0, 0), np.int64))
            )
            for t in ran.tests
        ]
        t0 = time.perf_counter()
        sampled = J.sampled_verdicts(ran.tests, tokens, p.s.alpha, p.s.power)
        verdicts += sampled
        if p.control is not None:
            verdicts.append(J.control_verdict(p.control, verdicts, req.candidate))
        drawn_accepted = sum(
            float(d.get("vllm:spec_decode_num_accepted_tokens") or 0.0)
            for d in ran.cand.lines("counters")
            if d.get("pass") != "greedy"
        )
        controls = _controls(ran.tests, tokens, p.s, verdicts, drawn_accepted, p.control)
        timings = {
            **ran.timings,
            "judge_s": time.perf_counter() - t0,
            **{f"engine_{k}": float(v) for k, v in (ran.cand.meta.get("timings") or {}).items()},
        }
        extra = extra_of(p, ran, sampled, tokens)
        return Judgement(
            label=label,
            candidate=info,
            verdicts=tuple(verdicts),
            gates=(J.GREEDY, J.SAMPLED),
            controls=tuple(controls),
            summary=summary_of(req.suite.name, p, verdicts, extra),
            timings=timings,
            extra=extra,
            reference={
                "role": "the same engine without speculation",
                "engine": engine,
                "version": ran.ref.meta.get("version"),
                "settings": {
                    **{k: v for k, v in ran.engine.items() if k != "speculative_config"},
                    "max_logprobs": -1,
                },
            },
        )


def _repair(spec: str, name: str, arg: str | None) -> str | None:
    """``vllm:repair=expand`` -> ``"expand"``; None without an argument. Any other argument, or a
    repair vLLM's worker does not know, is a clear error naming the spec."""
    if not arg:
        return None
    from harness.api import EngineRefused
    from harness.engines.base import parse_options
    from harness.engines.vllm.spec_phase import REPAIRS

    try:
        opts = parse_options(arg, spec)
    except EngineRefused as e:
        raise SuiteError(str(e)) from None
    if name != "vllm" or set(opts) != {"repair"} or opts["repair"] not in REPAIRS:
        raise SuiteError(
            f"candidate {spec!r}: the spec kind takes one option, vllm:repair=NAME, with NAME one of "
            f"{', '.join(REPAIRS)} (a located vLLM defect put right in its worker)"
        )
    return opts["repair"]


def with_draw_cap(s: SpecSettings, cap: Any) -> SpecSettings:
    """The settings with ``max_draws`` lowered to ``cap`` (``DRAWS=``: a run that must fit a time
    budget; the record's settings carry the cap and each test states the TV it then detects)."""
    if cap is None:
        return s
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise SuiteError(f"DRAWS={cap!r}: expected a whole number of draws >= 1")
    if cap > s.max_draws:
        raise SuiteError(f"DRAWS={cap}: a cap lowers the suite's max_draws ({s.max_draws}), never raises it")
    return replace(s, max_draws=cap)


def _drafter_config(ws: Workspace, cfg: Any) -> dict[str, Any]:
    """The suite's ``speculative_config`` with a draft ``model`` given by name resolved to its folder
    (``model = "tiny-llama-draft"``: the harness's named model)."""
    out = dict(cfg)
    name = out.get("model")
    if isinstance(name, str) and not Path(name).is_dir():
        from harness.models import resolve_model

        out["model"] = str(resolve_model(name, ws).path)
    return out


def _controls(
    tests: tuple[J.Test, ...],
    tokens: list[np.ndarray],
    s: SpecSettings,
    verdicts: list[Verdict],
    drawn_accepted: float = 0.0,
    control: str | None = None,
) -> list[Control]:
    from harness.kinds.spec import judge as J

    planted = J.greedy_verdict(
        "planted", J.Side((1,), ((1, 2),), ((0.0, -10.0),)), J.Side((3,)), s.near_tie_nats
    )
    out = [
        Control(
            J.GREEDY,
            "speculative output equal to the reference",
            "pass",
            same := J.greedy_verdict("same", J.Side((1,)), J.Side((1,)), s.near_tie_nats).status,
            same == "pass",
        ),
        Control(
            J.GREEDY,
            "a token outside the reference's top-k at position 0",
            "fail",
            planted.status,
            planted.status == "fail",
        ),
    ]
    if control is not None:  # the control verdict itself: a planted fault no test caught must fail
        for name, status, expect in (
            ("a planted fault every test missed", "pass", "fail"),
            ("a planted fault one greedy test caught", "fail", "pass"),
        ):
            got = J.control_verdict(control, [Verdict("planted", J.GREEDY, status, status)]).status
            out.append(Control(J.CONTROL, name, expect, got, got == expect))  # type: ignore[arg-type]
    if not tests:
        return out
    counts = [int(t.size) for t in tokens]
    for name, alt, expect in (
        ("lossy acceptance: every drafted token accepted (a double)", [J.lossy(t) for t in tests], "fail"),
        ("the reference itself (a double)", [t.q for t in tests], "pass"),
    ):
        got = J.sampled_verdicts(tests, J.planted_draws(tests, counts, alt, s.seed), s.alpha, s.power)
        fails = [v for v in got if v.status == "fail"]
        status = "fail" if fails else "pass"
        where = f" first at {fails[0].case_id}" if fails else ""
        out.append(
            Control(
                J.SAMPLED,
                name,
                expect,
                f"{status} {len(fails)}/{len(got)}{where}",  # type: ignore[arg-type]
                status == expect,
            )
        )
    attributed = any(t.slot is not None for t in tests)
    acc = J.accepted_draws(verdicts) if attributed else int(drawn_accepted)
    what = "judged draws at accepted drafts" if attributed else "tokens accepted over the draws (counter)"
    out.append(
        Control(
            J.SAMPLED,
            f"{GOLDEN_CHECK} draws judged at accepted draft positions",
            "pass",
            f"{acc} {what}",
            acc > 0,
            "" if acc > 0 else "no judged draw at an accepted draft: rejection sampling untested",
        )
    )
    return out


register_kind(SpecKind(), help="speculative decoding: greedy exactness, sampled distribution, acceptance")
