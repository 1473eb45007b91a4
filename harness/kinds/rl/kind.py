"""``rl``: trainer-vs-rollout parity across in-place weight updates of a running vLLM engine.

``make rl MODEL=… [CANDIDATE=vllm] [SUITE=rl] [CONTROL=…] [TRAINER=module:callable] [DTYPE=bfloat16]``.
prepare: the suite's ``[rl_sync]`` table, every step's prompts and seeds, the trainer.
run: the trainer writes every step's weights; the pinned vLLM starts once and goes through the
session (:mod:`harness.engines.vllm.rl`: updates through its RL API and the harness's CPU backend,
prefix-cache resets, seeded rollouts, its checksums, the harness's taps); the trainer scores.
judge: :mod:`harness.kinds.rl.judge` per step and across steps; the weights' arrival and the
version; MoE routing parity (:mod:`harness.kinds.rl.routing`); the in-memory controls
(:mod:`harness.kinds.rl.controls`). A planted fault (``CONTROL``) is its own run and record.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from harness.api import EngineFailed, EngineRefused
from harness.engines.base import split_spec
from harness.engines.launch.venvs import VenvError, VenvInfo, check_version
from harness.kinds.base import GateRequest, Judgement
from harness.kinds.invariance.trainer import transform
from harness.kinds.rl.run import (
    MODE,
    Prepared,
    Ran,
    engine_steps,
    plan_rollouts,
    score,
    score_pause,
    score_routes,
    write_steps,
)
from harness.kinds.rl.settings import CONTROLS, parse
from harness.kinds.rl.trainer import load_trainer
from harness.kinds.rl.updates import easy_tensors
from harness.kinds.rl.verdicts import judge_run
from harness.provenance import now_utc
from harness.staleness import invariance_reasons
from harness.suites import SuiteError
from harness.workspace import Workspace

REPACK_ARG = "repack=cpu"
"""``CANDIDATE=vllm:repack=cpu``: after each update the harness's backend redoes on a CPU what vLLM's
reload leaves undone (:data:`harness.engines.vllm.rl_backend.REPACKS`) — a repair beside vLLM's
path, recorded under its own candidate; plain ``vllm`` judges vLLM's path as it is."""
ENGINES = ("vllm", "vllm-server")
"""The offline ``LLM`` (:mod:`harness.engines.vllm.rl`) or the pinned server over HTTP
(:mod:`harness.engines.vllm.rl_http`, with the pause phase: :mod:`harness.kinds.rl.pause`)."""


