"""The RL gate's figures and verdicts: trainer vs rollout logprobs per step under the frameworks'
names, growth across steps, the identity step, the weights' arrival and the weight version.

Per sampled token, ``r`` is the rollout's logprob (vLLM's ``processed_logprobs``: after temperature
and top-p), ``t`` the trainer's of the same token in the same mode, ``Δ = t - r``:

=========================  ===========================================  ==========================
figure                     definition                                   as a framework names it
=========================  ===========================================  ==========================
token_mult_prob_error      mean exp(|Δ|)                                NeMo-RL
gen_kl_error               mean (exp(Δ) - 1 - Δ): k3 of KL(rollout‖trainer)  NeMo-RL
rollout_probs_diff_mean    mean |exp(t) - exp(r)|                       verl
rollout_probs_diff_max     max |exp(t) - exp(r)|                        verl
probs_pearson              Pearson correlation of exp(t) and exp(r)     verl
k3_kl                      mean (exp(-Δ) - 1 + Δ): k3, log ratio r - t  AReaL
frac_over_ln2              share of tokens with |Δ| > ln 2              AReaL
mean_abs_delta             mean |Δ| (the main figure: separations)      —
frac_masked                share of sampled tokens one side gives -inf  —
                           (its top-p mask drew the nucleus's edge
                           elsewhere); left out of every figure above
=========================  ===========================================  ==========================

Pure functions of numbers (no engine, no torch): the unit tests drive them directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.api import Verdict
from harness.compare.rl_logprobs import finite_pairs
from harness.kinds.rl.settings import BAR_KEYS, RLSettings

SYNC, GROWTH, IDENTITY, WEIGHTS, VERSION, ROUTING = (
    "rl_sync",
    "rl_growth",
    "rl_identity",
    "rl_weights",
    "rl_version",
    "rl_routing",
)
MAIN = "mean_abs_delta"
LN2 = math.log(2.0)


def metrics(rollout: Sequence[np.ndarray], trainer: Sequence[np.ndarray]) -> dict[str, float]:
    """Every figure above over all sampled tokens of the given sequences (non-finite pairs counted in
    ``support_mismatch`` and left out)."""
    pairs, bad = finite_pairs(rollout, trainer)
    r = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros(0)
    t = np.concatenate([p[1] for p in pairs]) if pairs else np.zeros(0)
    if not r.size:
        return {"tokens": 0, "support_mismatch": bad, "frac_masked": 1.0 if bad else 0.0}
    d = t - r
    pr, pt = np.exp(r), np.exp(t)
    pear = float(np.corrcoef(pr, pt)[0, 1]) if r.size > 1 and pr.std() > 0 and pt.std() > 0 else 1.0
    return {
        "tokens": int(r.size),
        "support_mismatch": bad,
        "token_mult_prob_error": float(np.exp(np.abs(d)).mean()),
        "gen_kl_error": float((np.exp(d) - 1.0 - d).mean()),
        "rollout_probs_diff_mean": float(np.abs(pt - pr).mean()),
        "rollout_probs_diff_max": float(np.abs(pt - pr).max()),
        "probs_pearson": pear,
        "k3_kl": float((np.exp(-d) - 1.0 + d).mean()),
        "frac_over_ln2": float((np.abs(d) > LN2).mean()),
        "mean_abs_delta": float(np.abs(d).mean()),
        "max_abs_delta": float(np.abs(d).max()),
        "frac_masked": bad / (r.size + bad),
    }


def over_bars(m: Mapping[str, float], bars: Mapping[str, float]) -> list[str]:
    out = []
    for k, bar in bars.items():
        v = float(m.get(k, float("nan")))
        way = BAR_KEYS[k][2]
        if math.isnan(v) or (v > bar if way == "max" else v < bar):
            out.append(f"{k} {v:.4g} {'>' if way == 'max' else '<'} bar {bar:g}")
    return out


def headline(m: Mapping[str, float]) -> str:
    if not m.get("tokens"):
        return "no sampled tokens"
    return (
        f"token_mult_prob_error {m['token_mult_prob_error']:.6f}, gen_kl_error {m['gen_kl_error']:.2e}, "
        f"rollout_probs_diff_mean {m['rollout_probs_diff_mean']:.2e}, k3_kl {m['k3_kl']:.2e}, "
        f"|Δ| mean {m['mean_abs_delta']:.2e} ({m['tokens']} tokens)"
    )


def judge_step(step: int, kind: str, m: Mapping[str, float], s: RLSettings) -> Verdict:
    case = f"step{step}"
    if not m.get("tokens"):
        return Verdict(
            case, SYNC, "error", f"step {step} ({kind}): no sampled token to judge", evidence=dict(m)
        )
    over = over_bars(m, s.bars)
    if m.get("support_mismatch") and "frac_masked" not in s.bars:
        over.append(f"{m['support_mismatch']} tokens one side gives -inf (a top-p mask drawn differently)")
    ev = {**m, "step_kind": kind, "bars": dict(s.bars)}
    if over:
        return Verdict(
            case,
            SYNC,
            "fail",
            f"step {step} ({kind}) FAIL: {over[0]}",
            detail=f"step {step} ({kind}): trainer vs rollout over the bars:\n  "
            + "\n  ".join(over)
            + f"\n  {headline(m)}",
            evidence=ev,
        )
    return Verdict(case, SYNC, "pass", f"step {step} ({kind}): {headline(m)}", evidence=ev)


def metric_verdicts(step: int, kind: str, m: Mapping[str, float], s: RLSettings) -> list[Verdict]:
    """One verdict per barred figure (``rl.<figure>``): what a FEATURES.md row per figure cites."""
    out = []
    for k, bar in s.bars.items():
        v = float(m.get(k, float("nan")))
        bad = over_bars({k: v}, {k: bar})
        status = "error" if not m.get("tokens") else ("fail" if bad else "pass")
        text = bad[0] if bad else f"{k} {v:.4g} (bar {bar:g})"
        out.append(
            Verdict(
                f"step{step}",
                f"rl.{k}",
                status,
                f"step {step} ({kind}): {text}",  # type: ignore[arg-type]
                evidence={"value": v, "bar": bar, "step_kind": kind},
            )
        )
    return out


def judge_growth(per_step: Sequence[Mapping[str, float]], s: RLSettings) -> Verdict:
    """The main figure at each step over step 0's: a step above ``growth`` x fails, under its bar or not."""
    vals = [float(m.get(MAIN, float("nan"))) for m in per_step]
    base = max(vals[0], s.growth_floor) if vals and not math.isnan(vals[0]) else float("nan")
    ratios = [v / base for v in vals]
    ev = {"mean_abs_delta": vals, "over_step0": ratios, "growth_bar": s.growth, "floor": s.growth_floor}
    worst = max(range(len(ratios)), key=lambda i: ratios[i] if not math.isnan(ratios[i]) else math.inf)
    if any(math.isnan(x) for x in ratios) or ratios[worst] > s.growth:
        return Verdict(
            "(run)",
            GROWTH,
            "fail",
            f"rl_growth FAIL: step {worst} mean |Δ| {vals[worst]:.3g} is {ratios[worst]:.3g}x step 0's "
            f"{vals[0]:.3g} (bar {s.growth:g}x)",
            detail="mean |Δ logprob| by step: " + ", ".join(f"{v:.3g}" for v in vals),
            evidence=ev,
        )
    return Verdict(
        "(run)",
        GROWTH,
        "pass",
        f"largest step/step-0 ratio {ratios[worst]:.3g}x (bar {s.growth:g}x)",
        evidence=ev,
    )


