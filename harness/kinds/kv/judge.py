"""Turning the two phases' captures into evidence, verdicts, controls and figures: per case the
pages expected, written and restored (:class:`~harness.kv_pages.evidence.CaseEvidence`), judged by
``byte_equal`` / ``kv_hits`` and the token comparators, the planted-fault lanes and in-memory
controls that prove those verdicts can fail, and the run's figures (capture overhead, throughput)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness import compare
from harness.api import Case, Comparator, Output, PageComparator, Verdict
from harness.compare.byte_equal import ByteEqual
from harness.compare.kv_hits import KVHits
from harness.compare.strict import first_divergence
from harness.kinds.controls import run_controls
from harness.kinds.kv.capture import CaptureError
from harness.kinds.kv.config import UNREPORTED
from harness.kinds.kv.faults.store import read_planted
from harness.kinds.kv.passes import Phase
from harness.kinds.kv.plan import first_block_in_window
from harness.kv_pages.evidence import CaseEvidence, Page, Problem
from harness.kv_pages.identity import PageRef, expected_hit_tokens, prefix_keys
from harness.records import Control
from harness.suites import ComparatorSpec


@dataclass
class Judge:
    model: str
    suite: str
    chunk: int
    decode: Any = None
    _written: dict[tuple[str, str, int], Page] | None = None
    notes: list[str] = field(default_factory=list)

    def written(self, prod: Phase) -> dict[tuple[str, str, int], Page]:
        """First written page of every id in the real write pass (scratch lanes are timing only)."""
        if self._written is None:
            assert prod.capture is not None
            out: dict[tuple[str, str, int], Page] = {}
            for p in prod.capture.side("written"):
                if p.tag.lane != "clean":
                    continue
                first = out.get(p.ref.id)
                if first is None and p.offset is not None:
                    out[p.ref.id] = p
                elif first is not None and first.digest != p.digest:
                    self.notes.append(f"producer nondeterminism: {p.ref.describe()} written twice with "
                                      f"different bytes ({first.digest} vs {p.digest})")
            self._written = out
        return self._written

    def evidence(self, case: Case, lane: str, prod: Phase, cons: Phase) -> CaseEvidence:
        assert cons.capture is not None and prod.capture is not None
        setup = cons.capture.setup or prod.capture.setup
        n = len(case.prompt_ids)
        want = expected_hit_tokens(n, self.chunk)
        expected = []
        for g in setup.get("groups", []):
            if not g.get("paged"):
                continue
            bs = int(g["block_size"])
            keys = prefix_keys(case.prompt_ids, bs, want)
            first = first_block_in_window(want, g.get("window"), bs)
            for layer in g["layers"]:
                for shard in range(int(setup.get("tp", 1))):
                    expected += [PageRef(k, layer, int(g["index"]), j * bs, (j + 1) * bs, shard)
                                 for j, k in enumerate(keys) if j >= first]
        mine = lambda tag: tag.case == case.id and tag.lane == lane  # noqa: E731
        restored = tuple(p for p in cons.capture.side("restored") if mine(p.tag))
        problems = tuple(Problem(p.ref, p.kind, p.reason) for p in cons.capture.problems if mine(p.tag))
        for s in cons.capture.store_problems:
            if s.get("case") == case.id and s.get("lane") == lane:
                problems += tuple(Problem(r, str(s["kind"]), str(s["reason"])) for r in expected)
        facts = [r for r in cons.capture.requests if r.case == case.id and r.lane == lane]
        row = cons.row("restore", case.id, lane)
        stored: dict[str, int] = {}
        if prod.capture.stored:
            for key in prefix_keys(case.prompt_ids, self.chunk):
                stored[key] = sum(1 for s in prod.capture.stored if s["key"] == key and not s["dedup"])
            stored = {k: v for k, v in stored.items() if v}
        notes = tuple(self.notes) + (f"captures: {prod.capture.folder.parent.parent.name}/capture/"
                                     f"{{producer,consumer}}",)
        return CaseEvidence(
            model=self.model, case_id=case.id, lane=lane, prompt_len=n, chunk_size=self.chunk,
            expected_hit=want, expected=tuple(expected), written=self.written(prod), restored=restored,
            problems=problems, engine_cached=row.get("num_cached_tokens") if row else None,
            connector_matched=facts[-1].matched if facts else None,
            connector_external=facts[-1].external if facts else None, stored_times=stored,
            finish_reason=str(row.get("finish_reason", "")) if row else "",
            error=None if row else "the consumer engine returned no result for this request",
            notes=notes)

    def output(self, row: Mapping[str, Any] | None, case_id: str) -> Output:
        from harness.engines.launch.worker_run import output_from_fields

        if row is None:
            return Output(case_id, (), error="the consumer engine returned no result for this case")
        return output_from_fields(case_id, row)

    def comparator(self, name: str, params: Mapping[str, Any]) -> Comparator:
        """The suite's comparator ``name``; a page comparator names this suite in its verdicts."""
        comp = compare.build(name, params, self.decode)
        return replace(comp, suite=self.suite) if isinstance(comp, PageComparator) else comp  # type: ignore[type-var]

    def verdict(self, comp: Comparator, case: Case, ev: CaseEvidence, golden: Output | None,
                cons: Phase) -> Verdict:
        if isinstance(comp, PageComparator):
            return comp.judge_kv(case, ev)
        cand = self.output(cons.row("restore", case.id, "clean"), case.id)
        ref = self.output(cons.row("restore", case.id, "ref"), case.id)
        if golden is None:
            return Verdict(case.id, comp.key, "error", "no golden output for this case")
        v = comp.compare(golden, cand, case)
        pos = first_divergence(ref.token_ids, cand.token_ids)
        return replace(v, evidence={**v.evidence, "vs_in_engine_reference": "equal" if pos is None
                                    else f"differs at token {pos}"})

    def lane_controls(self, control: Case | None, lanes: Sequence[str], prod: Phase,
                      cons: Phase) -> tuple[list[Control], dict[str, Any]]:
        """The planted-fault lanes: the gate must fail them, naming the planted page.

        Returns the controls and, per lane, what was planted and the verdicts it got."""
        if control is None:
            return [], {}
        assert cons.capture is not None
        planted = read_planted(cons.capture.folder)
        out = []
        info: dict[str, Any] = {}
        for lane in lanes:
            ev = self.evidence(control, lane, prod, cons)
            v = ByteEqual(self.suite).judge_kv(control, ev)
            fact = planted.get(lane)
            info[lane] = {"case": control.id, "planted": fact, "byte_equal": v.to_json(),
                          "kv_hits": KVHits(self.suite).judge_kv(control, ev).to_json()}
            if fact is None:
                out.append(Control("byte_equal", f"engine lane {lane}: nothing planted", "fail",
                                   "unplantable", False, "the faulty store never served the chosen layer"))
                continue
            named = _names_planted(v, fact)
            who = "store" if "chunk" in fact else "tap, in the paged buffer after the load,"
            what = (f"{who} flips byte {fact.get('offset')} of layer {fact['layer']} tokens "
                    f"[{fact['start']}, {fact['end']})" if fact["kind"] == "flip" else
                    f"{who} drops layer {fact['layer']} tokens [{fact['start']}, {fact['end']})")
            out.append(Control("byte_equal", f"in-engine: {what}", "fail", v.status,
                               v.status == "fail" and named,
                               v.summary if named else
                               f"{v.summary}; the verdict does not name the planted page"))
            if fact["kind"] == "drop" and (cons.capture.setup or {}).get("failed_loads") == UNREPORTED:
                info[lane]["recompute"] = (
                    "not planted: vLLM cannot recompute a failed synchronous load with several KV-cache "
                    "groups (block-level failures make its scheduler raise), so the connector records "
                    "the page missing and reports nothing; kv_hits stays guarded by the in-memory controls")
            elif fact["kind"] == "drop":
                h = KVHits(self.suite).judge_kv(control, ev)
                out.append(Control("kv_hits", f"in-engine: {what} (engine recomputes it)", "fail",
                                   h.status, h.status == "fail", h.summary))
        return out, info

    def memory_controls(self, evs: Mapping[str, CaseEvidence], golden: Mapping[str, Output],
                        cases: Sequence[Case], specs: Sequence[ComparatorSpec]) -> list[Control]:
        """Every comparator's own controls (:mod:`harness.kinds.controls`), in memory: a page comparator's
        planted in a perfect restore of each case's real captured pages, the others in the goldens."""
        out: list[Control] = []
        for spec in specs:
            unit = compare.unit(spec.name)
            subjects = evs if unit.subject == "pages" else golden
            out += run_controls(self.comparator(spec.name, spec.params), unit.controls, cases, subjects)
        return out


