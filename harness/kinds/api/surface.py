"""One API gate's requests and judgement, engine-free: plan every facet's probes from the oracle's
plain generations, judge a candidate's exchanges against the oracle's, and run the planted controls
through the fault proxy in front of the oracle's server."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from harness.abilities import Endpoint
from harness.api import Verdict
from harness.kinds.api.facets import FACETS, Context, Observed, Probe, comparator
from harness.kinds.api.facets.base import JudgesEveryExchange, completion
from harness.kinds.api.observe import observe
from harness.kinds.api.proxy import Fault, proxy
from harness.kinds.api.views import view
from harness.records import Control


def base_probes(texts: Mapping[str, str], max_tokens: int) -> list[Probe]:
    """The plain greedy completion of every case (the stop facet plans from the oracle's)."""
    return [
        Probe(f"base/{cid}", "base", "/completions", completion(t, max_tokens)) for cid, t in texts.items()
    ]


def with_base(ctx: Context, base: Observed) -> Context:
    return replace(ctx, base={pid.partition("/")[2]: view(ex) for pid, ex in base.items()})


def plan(ctx: Context) -> list[Probe]:
    return [p for f in ctx.settings.facets for p in FACETS.get(f).probes(ctx)]


def judge(ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed) -> list[Verdict]:
    out: list[Verdict] = []
    for f in ctx.settings.facets:
        facet = FACETS.get(f)
        mine = list(probes) if isinstance(facet, JudgesEveryExchange) else [p for p in probes if p.facet == f]
        out += facet.judge(ctx, mine, oracle, candidate)
    return out


def ordinary_text(ctx: Context) -> str:
    return next(iter(ctx.texts.values()))


def control(
    ctx: Context,
    probes: Sequence[Probe],
    oracle: Observed,
    upstream: Endpoint,
    fault: Fault,
    progress: Callable[[str], None] | None = None,
) -> Control:
    """Replay every probe through the proxy planting ``fault``: its facet must answer as expected
    (fail — with the words ``fault.says`` where it names them —, or pass for a positive control) and
    every other facet must pass."""
    with proxy(upstream.base_url, fault) as url:
        got = observe(replace(upstream, base_url=url), probes, ordinary_text(ctx))
    verdicts = judge(ctx, probes, oracle, got)
    target = comparator(fault.facet)
    mine = [v for v in verdicts if v.comparator == target]
    fails = [v for v in mine if v.status == "fail"]
    others = sorted({v.comparator for v in verdicts if v.comparator != target and v.status == "fail"})
    bit = any(fault.says in v.summary for v in fails) if fault.expect == "fail" else not fails and bool(mine)
    ok = bit and not others
    got_words = f"fail {len(fails)}/{len(mine)}" if fails else f"pass {len(mine)}/{len(mine)}"
    if others:
        got_words += f"; also failed: {', '.join(others)}"
    first = next((v for v in fails if fault.says in v.summary), None)
    note = first.case_id + ": " + first.summary if first else ""
    if progress is not None:
        progress(f"control {fault.name!r}: {got_words}")
    return Control(target, fault.name, fault.expect, got_words, ok, note[:300])
