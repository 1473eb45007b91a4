"""Judging the KV round trip under load (:mod:`harness.kinds.kv.load`): four comparators.

* ``kv_load.pages`` (per request): every page the consumer restored is byte-equal to the page the
  producer stored under the same id (key, layer, shard), and as many pages were restored as the
  engine asked the connector for (the external tokens of each admission, a re-admission after a
  preemption included); a page the store could not serve is a named failure;
* ``kv_load.bit_exact`` / ``kv_load.near_tie`` (per request): the output under load against the
  same request alone. Near-tie (a divergence only where the alone run was nearly undecided) is
  always gated. Bit-exact is gated when the engine itself is bit-exact under this load: every
  request of the ``ref`` pass (the same load, reading no cache) equal to alone bit for bit. Where
  the engine is not (its batches change logprobs in the last bits), bit-exact is reported, a skip
  naming how many requests the engine itself kept bit-exact. A per-request choice does not hold:
  the load and ref passes batch requests differently, so a request bit-exact in one may differ by
  1e-6 nats in the other without any cache read (seen on tiny-llama: 0 restores, 4 positions);
* ``kv_load.evidence`` (one verdict): the run was under load: connector restores, preemptions and
  prefix-cache evictions all above zero in the load pass, and at least ``min_in_flight`` requests
  in flight at its peak. A run without load is not evidence and fails.

Controls: the planted-fault lane (a byte flipped in the store under load) must fail
``kv_load.pages`` naming the page; in-memory page mutations (:func:`page_mutations`) and the
invariance tiers' planted faults (:mod:`harness.kinds.invariance.tiers`) prove the other comparators
can fail; counters of zero must fail ``kv_load.evidence``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.api import Case, Output, Verdict, failure_verdicts
from harness.compare.bit_exact import BitExact
from harness.compare.near_tie import NearTie
from harness.excerpt import INLINE, NOTE, clip, first_line
from harness.kinds.invariance.tiers import Tiers, fault_controls
from harness.kinds.kv.capture import CapturedPage, CaptureError
from harness.kinds.kv.faults.store import read_planted
from harness.kinds.kv.passes import Phase
from harness.kinds.kv.settings import LOAD_VERDICTS, LoadSettings
from harness.records import Control

PAGES, BIT_EXACT, NEAR_TIE, EVIDENCE = LOAD_VERDICTS
GATES = LOAD_VERDICTS
EVIDENCE_CASE = "load"
TIER_SAMPLE = 16
"""Requests whose alone outputs carry the tiers' planted faults (each is cheap; 16 are plenty)."""
PAGE_SAMPLE = 64


@dataclass(frozen=True, slots=True)
class Judged:
    verdicts: tuple[Verdict, ...]
    controls: tuple[Control, ...]
    gates: tuple[str, ...]
    summary: str
    extra: Mapping[str, Any] = field(default_factory=dict)


def _where(p: CapturedPage) -> dict[str, Any]:
    return {"layer": p.ref.layer, "start": p.ref.start, "end": p.ref.end, "key": p.ref.key[:16]}


def first_byte(a: bytes, b: bytes) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def bad_pages(restored: Sequence[CapturedPage], written: Mapping[Any, CapturedPage]) -> list[dict[str, Any]]:
    """Restored pages that are not byte-equal to the page the producer stored under their id."""
    bad = []
    for r in restored:
        w = written.get(r.ref.id)
        if w is None:
            bad.append({**_where(r), "kind": "never stored"})
            continue
        try:
            rb, wb = r.read(), w.read()
        except CaptureError as e:
            bad.append({**_where(r), "kind": "unreadable", "reason": clip(str(e), NOTE)})
            continue
        if rb != wb:
            bad.append({**_where(r), "kind": "differ", "offset": first_byte(wb, rb)})
    return bad


