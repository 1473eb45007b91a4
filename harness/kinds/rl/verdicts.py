"""The RL gate's judgement of one run: every verdict, the in-memory controls and the record's figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.api import EngineInfo, Verdict, failure_verdicts
from harness.kinds.base import GateRequest, Judgement
from harness.kinds.rl import controls as ctl
from harness.kinds.rl import judge as jd
from harness.kinds.rl.pause import PAUSE, judge_pause, pause_controls
from harness.kinds.rl.routing import agreement
from harness.kinds.rl.run import MODE, Prepared, Ran
from harness.kinds.rl.updates import arrivals


def _pairs(
    p: Prepared, ran: Ran, step: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[int, ...]]]:
    cases = {str(c["id"]): c for c in ran.session.cases.get(step, ())}
    rs, ts, toks = [], [], []
    for r in p.plans[step].rollouts:
        c = cases.get(r.id)
        t = ran.scores.get(step, {}).get(r.id)
        if c is None or t is None:
            continue
        rs.append(np.asarray(c["chosen_logprobs"], np.float64))
        ts.append(t)
        toks.append(tuple(c["token_ids"]))
    return rs, ts, toks


def _routing(p: Prepared, ran: Ran) -> tuple[list[Verdict], list[Any], dict[str, Any]]:
    r = ran.routes
    if not r:
        return [], [], {}
    step0 = next(d for d in ran.session.steps if int(d["index"]) == 0)
    engine = step0.get("routes") or {}
    trainer = {rid: routes for rid, routes in zip(r["ids"], r["own_routes"], strict=True)}
    agree = agreement(engine, trainer)
    cases = {str(c["id"]): c for c in ran.session.cases.get(0, ())}
    rollout = [np.asarray(cases[i]["chosen_logprobs"], np.float64) for i in r["ids"]]
    figs = {name: jd.metrics(rollout, r[name]) for name in ("own", "r3", "r3_other", "r3_zero") if name in r}
    vals = [v for v in agree["per_layer"].values() if v is not None]
    low = [k for k, v in agree["per_layer"].items() if v is not None and v < p.s.routing_min_agreement]
    ev = {"agreement": agree, "mismatch": figs, "layers": step0.get("route_layers")}
    out = []
    if not vals:
        out.append(Verdict("agreement", jd.ROUTING, "error", "no routed token to compare", evidence=ev))
    elif low:
        fd = agree["first_difference"] or {}
        out.append(
            Verdict(
                "agreement",
                jd.ROUTING,
                "fail",
                f"rl_routing FAIL: layer {low[0]} agrees on {100 * agree['per_layer'][low[0]]:.1f}% of "
                f"tokens (bar {100 * p.s.routing_min_agreement:g}%); first difference at layer "
                f"{fd.get('layer')} position {fd.get('position')} of {fd.get('rollout')}: engine "
                f"{fd.get('engine')} vs trainer {fd.get('trainer')}",
                evidence=ev,
            )
        )
    else:
        out.append(
            Verdict(
                "agreement",
                jd.ROUTING,
                "pass",
                "routing agreement per layer: "
                + ", ".join(f"{k} {100 * v:.1f}%" for k, v in agree["per_layer"].items() if v is not None),
                evidence=ev,
            )
        )

    def r3_verdict(name: str) -> Verdict:
        m = figs.get(name) or {}
        over = jd.over_bars(m, p.s.bars)
        if not m.get("tokens"):
            return Verdict("r3", jd.ROUTING, "error", f"{name}: nothing scored", evidence={"figures": m})
        if over:
            return Verdict(
                "r3",
                jd.ROUTING,
                "fail",
                f"rl_routing FAIL: with routes replayed ({name}) {over[0]}",
                evidence={"figures": m},
            )
        return Verdict(
            "r3", jd.ROUTING, "pass", f"routes replayed (R3): {jd.headline(m)}", evidence={"figures": m}
        )

    if "r3" in figs:
        out.append(r3_verdict("r3"))
    controls = ctl.routing_controls(r3_verdict, list(figs))
    return out, controls, ev


def judge_run(req: GateRequest, p: Prepared, ran: Ran, drop_name: str | None) -> Judgement:
    gates = (
        jd.SYNC, jd.GROWTH, jd.IDENTITY, jd.WEIGHTS, jd.VERSION,
        *((jd.ROUTING,) if p.moe else ()), *((PAUSE,) if p.server and not p.control else ()),
    )  # fmt: skip
    info = engine_info(req, p, ran)
    label = f"rl-{candidate_name(req, p)}"
    base_extra: dict[str, Any] = {
        "settings": p.s.to_json(),
        "lane": p.dtype,
        "trainer": p.trainer_name,
        "trainer_dtype": p.trainer_dtype,
        "control": p.control,
        "control_what": ctl.PLANTED.get(p.control or "", None),
        "logprobs_mode": MODE,
        "backend": "harness_files",
        "repack": "cpu" if p.repack else None,
        "transport": "http" if p.server else "offline",
        "bars_from": p.s.bars_from,
    }
    if ran.failure is not None:
        vs = failure(req, p, ran)
        return Judgement(
            label=label,
            candidate=info,
            verdicts=tuple(vs),
            gates=gates,
            controls=(),
            summary=f"{req.suite.name}: {vs[0].status.upper()} ({vs[0].summary[:200]})",
            timings=dict(ran.timings),
            extra={"rl": base_extra},
            reference=_trainer_ref(p),
        )
    verdicts: list[Verdict] = []
    controls: list[Any] = []
    per_step: list[dict[str, float]] = []
    steps_json = []
    all_arrivals: list[Any] = []
    prev_version: str | None = None
    processed: set[str] = set()
    layout: list[dict[str, Any]] = []
    step_lines = {int(d["index"]): d for d in ran.session.steps}
    tokens: dict[int, list[tuple[int, ...]]] = {}
    calibration: dict[str, Any] | None = None
    for plan in p.plans:
        k = plan.index
        rs, ts, toks = _pairs(p, ran, k)
        tokens[k] = toks
        m = jd.metrics(rs, ts)
        per_step.append(m)
        verdicts.append(jd.judge_step(k, plan.kind, m, p.s))
        verdicts += jd.metric_verdicts(k, plan.kind, m, p.s)
        if k == 0:
            controls += ctl.sync_controls(rs, p.s)
            calibration = _calibration(rs, ts, p.s.draws)
        if plan.kind == "identity" and plan.reference is not None:
            verdicts.append(
                jd.judge_identity(
                    k, plan.reference, m, per_step[plan.reference], toks == tokens[plan.reference], p.s
                )
            )
            if not any(c.comparator == jd.IDENTITY for c in controls):
                controls += ctl.identity_controls(m, p.s)
        line = step_lines[k]
        prev = ran.side.folders[k - 1] / "model.safetensors" if k > 0 else None
        arr = arrivals(
            ran.side.folders[k] / "model.safetensors",
            prev,
            line["tap"]["path"],
            line["tap"]["how"],
            line.get("checksums") or {},
        )
        if k == 0:  # parameters that do not hold the checkpoint's values as vLLM loaded it: a layout
            # its post-load processing made (on a CPU, a MoE layer's expert stacks); judged by the
            # figures, not by their bytes
            processed = {a.name for a in arr if a.read == "param" and not a.arrived(p.s.weight_tol)}
        if processed:
            layout.append(
                {
                    "step": k,
                    "hold_what_was_sent": sorted(
                        a.name for a in arr if a.name in processed and a.arrived(p.s.weight_tol)
                    ),
                }
            )
        arr = [a for a in arr if a.name not in processed]
        all_arrivals = all_arrivals or arr
        verdicts.append(jd.judge_weights(k, arr, p.s))
        spans = {
            str(c["id"]): (len(c.get("token_ids") or ()), c.get("weight_versions"))
            for c in ran.session.cases.get(k, ())
            if "weight_versions" in c
        }
        verdicts.append(jd.judge_version(k, str(k), line.get("weight_version"), prev_version, spans or None))
        prev_version = line.get("weight_version")
        cached = [c.get("num_cached_tokens") for c in ran.session.cases.get(k, ())]
        steps_json.append(
            {
                "step": k,
                "kind": plan.kind,
                "moved": len(ran.side.moved[k]),
                "moved_tensors": ran.side.moved[k] if plan.kind == "easy" else None,
                "figures": m,
                "weight_version": line.get("weight_version"),
                "reset_prefix_cache": line.get("reset_prefix_cache"),
                "num_cached_tokens": cached,
                "update_s": line.get("update_s"),
                "memcpy_s": line.get("memcpy_s"),
                "received": [
                    {"names": len(x["names"]), "bytes": x["bytes"]} for x in line.get("received", [])
                ],
                "checksums": _checksum_table(arr),
                "repacked": line.get("repacked"),
            }
        )
    verdicts.append(jd.judge_growth(per_step, p.s))
    controls += (
        ctl.weights_controls(all_arrivals, p.s) + ctl.growth_controls(per_step, p.s) + ctl.version_controls()
    )
    rv, rc, routing = _routing(p, ran)
    verdicts += rv
    controls += rc
    paused = list(ran.session.meta.get("pause") or ())
    pause_json = []
    tol = float(p.s.bars.get(jd.MAIN, 1e-4))
    for ev in paused:
        v = judge_pause(ev, ran.pause_scores.get(str(ev["mode"])), tol)
        verdicts.append(v)
        pause_json.append({"verdict": v.status, "summary": v.summary, **v.evidence})
    controls += pause_controls(paused, ran.pause_scores, tol)
    if p.control:
        verdicts.append(ctl.detection(p.control, verdicts, drop_name))
        controls += ctl.detection_controls(p.control, verdicts, drop_name)
    main = max(float(m.get(jd.MAIN, 0.0)) for m in per_step)
    extra = {
        "rl": {
            **base_extra,
            "steps": steps_json,
            "main_figure": jd.MAIN,
            "main_value": main,
            "processed_layout": {"tensors": sorted(processed), "by_step": layout} if processed else None,
            "dropped_tensor": drop_name,
            "engine_meta": {
                k: v
                for k, v in ran.session.meta.items()
                if k in ("version", "backend", "transport", "vllm_checksums", "timings", "official_routes")
            },
            **({"routing": routing} if routing else {}),
            **({"pause": pause_json} if pause_json else {}),
            **({"calibration": calibration} if calibration else {}),
        }
    }
    return Judgement(
        label=label,
        candidate=info,
        verdicts=tuple(verdicts),
        gates=gates,
        controls=tuple(controls),
        summary=_summary(req.suite.name, p, per_step, verdicts, main),
        timings=dict(ran.timings),
        extra=extra,
        reference=_trainer_ref(p),
    )


def _calibration(rs: list[np.ndarray], ts: list[np.ndarray], draws: int) -> dict[str, Any] | None:
    """Step 0's figures per draw and the bars the rule gives from them (``[rl_sync] draws`` > 1)."""
    if draws <= 1:
        return None
    from harness.kinds.rl.calibrate import MARGIN, calibrated_bars, draw_figures

    try:
        figs = draw_figures(rs, ts, draws)
        return {"draws": figs, "margin": MARGIN, "bars": calibrated_bars(figs)}
    except ValueError as e:
        return {"error": str(e)}


