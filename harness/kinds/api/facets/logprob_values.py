"""Logprob values on every route: the greedy request on ``/v1/completions`` and on
``/v1/chat/completions`` — every returned logprob and top_logprob equals the oracle's within the
cross-device tolerance (:data:`harness.device_policy.FLOAT32_ATOL`) and the raw reference's
(transformers, float32, teacher-forced on the server's own prompt and generated ids) within
:data:`~harness.kinds.api.facets.logprobs.TOL`, a top entry outside the reference's top-k being
forgiven only at a near-tie (the near-tie comparator's default bar); and on sampled requests (top-k,
top-p) of both routes, raw or renormalized, as the oracle's are. The logprob contract
(:mod:`.logprobs`) measures order, count and membership; this facet the numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.compare.near_tie import NearTie
from harness.device_policy import FLOAT32_ATOL
from harness.kinds.api.facets.base import FACETS, Context, Observed, Probe, chat, completion, seen, verdict
from harness.kinds.api.facets.logprobs import TOL, K, kind
from harness.kinds.api.reference import Reference
from harness.kinds.api.views import View, token_id

NEAR_TIE_NATS = NearTie().threshold_nats
ROUTES = {"completions": "/completions", "chat": "/chat/completions"}
CUTS = ("top-k", "top-p")


def _body(route: str, text: str, max_tokens: int, **fields: Any) -> dict[str, Any]:
    ids = {"return_tokens_as_token_ids": True}
    if route == "chat":
        return chat(
            [{"role": "user", "content": text}], max_tokens, logprobs=True, top_logprobs=K, **ids, **fields
        )
    return completion(text, max_tokens, logprobs=K, **ids, **fields)


def _name(ref: Reference, token: str, by_text: bool) -> str:
    """How a token is compared: its ``token_id:N`` name, or its text where a side names tokens by text."""
    tid = token_id(token)
    return ref.piece(tid) if by_text and tid is not None else token


def against_oracle(ref: Reference, o: View, c: View, atol: float) -> list[str]:
    """Every position where the candidate's logprobs are not the oracle's within ``atol``."""
    by_text = any(token_id(p.token) is None for p in (*o.logprobs, *c.logprobs))
    bad = []
    if len(o.logprobs) != len(c.logprobs):
        bad.append(f"{len(c.logprobs)} positions with logprobs, the oracle {len(o.logprobs)}")
    for i, (po, pc) in enumerate(zip(o.logprobs, c.logprobs, strict=False)):
        to, tc = _name(ref, po.token, by_text), _name(ref, pc.token, by_text)
        if to != tc:
            bad.append(f"position {i}: token {pc.token!r}, the oracle {po.token!r}")
            break
        if po.logprob is None or pc.logprob is None or abs(po.logprob - pc.logprob) > atol:
            bad.append(f"position {i} {pc.token}: logprob {pc.logprob}, the oracle {po.logprob}")
        top_o = {_name(ref, t, by_text): lp for t, lp in po.top}
        top_c = {_name(ref, t, by_text): lp for t, lp in pc.top}
        floor = min(top_o.values(), default=0.0)
        for t in sorted(set(top_o) ^ set(top_c)):  # a set difference only at a tie on the k-th value
            lp = top_o.get(t, top_c.get(t, 0.0))
            if abs(lp - floor) > atol:
                side = "the candidate's" if t in top_c else "the oracle's"
                bad.append(f"position {i}: {t} only in {side} top_logprobs ({lp:.6f})")
        for t in sorted(set(top_o) & set(top_c)):
            if abs(top_o[t] - top_c[t]) > atol:
                bad.append(f"position {i}: top {t} {top_c[t]:.6f}, the oracle {top_o[t]:.6f}")
    return bad


def against_reference(ref: Reference, v: View) -> tuple[list[str], float] | str:
    """Every place the server's logprobs are not the raw reference's (values within ``TOL``; a top
    entry or the greedy token outside the reference's best only at a near-tie), and the largest
    difference; a string saying why it cannot be judged."""
    if v.prompt_ids is None or v.token_ids is None:
        return "the reply carries no prompt or generated token ids: no reference to compute"
    rows = ref.raw_logprobs(v.prompt_ids, v.token_ids)
    bad: list[str] = []
    worst = 0.0
    for i, (row, tok, pos) in enumerate(zip(rows, v.token_ids, v.logprobs, strict=False)):
        best = sorted(row, reverse=True)
        if row[tok] < best[0] - NEAR_TIE_NATS:
            bad.append(f"position {i}: greedy token {tok} is {best[0] - row[tok]:.3f} nats below the best")
        entries = [(pos.token, pos.logprob)] + list(pos.top)
        for t, lp in entries:
            tid = token_id(t)
            if tid is None or lp is None:
                return f"position {i}: token {t!r} carries no id (return_tokens_as_token_ids)"
            worst = max(worst, abs(lp - row[tid]))
            if abs(lp - row[tid]) > TOL:
                bad.append(f"position {i}: {t} logprob {lp:.6f}, the reference {row[tid]:.6f}")
        kth = best[min(K, len(best)) - 1]
        for t, _ in pos.top:
            tid = token_id(t)
            if tid is not None and row[tid] < kth - NEAR_TIE_NATS:
                bad.append(
                    f"position {i}: {t} in top_logprobs, {kth - row[tid]:.3f} nats below the "
                    f"reference's top-{K}"
                )
    return bad, worst


@dataclass(frozen=True, slots=True)
class LogprobValues:
    key: ClassVar[str] = "logprob_values"
    title: ClassVar[str] = (
        "Logprob values on both routes: greedy logprobs equal the oracle's and the raw reference's; "
        "sampled ones raw or renormalized as the oracle's"
    )
    rule: ClassVar[str] = (
        "on /v1/completions and /v1/chat/completions, every greedy logprob and top_logprob equals the "
        f"oracle's within {FLOAT32_ATOL:g} nats and transformers' raw logprob within {TOL:g} (a top "
        "entry outside the reference's top-k only at a near-tie); sampled top-k and top-p logprobs "
        "are raw or renormalized as the oracle's are"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        s, mt = ctx.settings, ctx.settings.max_tokens
        first = next(iter(ctx.texts.values()))
        out = []
        for route, path in ROUTES.items():
            out.append(Probe(f"{self.key}/{route}/greedy", self.key, path, _body(route, first, mt)))
            for cut in CUTS:
                limit = {"top_k": s.sampled_top_k} if cut == "top-k" else {"top_p": s.sampled_top_p}
                body = _body(route, first, mt, temperature=1.0, seed=s.sampled_seed, **limit)
                out.append(
                    Probe(f"{self.key}/{route}/sampled-{cut}", self.key, path, body, meta={"cut": cut})
                )
        return out

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        out = []
        for p in probes:
            o, c = seen(oracle, p.id), seen(candidate, p.id)
            if not c.ok or not c.logprobs:
                why = c.error if not c.ok else "the reply carries no logprobs"
                out.append(verdict(self.key, p.id, False, f"no logprobs: {why}"))
            elif "cut" in p.meta:
                out.append(self._sampled(ctx, p, o, c))
            else:
                out.append(self._greedy(ctx, p, o, c))
        return out

    def _greedy(self, ctx: Context, p: Probe, o: View, c: View) -> Verdict:
        if ctx.dtype not in ("float32", "auto"):
            return verdict(
                self.key,
                p.id,
                "skip",
                f"the servers run {ctx.dtype}: the cross-device "
                "tolerance and the float32 reference hold for float32 only",
            )
        vs_oracle = against_oracle(ctx.reference, o, c, FLOAT32_ATOL)
        vs_ref = against_reference(ctx.reference, c)
        facts: Mapping[str, Any] = {
            "positions": len(c.logprobs),
            "atol_oracle": FLOAT32_ATOL,
            "atol_reference": TOL,
            "reference": vs_ref if isinstance(vs_ref, str) else {"max_abs_diff": vs_ref[1]},
        }
        bad = [f"against the oracle: {b}" for b in vs_oracle]
        if not isinstance(vs_ref, str):
            bad += [f"against the reference: {b}" for b in vs_ref[0]]
        if bad:
            more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
            return verdict(self.key, p.id, False, bad[0] + more, problems=bad[:20], **facts)
        n = sum(1 + len(pos.top) for pos in c.logprobs)
        words = f"{n} logprobs over {len(c.logprobs)} positions equal the oracle's"
        words += (
            f"; reference not computed: {vs_ref}"
            if isinstance(vs_ref, str)
            else f" and the reference's (max |diff| {vs_ref[1]:.2e} nats)"
        )
        return verdict(self.key, p.id, True, words, **facts)

    def _sampled(self, ctx: Context, p: Probe, o: View, c: View) -> Verdict:
        s = ctx.settings
        cut = (s.sampled_top_k, None) if p.meta["cut"] == "top-k" else (None, s.sampled_top_p)
        ko, eo = kind(ctx.reference, o, *cut)
        kc, ec = kind(ctx.reference, c, *cut)
        if kc == "unknown" and ko == "unknown":
            return verdict(self.key, p.id, "skip", "neither side shows whether its logprobs are raw")
        ok = kc == ko and kc != "unknown"
        words = f"{p.meta['cut']} logprobs {kc}" + ("" if ok else f", the oracle's {ko}")
        return verdict(self.key, p.id, ok, words, candidate=kc, oracle=ko, measured=ec)


def kinds(ref: Reference, obs: Observed, settings: Any) -> dict[str, str]:
    """``kind_<cut>_<route>`` -> raw / renormalized / other / unknown, for the record's contract table."""
    out = {}
    for route in ROUTES:
        for cut in CUTS:
            lim = (settings.sampled_top_k, None) if cut == "top-k" else (None, settings.sampled_top_p)
            v = seen(obs, f"{LogprobValues.key}/{route}/sampled-{cut}")
            out[f"kind_{cut.replace('-', '_')}_{route}"] = kind(ref, v, *lim)[0]
    return out


FACETS.register(LogprobValues.key, help=LogprobValues.title)(LogprobValues())