def page_verdict(case: Case, restored: Sequence[CapturedPage], written: Mapping[Any, CapturedPage],
                 asked: int, problems: Sequence[str], lane: str) -> Verdict:
    """``kv_load.pages`` for one request: ``asked`` pages were requested of the connector."""
    bad = bad_pages(restored, written)
    ev: dict[str, Any] = {"lane": lane, "restored_pages": len(restored), "asked_pages": asked}
    if bad or problems or len(restored) != asked:
        ev.update(bad=bad[:20], problems=list(problems[:10]))
        first = bad[0] if bad else None
        what = (f"{len(bad)}/{len(restored)} restored pages differ from what the producer stored; first: "
                f"layer {first['layer']} tokens [{first['start']}, {first['end']}) {first['kind']}"
                + (f" at byte {first['offset']}" if first.get("offset") is not None else "")
                if first else problems[0] if problems else
                f"{len(restored)} pages restored, the engine asked the connector for {asked}")
        return Verdict(case.id, PAGES, "fail", f"kv_load.pages FAIL: {what}", detail=f"{case.id}: {what}",
                       evidence=ev)
    return Verdict(case.id, PAGES, "pass", f"{len(restored)} restored pages byte-equal to the stored ones",
                   evidence=ev)


def counters(cons: Phase, restored: int, restores: int) -> dict[str, Any]:
    """The load pass's evidence: what vLLM counted, what was sampled, what the connector restored."""
    o = dict(cons.observed.get("load") or {})
    return {"requests_in_flight_peak": o.get("peak_in_flight"), "running_peak": o.get("peak_running"),
            "preemptions": o.get("num_preemptions"), "evictions": o.get("blocks_evicted"),
            "restores": restores, "restored_pages": restored,
            "connector_hit_tokens": o.get("external_prefix_cache_hits"),
            "prefix_cache_hit_tokens": o.get("prefix_cache_hits"), "samples": o.get("samples"),
            **({"unreadable": o["counters_unreadable"]} if "counters_unreadable" in o else {}),
            **({"events_error": o["events_error"]} if "events_error" in o else {})}


def evidence_verdict(c: Mapping[str, Any], load: LoadSettings) -> Verdict:
    """``kv_load.evidence``: zero counters mean the run was not under load, and it fails."""
    if "unreadable" in c or c.get("evictions") is None:
        why = c.get("unreadable") or c.get("events_error") or "no KV-cache events were observed"
        return Verdict(EVIDENCE_CASE, EVIDENCE, "error", f"the load counters could not be read: {why}",
                       evidence=dict(c))
    short = [f"{k} {c.get(k) or 0}" for k in ("restores", "preemptions", "evictions") if not c.get(k)]
    if (c.get("requests_in_flight_peak") or 0) < load.min_in_flight:
        short.append(f"requests in flight at peak {c.get('requests_in_flight_peak') or 0} < "
                     f"{load.min_in_flight}")
    line = (f"peak {c['requests_in_flight_peak']} requests in flight ({c['running_peak']} running), "
            f"{c['restores']} restores ({c['restored_pages']} pages), {c['preemptions']:.0f} preemptions, "
            f"{c['evictions']} cached blocks evicted")
    if short:
        return Verdict(EVIDENCE_CASE, EVIDENCE, "fail", f"kv_load.evidence FAIL: not under load: "
                       f"{', '.join(short)}", detail=line, evidence=dict(c))
    return Verdict(EVIDENCE_CASE, EVIDENCE, "pass", line, evidence=dict(c))


def same_pages(written: Mapping[Any, bytes], restored: Mapping[Any, bytes]) -> str:
    """``kv_load.pages``' rule over pages in memory: every page back, every byte the same."""
    same = set(written) == set(restored) and all(written[k] == restored[k] for k in written)
    return "pass" if same else "fail"


