"""What a spec record carries beside its verdicts: acceptance per pass (vLLM's counters and the
host's replay of the schedule), the draw plan, the power each test had, the speed with and without
speculation — and the one-line summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.api import Verdict
from harness.kinds.spec import judge as J

DRAFTS, DRAFTED, ACCEPTED, EMITTED = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:generation_tokens",
)


def acceptance(c: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's counters over a pass as the figures a trend follows: the acceptance rate (accepted /
    drafted), the mean accepted length (1 + accepted / drafts: tokens per verification step)."""
    drafts, drafted, acc = (float(c.get(k) or 0.0) for k in (DRAFTS, DRAFTED, ACCEPTED))
    return {
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": acc,
        "emitted_tokens": float(c.get(EMITTED) or 0.0),
        "wall_s": c.get("wall_s"),
        "acceptance_rate": acc / drafted if drafted else None,
        "mean_accepted_length": 1.0 + acc / drafts if drafts else None,
    }


def extra_of(p: Any, ran: Any, sampled: Sequence[Verdict], tokens: Sequence[np.ndarray]) -> dict[str, Any]:
    passes = [str(d["pass"]) for d in ran.cand.lines("counters")]
    acc = {name: acceptance(ran.cand.counters(name)) for name in passes}
    ref_greedy = ran.ref.counters("greedy")
    judged = [v for v in sampled if v.status in ("pass", "fail")]
    roles: dict[str, int] = {}
    for v in sampled:
        for k, n in (v.evidence.get("roles") or {}).items():
            roles[k] = roles.get(k, 0) + int(n)
    tvs = [float(v.evidence["detectable_tv"]) for v in judged]
    drawn = sum(ran.plan.values())
    draw_wall = sum(float(a["wall_s"] or 0.0) for k, a in acc.items() if k != "greedy")
    g_ref, g_spec = float(ref_greedy.get("wall_s") or 0.0), float(acc.get("greedy", {}).get("wall_s") or 0.0)
    emitted = float(acc.get("greedy", {}).get("emitted_tokens") or 0.0)
    return {
        "spec": {
            "settings": p.s.to_json(),
            "control": p.control,
            "draw_cap": p.draw_cap,
            "acceptance": acc,
            "predicted_greedy": dict(ran.predicted),
            "attributed": ran.attributed,
            "sampled_cases": list(ran.chosen),
            "plan": {f"{c}/t{t:g}/c{n}": d for (c, t, n), d in ran.plan.items()},
            "tests": len(ran.tests),
            "judged_tests": len(judged),
            "level": p.s.alpha / max(1, len(judged)),
            "roles": roles,
            "draws": drawn,
            "judged_draws": int(sum(t.size for t in tokens)),
            "detectable_tv": {
                "min": min(tvs) if tvs else None,
                "median": float(np.median(tvs)) if tvs else None,
                "max": max(tvs) if tvs else None,
                "target": p.s.target_tv,
                "tests_at_target": sum(1 for x in tvs if x <= p.s.target_tv),
            },
            "speed": {
                "greedy_tokens_per_s_without": emitted / g_ref if g_ref else None,
                "greedy_tokens_per_s_with": emitted / g_spec if g_spec else None,
                "speedup": g_ref / g_spec if g_ref and g_spec else None,
                "draws_per_s": drawn / draw_wall if draw_wall else None,
                "wall_per_1000_judged_s": 1000 * draw_wall / max(1, int(sum(t.size for t in tokens))),
            },
        }
    }


def summary_of(suite: str, p: Any, verdicts: Sequence[Verdict], extra: Mapping[str, Any]) -> str:
    x = extra["spec"]
    g = [v for v in verdicts if v.comparator == J.GREEDY]
    exact = sum(1 for v in g if v.status == "pass" and v.evidence.get("exact"))
    ties = sum(1 for v in g if v.status == "pass" and not v.evidence.get("exact"))
    gf = [v for v in g if v.status == "fail"]
    s = [v for v in verdicts if v.comparator == J.SAMPLED and v.status in ("pass", "fail")]
    sf = [v for v in s if v.status == "fail"]
    a = x["acceptance"].get("greedy", {})
    rate = a.get("acceptance_rate")
    text = (
        f"{suite}: {p.s.method}{' + ' + p.control if p.control else ''}: greedy {exact} exact + {ties} "
        f"near-tie / {len(g)}"
    )
    if gf:
        text += f" (FAIL {gf[0].case_id} at token {gf[0].evidence.get('position')})"
    text += f"; sampled {len(s) - len(sf)}/{len(s)} pass"
    if p.draw_cap is not None:
        tv = x["detectable_tv"]
        text += f" (draws capped at {p.draw_cap} per setting"
        text += f": detectable TV {tv['min']:.3f}-{tv['max']:.3f})" if tv["min"] is not None else ")"
    if sf:
        text += f" (FAIL {sf[0].case_id})"
    text += (
        f"; draws at accepted/rejected drafts {x['roles'].get('accepted', 0)}/"
        f"{x['roles'].get('rejected', 0)}, bonus {x['roles'].get('bonus', 0)}"
    )
    if rate is not None:
        text += f"; greedy acceptance {rate:.2f}, mean length {a['mean_accepted_length']:.2f}"
    return text