def _trainer_ref(p: Prepared) -> dict[str, Any]:
    """The record's reference side: the trainer, its engine and the dtype it scored in."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tv = version("transformers")
    except PackageNotFoundError:
        tv = "unknown"
    builtin = p.trainer_name == "hf"
    return {
        "role": "trainer",
        "spec": p.trainer_name,
        "engine": "transformers" if builtin else p.trainer_name,
        "version": tv if builtin else "user trainer",
        "dtype": p.trainer_dtype,
    }


def _checksum_table(arr: Sequence[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in arr:
        out.setdefault(a.place.param, a.checksum)
    return out


def _summary(
    suite: str, p: Prepared, per_step: Sequence[Mapping[str, float]], verdicts: Sequence[Verdict], main: float
) -> str:
    fails = [v for v in verdicts if v.status in ("fail", "error")]
    head = " | ".join(
        f"s{k} {m.get('token_mult_prob_error', float('nan')):.5f}/{m.get('gen_kl_error', float('nan')):.1e}"
        for k, m in enumerate(per_step)
    )
    lead = f"{suite}{' control ' + p.control if p.control else ''}: "
    if fails:
        return lead + f"FAIL {fails[0].summary[:220]} — token_mult_prob_error/gen_kl_error by step: {head}"
    return lead + f"pass; max mean |Δ| {main:.2e}; token_mult_prob_error/gen_kl_error by step: {head}"


def candidate_name(req: GateRequest, p: Prepared) -> str:
    """The record's candidate: the spec, ``+bfloat16`` for that lane, ``+<control>`` for a planted
    fault (so that FEATURES.md keeps one cell per lane and per control)."""
    return (
        req.candidate
        + ("" if p.dtype == "float32" else f"+{p.dtype}")
        + (f"+{p.control}" if p.control else "")
    )


def engine_info(req: GateRequest, p: Prepared, ran: Ran) -> EngineInfo:
    meta = ran.session.meta if ran.session is not None else {}
    env = {"venv": {k: v for k, v in p.venv.to_json().items() if k != "path"}} if p.venv is not None else {}
    return EngineInfo(
        candidate_name(req, p),
        "vllm",
        str(meta.get("version") or "unknown"),
        settings={
            "dtype": p.dtype,
            "logprobs_mode": MODE,
            "enforce_eager": True,
            "enable_prefix_caching": True,
            "weight_transfer_backend": str(meta.get("backend") or "harness_files"),
            "transport": "http" if p.server else "offline",
        },
        environment=env,
    )


def failure(req: GateRequest, p: Prepared, ran: Ran) -> list[Verdict]:
    assert ran.failure is not None
    status, reason, tail = ran.failure
    return failure_verdicts(
        [jd.SYNC],
        [f"step{x.index}" for x in p.plans],
        status,
        reason,
        tail,  # type: ignore[arg-type]
        who="rollout engine",
    )