def judge_identity(
    step: int, ref: int, m: Mapping[str, float], m_ref: Mapping[str, float], same_tokens: bool, s: RLSettings
) -> Verdict:
    """An update of unchanged weights on the reference step's prompts and seeds changes nothing."""
    case = f"step{step}"
    diffs = {k: abs(float(m.get(k, 0.0)) - float(m_ref.get(k, 0.0))) for k in BAR_KEYS}
    worst = max(diffs, key=lambda k: diffs[k])
    ev = {"reference_step": ref, "same_tokens": same_tokens, "differences": diffs, "tol": s.identity_tol}
    if not same_tokens or diffs[worst] > s.identity_tol:
        why = (
            f"the rollouts sampled other tokens than step {ref} on the same prompts and seeds"
            if not same_tokens
            else f"{worst} differs from step {ref}'s by {diffs[worst]:.3g} (tol {s.identity_tol:g})"
        )
        return Verdict(case, IDENTITY, "fail", f"rl_identity FAIL: {why}", evidence=ev)
    return Verdict(
        case, IDENTITY, "pass", f"identity update: tokens and every figure equal step {ref}'s", evidence=ev
    )


def judge_weights(step: int, arrivals: Sequence[Any], s: RLSettings) -> Verdict:
    """Every tensor the trainer sent is what the engine computes with (read by the harness's tap)."""
    case = f"step{step}"
    missed = [a for a in arrivals if not a.arrived(s.weight_tol)]
    vac = sorted({a.place.param for a in arrivals if a.checksum == "vacuous"})
    ev = {
        "tensors": len(arrivals),
        "missed": [a.to_json() for a in missed],
        "vllm_checksums": {
            "vacuous": vac,
            "agrees": sum(a.checksum == "agrees" for a in arrivals),
            "differs": sum(a.checksum == "differs" for a in arrivals),
            "absent": sum(a.checksum == "absent" for a in arrivals),
        },
        "read": {
            "kernel": sum(a.read == "kernel" for a in arrivals),
            "param": sum(a.read == "param" for a in arrivals),
        },
    }
    if not arrivals:
        return Verdict(case, WEIGHTS, "error", f"step {step}: no tensor compared", evidence=ev)
    if missed:
        names = ", ".join(
            f"{a.name}" + (" (still the previous step's values)" if a.same_as_before else "")
            for a in missed[:4]
        )
        return Verdict(
            case,
            WEIGHTS,
            "fail",
            f"rl_weights FAIL: {len(missed)}/{len(arrivals)} tensors did not arrive: {names}",
            detail="\n".join(
                f"  {a.name} -> {a.place.param}: max |engine - sent| {a.max_abs:.3g} "
                f"(max |sent| {a.scale:.3g}); vLLM checksum {a.checksum}"
                for a in missed
            ),
            evidence=ev,
        )
    if all(a.checksum == "absent" for a in arrivals):
        said = "this vLLM reports no per-tensor checksums: the harness's tap is the only evidence"
    else:
        said = f"the engine's own checksums hash nothing for {len(vac)} parameters: read through the kernel"
    return Verdict(case, WEIGHTS, "pass", f"{len(arrivals)} tensors arrived ({said})", evidence=ev)


