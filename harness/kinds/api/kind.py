"""``api``: the OpenAI API surface of a server, judged against the pinned vLLM's own server.

prepare: the suite's ``[api]`` table; the reference (transformers' tokenizer, its chat template — the
``chat_template.jinja`` beside the tokenizer, whose digest the record keeps —, the model for raw
logprobs); the candidate's runner, made from its spec as in every gate, with its
:class:`~harness.abilities.ServesOpenAI` ability (an engine without one is refused, naming those
with one).
run: one start of the pinned vLLM server (``python -m vllm.entrypoints.openai.api_server`` with a
tool-call parser): the oracle's plain generations, then every facet's probes planned from them and
sent to it; the planted controls through the fault proxy in front of it; the candidate — the same
server again when it is the pinned ``vllm-server`` (one start per model per run), else, once the
oracle has stopped, the candidate's own server — receives the very same probes.
judge: one comparator per facet (:mod:`harness.kinds.api.facets`), ``api.<facet>``; the controls;
the logprob contract of both servers as a table; every request and reply kept beside the record.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.abilities import Endpoint, Preflight, ServesOpenAI
from harness.api import EngineFailed, EngineInfo, EngineRefused, Runner, Verdict, failure_verdicts
from harness.engines import RunnerContext, make_runner, split_spec
from harness.engines.openai.transport import Exchange
from harness.excerpt import first_line
from harness.kinds.api.facets import FACETS, Context, Probe, comparator
from harness.kinds.api.facets.logprob_values import kinds
from harness.kinds.api.facets.logprobs import table
from harness.kinds.api.facets.schema import findings
from harness.kinds.api.observe import observe
from harness.kinds.api.proxy import FAULTS
from harness.kinds.api.reference import Reference
from harness.kinds.api.settings import ApiSettings, api_settings
from harness.kinds.api.surface import base_probes, control, judge, ordinary_text, plan, with_base
from harness.kinds.base import GateRequest, Judgement, engine_info, register_kind, say
from harness.oracle import oracle_spec
from harness.records import Control, Record
from harness.staleness import Current, model_reasons, reference_reasons, suite_reasons
from harness.workspace import Workspace

API_ENGINES = ("vllm-server", "vllm-server@<release>", "llamacpp", "openai:<url>")
"""The engines whose runner has the :class:`~harness.abilities.ServesOpenAI` ability (named in a refusal)."""
PINNED = "vllm-server"
"""The oracle's engine: the pinned vLLM's OpenAI server."""


def server_options(settings: ApiSettings) -> dict[str, Any]:
    """What every vLLM server of an API gate runs with (the oracle's, and a ``vllm-server@<release>``
    candidate's unless its spec says otherwise): a tool-call parser (vLLM refuses any ``tool_choice``
    without one)."""
    return {"enable_auto_tool_choice": True, "tool_call_parser": settings.tool_call_parser}


def configure(runner: Runner, settings: ApiSettings) -> Runner:
    from harness.engines.vllm.server import VLLMServerRunner

    if isinstance(runner, VLLMServerRunner):
        runner.engine_options = {**server_options(settings), **runner.engine_options}
    return runner


def is_pinned(spec: str) -> bool:
    name, arg = split_spec(spec)
    return name == PINNED and not arg


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    settings: ApiSettings
    ctx: Context
    runner: Runner | None
    failure: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Ran:
    probes: tuple[Probe, ...] = ()
    ctx: Context | None = None
    oracle: Mapping[str, Exchange] = field(default_factory=dict)
    candidate: Mapping[str, Exchange] = field(default_factory=dict)
    controls: tuple[Control, ...] = ()
    oracle_info: EngineInfo | None = None
    info: EngineInfo | None = None
    endpoint: Endpoint | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    failure: tuple[str, str, str] | None = None
    """(``refused``|``error``, reason, log tail)."""



class ApiKind:
    name = "api"
    default_candidate = PINNED
    tables = ("api",)

    def stale(self, rec: Record, cur: Current) -> list[str]:
        """The A/B rule (suite, model, both servers' release) and the chat template's own digest. A
        candidate refused before the oracle's server started ran no oracle: the pin does not date it."""
        if rec.outcome == "refused" and "oracle_start_s" not in rec.timings:
            why = suite_reasons(rec, cur) + model_reasons(rec, cur)
        else:
            why = reference_reasons(rec, cur)
        tpl = (rec.extra.get("api") or {}).get("template") or {}
        path = cur.ws.root / "models" / str(rec.model.get("name", "")) / "chat_template.jinja"
        if tpl.get("source") == "chat_template.jinja" and path.is_file():
            import hashlib

            if hashlib.sha256(path.read_bytes()).hexdigest() != tpl.get("sha256"):
                why.append(f"the chat template {path.name} of {rec.model.get('name')} changed")
        return why

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        settings = api_settings(req.suite, FACETS.names())
        reference = Reference(Path(req.model.path))
        texts = {c.id: c.text or "" for c in req.suite.cases}
        if any(not t for t in texts.values()):
            from harness.suites import SuiteError

            raise SuiteError(
                f"{req.suite.path}: every case of an API suite needs a 'text' (it is sent as "
                "a prompt and a chat message)"
            )
        ctx = Context(
            settings,
            texts,
            reference,
            {},
            req.model.limits.max_len,
            dtype=req.suite.oracle_dtype or "float32",
        )
        if is_pinned(req.candidate):
            return Prepared(settings, ctx, None)
        runner = None
        try:
            runner = req.runner or configure(
                make_runner(req.candidate, req.model, RunnerContext(run_dir=ws.runs, name=req.candidate)),
                settings,
            )
            if not isinstance(runner, ServesOpenAI):
                raise EngineRefused(
                    f"{req.candidate}: this engine answers no OpenAI API (its runner has no "
                    f"ServesOpenAI ability); engines that do: {', '.join(API_ENGINES)}"
                )
            if isinstance(runner, Preflight):  # before the oracle starts: refused in seconds, not minutes
                runner.preflight()
        except EngineRefused as e:
            return Prepared(settings, ctx, runner, ("refused", str(e)))
        return Prepared(settings, ctx, runner)

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> Ran:
        if prepared.failure is not None:
            return Ran()
        t: dict[str, float] = {}
        ws.runs.mkdir(parents=True, exist_ok=True)
        oracle = configure(
            make_runner(
                oracle_spec(PINNED, req.suite), req.model, RunnerContext(run_dir=ws.runs, name="oracle")
            ),
            prepared.settings,
        )
        assert isinstance(oracle, ServesOpenAI)
        try:
            t0 = time.perf_counter()
            oracle.start()
            t["oracle_start_s"] = time.perf_counter() - t0
            ep = oracle.endpoint()
            ctx = prepared.ctx
            t0 = time.perf_counter()
            ctx = with_base(
                ctx, observe(ep, base_probes(ctx.texts, ctx.settings.max_tokens), ordinary_text(ctx))
            )
            probes = tuple(plan(ctx))
            say(req, f"oracle: {len(probes)} probes over {len(ctx.settings.facets)} facets", echo="api")
            oracle_obs = observe(ep, probes, ordinary_text(ctx))
            t["oracle_requests_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            controls = tuple(
                control(ctx, probes, oracle_obs, ep, f, lambda s: say(req, s, echo="api"))
                for f in FAULTS
                if f.facet in ctx.settings.facets
            )
            t["controls_s"] = time.perf_counter() - t0
            oracle_info = oracle.info()
            if prepared.runner is None:  # the pinned server judged against itself: the same start
                t0 = time.perf_counter()
                cand = observe(ep, probes, ordinary_text(ctx))
                t["candidate_requests_s"] = time.perf_counter() - t0
                info = dataclasses.replace(oracle_info, name=req.candidate)  # the same server, as candidate
                return Ran(probes, ctx, oracle_obs, cand, controls, oracle_info, info, ep, t)
        except EngineFailed as e:
            return Ran(timings=t, failure=("error", f"the oracle's server: {e}", e.log_tail))
        except EngineRefused as e:
            return Ran(timings=t, failure=("error", f"the oracle's server: {e}", ""))
        finally:
            oracle.close()
        runner = prepared.runner
        assert isinstance(runner, ServesOpenAI)
        try:
            t0 = time.perf_counter()
            runner.start()
            t["candidate_start_s"] = time.perf_counter() - t0
            cep = runner.endpoint()
            cctx = ctx if cep.managed else _unmanaged(ctx)
            t0 = time.perf_counter()
            cand = observe(
                cep, [p for p in probes if cep.managed or p.facet != "robustness"], ordinary_text(ctx)
            )
            t["candidate_requests_s"] = time.perf_counter() - t0
            return Ran(probes, cctx, oracle_obs, cand, controls, oracle_info, runner.info(), cep, t)
        except EngineRefused as e:
            return Ran(
                probes, ctx, oracle_obs, {}, controls, oracle_info, None, None, t, ("refused", str(e), "")
            )
        except EngineFailed as e:
            return Ran(
                probes,
                ctx,
                oracle_obs,
                {},
                controls,
                oracle_info,
                None,
                None,
                t,
                ("error", str(e), e.log_tail),
            )
        finally:
            runner.close()

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared, ran: Ran) -> Judgement:
        facets = prepared.settings.facets
        names = [comparator(f) for f in facets]
        ref = prepared.ctx.reference
        template = ref.template.to_json()
        reference = {
            "role": "oracle",
            "spec": PINNED,
            "engine": "vllm",
            "version": ran.oracle_info.version if ran.oracle_info else "unknown",
            "settings": dict(ran.oracle_info.settings) if ran.oracle_info else {},
            "template": template,
        }
        failure = prepared.failure or (ran.failure[:2] if ran.failure else None)
        if failure is not None or ran.ctx is None:
            status, reason = failure or ("error", "nothing ran")
            info = engine_info(prepared.runner, req.candidate)
            vs = failure_verdicts(names, ["all"], status, reason, ran.failure[2] if ran.failure else "")  # type: ignore[arg-type]
            return Judgement(
                req.candidate,
                info,
                tuple(vs),
                tuple(names),
                ran.controls,
                f"{req.suite.name}: {req.candidate} {status}: {first_line(reason)}",
                timings=ran.timings,
                reference=reference,
                extra={"engine_refused": reason} if status == "refused" else {},
            )
        ctx = ran.ctx
        verdicts = judge(ctx, ran.probes, ran.oracle, ran.candidate)
        contracts: dict[str, dict[str, Any]] = {"oracle": {}, "candidate": {}}
        for side, obs in (("oracle", ran.oracle), ("candidate", ran.candidate)):
            if "logprobs" in facets:
                contracts[side].update(table(ref, obs, ctx.settings))
            if "logprob_values" in facets:
                contracts[side].update(kinds(ref, obs, ctx.settings))
        info = ran.info or engine_info(prepared.runner, req.candidate)
        extra: dict[str, Any] = {
            "api": {
                "settings": ctx.settings.to_json(),
                "template": template,
                "endpoint": {"managed": ran.endpoint.managed, "model": ran.endpoint.model}
                if ran.endpoint
                else {},
                "rules": {f: FACETS.get(f).rule for f in facets},
                "logprob_contract": contracts,
                "schema": {
                    "oracle": findings(ran.probes, ran.oracle),
                    "candidate": findings(ran.probes, ran.candidate),
                }
                if "schema" in facets
                else {},
                "evidence": _evidence(verdicts),
                "findings": [f"{v.case_id}: {v.summary}" for v in verdicts if v.status == "fail"],
                "probes": [p.to_json() for p in ran.probes],
            }
        }
        return Judgement(
            req.candidate,
            info,
            tuple(verdicts),
            tuple(names),
            ran.controls,
            _summary(req.suite.name, verdicts, ran.controls),
            timings=ran.timings,
            extra=extra,
            reference=reference,
        )


def _unmanaged(ctx: Context) -> Context:
    from dataclasses import replace

    return replace(ctx, managed=False)


def _evidence(verdicts: list[Verdict]) -> dict[str, str]:
    """The template's evidence per conversation (prompt_token_ids, or usage.prompt_tokens only)."""
    return {v.case_id: str(v.evidence["evidence"]) for v in verdicts if "evidence" in v.evidence}



def _summary(suite: str, verdicts: list[Verdict], controls: tuple[Control, ...]) -> str:
    by: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by.setdefault(v.comparator.partition(".")[2], []).append(v)
    parts = []
    for f, vs in by.items():
        judged = [v for v in vs if v.status in ("pass", "fail")]
        fails = sum(v.status == "fail" for v in judged)
        parts.append(f"{f} {len(judged) - fails}/{len(judged)}" + (" FAIL" if fails else ""))
    bit = sum(c.ok for c in controls)
    return f"{suite}: " + ", ".join(parts) + f"; controls {bit}/{len(controls)} as expected"


register_kind(
    ApiKind(),
    help="the OpenAI API surface against the pinned vLLM server: templates, streaming, "
    "stop, detokenization, structured output, tools, logprobs and their values, the wire schema, "
    "robustness",
)