class RLKind:
    name = "rl"
    default_candidate = "vllm"
    tables = ("rl_sync",)
    stale = staticmethod(invariance_reasons)
    """No goldens: the suite version, the model digest, and the engine ran the pin."""

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        s = parse(req.suite)
        mine = s.for_model(req.model.name)
        if mine is None:
            raise SuiteError(
                f"{req.suite.path}: [rl_sync.model_bars] holds bars for {', '.join(sorted(s.model_bars))}, "
                f"none for {req.model.name}: measure its step-0 floor first (docs/rl.md, \"bfloat16 bars\")"
            )
        s = mine
        name, arg = split_spec(req.candidate)
        if not (name in ENGINES or name.startswith("vllm@")) or arg not in (None, REPACK_ARG):
            raise SuiteError(
                f"{req.suite.path}: the rl kind drives vLLM offline (CANDIDATE=vllm, the pin, or "
                f"vllm@<version>, another release in its own venv) or the pinned server over HTTP "
                f"(CANDIDATE=vllm-server); :{REPACK_ARG} adds the harness's CPU repack after each "
                f"update; {req.candidate!r} is not supported"
            )
        release = None if name == "vllm-server" else release_venv(name)
        control = req.options.get("control") or None
        if control is not None and control not in CONTROLS:
            raise SuiteError(f"CONTROL={control!r}: valid planted controls are {', '.join(CONTROLS)}")
        dtype = str(req.options.get("dtype") or s.trainer_dtype)
        if dtype not in ("float32", "bfloat16"):
            raise SuiteError(f"DTYPE={dtype!r}: the lanes are float32 and bfloat16")
        trainer_dtype = (
            {"float32": "bfloat16", "bfloat16": "float32"}[dtype] if control == "trainer_dtype" else dtype
        )
        try:
            tname, trainer = load_trainer(req.options.get("trainer"))
        except ValueError as e:
            raise SuiteError(str(e)) from None
        cases = req.suite.build_cases(req.model.encode, req.model.limits)
        short = [c for c in cases if len(c.prompt_ids) < s.shared_tokens]
        if short:
            raise SuiteError(
                f"{req.suite.path}: case {short[0].id!r} encodes to {len(short[0].prompt_ids)} tokens on "
                f"{req.model.name}, fewer than [rl_sync] shared_tokens {s.shared_tokens}"
            )
        longest = max(s.max_tokens, s.pause_tokens if name == "vllm-server" else 0)
        need = s.shared_tokens + s.tail_tokens + longest
        if need > req.model.limits.max_len:
            raise SuiteError(
                f"{req.suite.path}: [rl_sync] needs {need} positions, beyond {req.model.name}'s "
                f"context of {req.model.limits.max_len}"
            )
        vocab = req.model.limits.vocab_size or 32_000
        plans = tuple(plan_rollouts(s, [c.prompt_ids for c in cases], vocab))
        cfg = json.loads((Path(req.model.path) / "config.json").read_text())
        stamp = now_utc().replace(":", "").replace("-", "")
        run_dir = (ws.runs / f"rl-{stamp}-{req.model.slug}-{secrets.token_hex(3)}").resolve()
        return Prepared(
            s,
            plans,
            run_dir,
            dtype,
            trainer_dtype,
            tname,
            trainer,
            control,
            moe=bool(cfg.get("num_experts")),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            top_k=int(cfg.get("num_experts_per_tok") or 0),
            repack=arg == REPACK_ARG,
            server=name == "vllm-server",
            venv=release,
        )

    def run(self, ws: Workspace, req: GateRequest, p: Prepared) -> Ran:
        from harness.engines.vllm.rl import run_session
        from harness.engines.vllm.runner import START_TIMEOUT_S, default_engine_settings

        given = req.options.get("ran")
        if given is not None:
            return given
        progress = req.options.get("progress")
        say = progress if callable(progress) else (lambda _t: None)
        t0 = time.perf_counter()
        say(f"trainer: writing {len(p.plans)} steps' weights ({p.dtype})")
        side = write_steps(req.model.path, p.s, p.dtype, p.run_dir / "trainer")
        names = _names(side.folders[0])
        drop = easy_tensors(names, p.tied)[0]
        steps = engine_steps(p.plans, side, names, p.control, drop)
        engine = {**default_engine_settings(req.model), "dtype": p.dtype, "logprobs_mode": MODE}
        sampling = {"temperature": p.s.temperature, "top_p": p.s.top_p, "max_tokens": p.s.max_tokens}
        say(f"vLLM: one engine start, {len(steps)} steps" + (f" (control {p.control})" if p.control else ""))
        routes = {"top_k": p.top_k, "step": 0} if p.moe else None
        try:
            if p.server:
                from harness.engines.vllm.rl_http import run_http_session
                from harness.engines.vllm.rl_pause import PAUSE_MODES
                from harness.kinds.rl.pause import pause_plan, unexercised

                files = [str(f / "model.safetensors") for f in side.folders]
                pause = (
                    None if p.control
                    else pause_plan(steps, PAUSE_MODES, p.s.pause_tokens, files, req.model.limits.max_len)
                )  # fmt: skip
                session = run_http_session(
                    req.model, engine, steps, sampling, p.run_dir / "engine", routes, pause, START_TIMEOUT_S,
                    repack=p.repack, unexercised=unexercised,
                )  # fmt: skip
            else:
                session = run_session(
                    req.model.path, req.model.name, engine, steps, sampling, p.run_dir / "engine", routes,
                    START_TIMEOUT_S, python=str(p.venv.python) if p.venv is not None else None,
                    repack=p.repack,
                )  # fmt: skip
        except (EngineRefused, EngineFailed) as e:
            status = "refused" if isinstance(e, EngineRefused) else "error"
            return Ran(side, failure=(status, str(e), e.log_tail if isinstance(e, EngineFailed) else ""))
        t1 = time.perf_counter()
        say(f"trainer {p.trainer_name}: scoring in {p.trainer_dtype}")
        to_lp = transform(MODE, p.s.temperature, p.s.top_p, 0)
        scores = score(p.trainer, side, p.plans, session.cases, p.trainer_dtype, to_lp)
        routes: dict[str, Any] = {}
        if p.moe:
            eng = {int(d["index"]): d.get("routes") or {} for d in session.steps}
            routes = score_routes(side, p.plans, session.cases, p.trainer_dtype, to_lp, eng, 0)
        paused = session.meta.get("pause") or ()
        pause_scores = score_pause(p.trainer, side, paused, p.trainer_dtype, to_lp) if paused else {}
        t2 = time.perf_counter()
        timings = {
            "trainer_write_s": side.seconds,
            "engine_session_s": t1 - t0 - side.seconds,
            "trainer_score_s": t2 - t1,
            **{f"engine_{k}": float(v) for k, v in (session.meta.get("timings") or {}).items()},
        }
        return Ran(side, session, scores, routes, pause_scores=pause_scores, timings=timings)

    def judge(self, ws: Workspace, req: GateRequest, p: Prepared, ran: Ran) -> Judgement:
        return judge_run(req, p, ran, drop_name=_drop(ran, p))


def release_venv(name: str) -> VenvInfo | None:
    """``vllm@<version>``: that release's venv (installed on first use, minutes); None for the pin
    (``vllm``, or ``vllm@`` naming the pinned version). A bad version or a failed install is named."""
    if name == "vllm":
        return None
    from harness.engines.vllm.release import release_python
    from harness.pin import oracle_pin

    try:
        version = check_version(name.partition("@")[2])
        return None if version == oracle_pin().version else release_python(version)
    except VenvError as e:
        raise SuiteError(f"CANDIDATE={name}: {e}") from None


def _names(folder: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return list(f.keys())  # noqa: SIM118 - a safetensors handle, not a dict


def _drop(ran: Ran, p: Prepared) -> str | None:
    if ran.side is None or p.control != "drop_tensor":
        return None
    return easy_tensors(_names(ran.side.folders[0]), p.tied)[0]