def judge_version(
    step: int,
    asked: str,
    reported: str | None,
    prev: str | None,
    spans: Mapping[str, tuple[int, Sequence[Mapping[str, Any]] | None]] | None = None,
) -> Verdict:
    """The engine's weight version after the step's update: the one asked, advanced; and, where the
    engine reports it (``spans``: rollout id -> (sampled tokens, its ``weight_versions`` spans)),
    every sampled token produced by that version."""
    case = f"step{step}"
    ev: dict[str, Any] = {"asked": asked, "reported": reported, "previous": prev}
    if spans is not None:
        ev["token_versions"] = {rid: list(sp) if sp is not None else None for rid, (_, sp) in spans.items()}
    if reported != asked:
        return Verdict(
            case,
            VERSION,
            "fail",
            f"rl_version FAIL: the engine reports weight version {reported!r}, the update set {asked!r}",
            evidence=ev,
        )
    if prev is not None and reported == prev:
        return Verdict(
            case, VERSION, "fail", f"rl_version FAIL: the version did not advance ({reported!r})", evidence=ev
        )
    for rid, (n, sp) in (spans or {}).items():
        if sp is None:
            continue
        other = [d for d in sp if str(d.get("version")) != asked]
        covered = sum(int(d["end"]) - int(d["start"]) for d in sp)
        if other or covered != n:
            what = (
                f"tokens {other[0]['start']}-{other[0]['end']} by version {other[0]['version']!r}"
                if other
                else f"spans cover {covered} of its {n} tokens"
            )
            why = f"rl_version FAIL: rollout {rid}: {what}, not version {asked!r}"
            return Verdict(case, VERSION, "fail", why, evidence=ev)
    said = sum(sp is not None for _, sp in (spans or {}).values())
    return Verdict(
        case,
        VERSION,
        "pass",
        f"weight version {reported}" + (f"; every token of {said} rollouts by it" if said else ""),
        evidence=ev,
    )