def page_mutations(pages: Mapping[Any, bytes]) -> list[Control]:
    """``kv_load.pages``' in-memory controls on real stored pages: one byte flipped and one page
    dropped must fail, an identical copy must pass; pages all zero (an unused buffer) prove nothing."""
    if not pages or all(not any(v) for v in pages.values()):
        return [Control(PAGES, "flip one byte of one page", "fail", "unplantable", False,
                        "no captured page holds a non-zero byte")]
    keys = list(pages)
    victim = next(k for k in keys[len(keys) // 2:] + keys if any(pages[k]))
    flipped = bytearray(pages[victim])
    flipped[len(flipped) // 2] ^= 0x01
    out = []
    planted = (("flip one byte of one page", "fail", {**pages, victim: bytes(flipped)}),
               ("drop one page", "fail", {k: v for k, v in pages.items() if k != keys[-1]}),
               ("identical copy", "pass", dict(pages)))
    for what, expect, restored in planted:
        got = same_pages(pages, restored)
        out.append(Control(PAGES, what, expect, got, got == expect))  # type: ignore[arg-type]
    return out


def _renamed(items: Sequence[Any]) -> list[Any]:
    """The invariance tiers' names (``inv_kv_load.bit_exact``) as this lane's (``kv_load.bit_exact``)."""
    return [replace(x, comparator=x.comparator.removeprefix("inv_")) for x in items]


def judge_load(requests: Sequence[Case], flips: Sequence[Case], prod: Phase, cons: Phase | None,
               load: LoadSettings, suite: str, decode: Any = None, threshold_nats: float = 0.5) -> Judged:
    failed = prod if not prod.ok else (cons if cons is not None and not cons.ok else None)
    if failed is not None or cons is None or prod.capture is None or cons.capture is None:
        ph = failed or cons or prod
        reason = ph.reason or "its capture could not be read"
        status = "skip" if ph.skipped else "error"
        who = f"{ph.name} engine"
        facts = (status, reason, ph.tail(), who, {"phase": ph.name})
        vs = failure_verdicts(GATES[:3], [c.id for c in requests], *facts)
        vs += failure_verdicts([EVIDENCE], [EVIDENCE_CASE], *facts)
        return Judged(tuple(vs), (), GATES, f"kv-load: {who} {status}: {first_line(reason, INLINE)}",
                      {"engine_error": reason})
    from harness.engines.launch.worker_run import output_from_fields

    written: dict[Any, CapturedPage] = {}
    for p in prod.capture.side("written"):
        written.setdefault(p.ref.id, p)
    restored: dict[tuple[str, str], list[CapturedPage]] = defaultdict(list)
    for p in cons.capture.side("restored"):
        restored[(p.tag.case, p.tag.lane)].append(p)
    problems: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pr in cons.capture.problems:
        problems[(pr.tag.case, pr.tag.lane)].append(f"{pr.ref.describe()}: {pr.kind}: {pr.reason}")
    for s in cons.capture.store_problems:
        problems[(str(s.get("case")), str(s.get("lane")))].append(f"{s.get('kind')}: {s.get('reason')}")
    setup = cons.capture.setup or {}
    per_token = {int(g["block_size"]): 0 for g in setup.get("groups", []) if g.get("paged")}
    for g in setup.get("groups", []):
        if g.get("paged"):
            per_token[int(g["block_size"])] += len(g.get("layers") or ()) * int(setup.get("tp", 1))
    external: Counter[tuple[str, str]] = Counter()
    restores: Counter[tuple[str, str]] = Counter()
    for f in cons.capture.requests:
        external[(f.case, f.lane)] += f.external
        restores[(f.case, f.lane)] += f.external > 0

    def asked(key: tuple[str, str]) -> int:
        return sum(external[key] // bs * n for bs, n in per_token.items())

    verdicts: list[Verdict] = []
    for c in requests:
        verdicts.append(page_verdict(c, restored[(c.id, "clean")], written, asked((c.id, "clean")),
                                     problems[(c.id, "clean")], "clean"))
    tiers = Tiers(BitExact(decode), NearTie(threshold_nats, decode))

    def out(ph: Phase, pass_name: str, cid: str, lane: str) -> Output:
        row = ph.row(pass_name, cid, lane)
        return (output_from_fields(cid, row) if row is not None else
                Output(cid, (), error=f"the {ph.name} engine returned no {pass_name} result"))

    pairs = [(c, out(prod, "alone", c.id, "clean"), out(cons, "load", c.id, "clean"),
              out(cons, "ref", c.id, "ref")) for c in requests]
    engine = {c.id: tiers.compare("bit_exact", alone, ref, c) for c, alone, _, ref in pairs}
    exact_engine = sum(v.status == "pass" for v in engine.values())
    invariant = exact_engine == len(requests)
    why_not = (f"not gated: without the connector, under this load, the engine itself was bit-exact to the "
               f"request alone for {exact_engine}/{len(requests)} requests")
    refs: list[tuple[Case, Output]] = []
    for c, alone, under, _ in pairs:
        refs.append((c, alone))
        facts = {"prefix": next((t for t in c.tags if t.startswith("prefix:")), ""),
                 "restores": restores[(c.id, "clean")],
                 "engine_bit_exact_under_load": engine[c.id].status == "pass"}
        for tier, name in (("bit_exact", BIT_EXACT), ("near_tie", NEAR_TIE)):
            v = tiers.compare(tier, alone, under, c)
            v = replace(v, comparator=name, evidence={**v.evidence, **facts, "judged": v.status})
            if tier == "bit_exact" and not invariant and v.status in ("pass", "fail"):
                v = replace(v, status="skip", summary=f"{why_not}; judged {v.status}",
                            detail=f"{c.id}: with the connector: {v.summary}\nwithout the connector, "
                                   f"under the same load: {engine[c.id].summary}")
            verdicts.append(v)
    n_restored = sum(len(v) for (cid, lane), v in restored.items() if lane == "clean")
    c = counters(cons, n_restored, sum(v for (cid, lane), v in restores.items() if lane == "clean"))
    verdicts.append(evidence_verdict(c, load))

    controls: list[Control] = []
    planted = read_planted(cons.capture.folder).get("flip")
    for f in flips:
        key = (f.id, "flip")
        v = page_verdict(f, restored[key], written, asked(key), problems[key], "flip")
        named = planted is not None and any(
            b.get("layer") == planted["layer"] and b.get("start") == planted["start"]
            and b.get("end") == planted["end"] for b in v.evidence.get("bad", ()))
        what = (f"in-engine, under load: the store flips byte {planted.get('offset')} of layer "
                f"{planted['layer']} tokens [{planted['start']}, {planted['end']})" if planted else
                "in-engine, under load: a flipped byte (never planted: the lane served no page)")
        controls.append(Control(PAGES, what, "fail", v.status, v.status == "fail" and named,
                                v.summary if named or planted is None else
                                f"{v.summary}; the verdict does not name the planted page"))
    sample = [p for ps in restored.values() for p in ps if p.ref.id in written][:PAGE_SAMPLE]
    pages: dict[Any, bytes] = {}
    for p in sample:
        try:
            pages[p.ref.id] = written[p.ref.id].read()
        except CaptureError:
            continue

    controls += page_mutations(pages)
    controls += _renamed(fault_controls("kv_load", refs[:TIER_SAMPLE], tiers))
    idle = {**c, "restores": 0, "preemptions": 0.0, "evictions": 0, "requests_in_flight_peak": 1}
    for what, planted_c in (("every counter 0 (a run without load)", idle),
                            ("no preemption", {**c, "preemptions": 0.0}),
                            ("no prefix-cache eviction", {**c, "evictions": 0})):
        got = evidence_verdict(planted_c, load).status
        controls.append(Control(EVIDENCE, what, "fail", got, got == "fail"))

    tokens = Counter(v.status for v in verdicts if v.comparator == NEAR_TIE)
    exact = Counter(v.evidence.get("judged", v.status) for v in verdicts if v.comparator == BIT_EXACT)
    page_ok = sum(v.status == "pass" for v in verdicts if v.comparator == PAGES)
    summary = (f"kv-load: {len(requests)} requests, {verdicts[-1].summary}; pages {page_ok}/{len(requests)} "
               f"requests byte-equal; tokens vs alone: near-tie {tokens['pass']}/{len(requests)}, bit-exact "
               f"{exact['pass']}/{len(requests)}")
    if not invariant:
        summary += (f" (not gated: the engine itself was bit-exact for {exact_engine}/{len(requests)} "
                    f"without the connector)")
    extra = {"load": {**c, "requests": len(requests), "engine_bit_exact_requests": exact_engine,
                      "bit_exact_gated": invariant, "bit_exact_requests": exact["pass"],
                      "flip_requests": len(flips), "pages_written": len(written)}}
    gates = GATES if invariant else tuple(g for g in GATES if g != BIT_EXACT)
    return Judged(tuple(verdicts), tuple(controls), gates, summary, extra)