def _names_planted(v: Verdict, fact: Mapping[str, Any]) -> bool:
    """Whether a verdict's evidence names the planted page (layer + token range, + byte for a flip)."""
    kind = "differ" if fact["kind"] == "flip" else "missing"
    for d in v.evidence.get(kind, ()):
        if d["layer"] == fact["layer"] and d["start"] == fact["start"] and d["end"] == fact["end"]:
            return fact["kind"] != "flip" or d.get("offset") == fact.get("offset")
    return False


def figures(prod: Phase, cons: Phase, judge: Judge, evs: Mapping[str, CaseEvidence],
            cases: Sequence[Case], kv_copies: int = 1) -> dict[str, Any]:
    """Pages compared, capture overhead, compare throughput vs memcpy, engine start times."""
    from harness.kinds.kv.bench import throughput

    t = prod.timings
    offs = [v for k, v in t.items() if k.startswith("pass_off")]
    ons = [v for k, v in t.items() if k.startswith("pass_on")]
    fig: dict[str, Any] = {
        "producer_engine_start_s": t.get("engine_start_s"),
        "consumer_engine_start_s": cons.timings.get("engine_start_s"),
        "pass_times_s": {k: round(v, 4) for k, v in t.items() if k.startswith("pass_")},
        "pages_compared": sum(len(e.expected) for e in evs.values()),
    }
    if offs and ons:
        off, on = float(np.median(offs)), float(np.median(ons))
        fig.update(record_off_s=off, record_on_s=on, capture_overhead_pct=(on / off - 1.0) * 100.0)
    if prod.capture is not None:
        # the connector's own clock over everything it captured, scaled to one record-on pass (the
        # write pass captures 1/copies of one): the low-noise view of the same overhead
        copies = max(1, int(kv_copies))
        per_pass = prod.capture.capture_seconds / (len(ons) + 1 / copies) if ons else 0.0
        fig["capture_seconds_in_connector"] = prod.capture.capture_seconds
        fig["capture_seconds_per_pass"] = per_pass
        fig["captured_bytes_producer"] = prod.capture.captured_bytes
        if offs:
            fig["capture_connector_pct"] = per_pass / float(np.median(offs)) * 100.0
    pairs: list[tuple[bytes, bytes]] = []
    for ev in evs.values():
        for r in ev.restored:
            w = ev.written.get(r.ref.id)
            if w is not None:
                try:
                    pairs.append((w.read(), r.read()))
                except CaptureError:
                    continue
    if pairs:
        by_case = {c.id: c for c in cases}
        bench = throughput(lambda: [ByteEqual().judge_kv(by_case[cid], ev) for cid, ev in evs.items()], pairs)
        fig["throughput"] = bench
        if bench.get("memcpy_Bps"):
            fig["compare_vs_memcpy"] = bench["compare_Bps"] / bench["memcpy_Bps"]
    return fig
