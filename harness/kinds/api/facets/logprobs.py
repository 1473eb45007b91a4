"""The logprob contract, as a conformance table per server: raw or processed logprobs (renormalized
after top-k / top-p or not: measured on sampled requests against the model's raw logits), whether
the sampled token is inside ``top_logprobs``, how many entries come back, their order and the order
of ties. Each entry is compared with the oracle's; the table goes into the record for the gates that
read logprobs (an RL rollout gate reads this contract instead of assuming one)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import FACETS, Context, Observed, Probe, chat, completion, seen, verdict
from harness.kinds.api.reference import Reference
from harness.kinds.api.views import View, token_id

K = 5
TOL = 2e-3
"""nats between a returned logprob and a hypothesis (float32 engines agree far closer)."""
FIELDS = ("kind_top_k", "kind_top_p", "sampled_in_top", "top_count", "order", "ties")


def _logsumexp(xs: Sequence[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def kept(row: Sequence[float], top_k: int | None, top_p: float | None) -> list[int]:
    order = sorted(range(len(row)), key=lambda i: -row[i])
    if top_k is not None:
        return order[:top_k]
    out, mass = [], 0.0
    for i in order:
        out.append(i)
        mass += math.exp(row[i])
        if top_p is not None and mass >= top_p:
            break
    return out


def kind(ref: Reference, v: View, top_k: int | None, top_p: float | None) -> tuple[str, dict[str, Any]]:
    """``raw``, ``renormalized`` (after the top-k/top-p cut), ``other`` or ``unknown`` (no ids)."""
    if not v.ok or v.prompt_ids is None or v.token_ids is None or not v.logprobs:
        return "unknown", {"why": "the reply carries no prompt ids, token ids or logprobs"}
    rows = ref.raw_logprobs(v.prompt_ids, v.token_ids)
    dev_raw = dev_renorm = 0.0
    for row, tok, pos in zip(rows, v.token_ids, v.logprobs, strict=False):
        if pos.logprob is None:
            return "unknown", {"why": "a position without its logprob"}
        dev_raw = max(dev_raw, abs(pos.logprob - row[tok]))
        dev_renorm = max(
            dev_renorm, abs(pos.logprob - (row[tok] - _logsumexp([row[i] for i in kept(row, top_k, top_p)])))
        )
    facts = {"max_dev_raw": dev_raw, "max_dev_renormalized": dev_renorm, "positions": len(rows)}
    if dev_raw <= TOL and dev_renorm <= TOL:
        return "raw", {**facts, "note": "the cut kept (almost) all the mass: raw and renormalized agree"}
    if dev_raw <= TOL:
        return "raw", facts
    if dev_renorm <= TOL:
        return "renormalized", facts
    return "other", facts


def descending(lps: Sequence[float]) -> bool:
    return all(a >= b for a, b in zip(lps, lps[1:], strict=False))


def ordering(token: str, top: Sequence[tuple[str, float]]) -> str:
    """How one ``top_logprobs`` list is ordered."""
    lps = [lp for _, lp in top]
    if descending(lps):
        return "descending"
    if top and top[0][0] == token and descending(lps[1:]):
        return "sampled first, then descending"
    return "unsorted"


def contract(ref: Reference, obs: Observed, settings: Any) -> dict[str, Any]:
    """The conformance table of one server (field -> value) and its evidence (``_evidence``)."""
    out: dict[str, Any] = {}
    ev: dict[str, Any] = {}
    out["kind_top_k"], ev["kind_top_k"] = kind(
        ref, seen(obs, "logprobs/sampled-top-k"), settings.sampled_top_k, None
    )
    out["kind_top_p"], ev["kind_top_p"] = kind(
        ref, seen(obs, "logprobs/sampled-top-p"), None, settings.sampled_top_p
    )
    inside, counts, order, ties = [], set(), set(), set()
    for pid in ("logprobs/greedy", "logprobs/sampled-top-k", "logprobs/sampled-top-p", "logprobs/chat"):
        v = seen(obs, pid)
        for pos in v.logprobs:
            if not pos.top:
                continue
            names = [t for t, _ in pos.top]
            inside.append(pos.token in names)
            counts.add(len(pos.top) - K)
            order.add(ordering(pos.token, pos.top))
            for (ta, la), (tb, lb) in zip(pos.top, pos.top[1:], strict=False):
                if la == lb:
                    ia, ib = token_id(ta), token_id(tb)
                    ties.add(
                        "unknown ids"
                        if ia is None or ib is None
                        else ("ascending id" if ia < ib else "descending id")
                    )
    out["sampled_in_top"] = (
        "unknown" if not inside else "always" if all(inside) else "never" if not any(inside) else "sometimes"
    )
    out["top_count"] = (
        "unknown" if not counts else ", ".join(f"k{d:+d}" if d else "k" for d in sorted(counts))
    )
    out["order"] = "unknown" if not order else ", ".join(sorted(order))
    out["ties"] = "no tie seen" if not ties else ", ".join(sorted(ties))
    out["_evidence"] = ev
    return out


@dataclass(frozen=True, slots=True)
class Logprobs:
    key: ClassVar[str] = "logprobs"
    title: ClassVar[str] = "Logprob contract: raw or renormalized, sampled token in top_logprobs, ties"
    rule: ClassVar[str] = (
        "each entry of the server's logprob contract (raw or renormalized after "
        "top-k/top-p, sampled token inside top_logprobs, count, order, ties) equals "
        "the oracle's"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        s, mt = ctx.settings, ctx.settings.max_tokens
        first = next(iter(ctx.texts.values()))
        ids = {"logprobs": K, "return_tokens_as_token_ids": True}
        sampled = {"temperature": 1.0, "seed": s.sampled_seed, **ids}
        return [
            Probe("logprobs/greedy", self.key, "/completions", completion(first, mt, **ids)),
            Probe(
                "logprobs/sampled-top-k",
                self.key,
                "/completions",
                completion(first, mt, **{**sampled, "top_k": s.sampled_top_k}),
            ),
            Probe(
                "logprobs/sampled-top-p",
                self.key,
                "/completions",
                completion(first, mt, **{**sampled, "top_p": s.sampled_top_p}),
            ),
            Probe(
                "logprobs/chat",
                self.key,
                "/chat/completions",
                chat(
                    [{"role": "user", "content": first}],
                    mt,
                    logprobs=True,
                    top_logprobs=K,
                    return_tokens_as_token_ids=True,
                ),
            ),
        ]

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        o, c = contract(ctx.reference, oracle, ctx.settings), contract(ctx.reference, candidate, ctx.settings)
        out = []
        for f in FIELDS:
            ok = c[f] == o[f] and c[f] != "unknown"
            words = f"{f}: {c[f]}" + ("" if c[f] == o[f] else f" (oracle: {o[f]})")
            if c[f] == "unknown" and o[f] == "unknown":
                out.append(verdict(self.key, f"logprobs/{f}", "skip", words + ": neither side shows it"))
                continue
            out.append(
                verdict(
                    self.key,
                    f"logprobs/{f}",
                    ok,
                    words,
                    candidate=c[f],
                    oracle=o[f],
                    **({"measured": c["_evidence"].get(f)} if f in c["_evidence"] else {}),
                )
            )
        return out


def table(ref: Reference, obs: Observed, settings: Any) -> Mapping[str, Any]:
    """The conformance table for the record (no evidence rows)."""
    return {k: v for k, v in contract(ref, obs, settings).items() if not k.startswith("_")}


FACETS.register(Logprobs.key, help=Logprobs.title)(Logprobs())
