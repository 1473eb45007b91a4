"""kv_hits: the connector really served the prompt tokens it should, and the engine really used them.

A restore can be byte-equal and still useless: the engine may have recomputed the prefill (a failed
load under the ``recompute`` policy, a connector that claims tokens it never writes). Per request
this comparator checks, against ``expected = floor((N - 1) / C) * C``:

* the engine's own count (``num_cached_tokens``; prefix caching is off, so all of it is external);
* the connector's count (the tokens vLLM allocated for it to load);
* the pages actually restored: every layer's restored pages must cover ``[0, expected)`` (a
  sliding-window layer: from the first block inside the window of the first computed token);
* for the harness store, every chunk of the prompt was stored at most once (shared prefixes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from harness.api import Case, Output, Verdict
from harness.compare.unit import TOKENS, ControlSet, Mutation, Needs, PlantedEvidence, Unit
from harness.excerpt import first_line
from harness.kv_pages.evidence import CaseEvidence


def first_pages(ev: CaseEvidence) -> dict[tuple[str, int], int]:
    """Per expected (layer, shard): the token its first expected page starts at (0 for full
    attention; the first block inside the window for a sliding-window group, whose blocks before it
    vLLM gives no page)."""
    first: dict[tuple[str, int], int] = {}
    for r in ev.expected:
        lid = (r.layer, r.shard)
        first[lid] = min(first.get(lid, r.start), r.start)
    return first


def restored_cover(ev: CaseEvidence) -> int:
    """Tokens restored without a gap in every expected layer, from the layer's first expected page up
    to ``t`` (0 when any layer has a gap at that first page)."""
    spans: dict[tuple[str, int], set[tuple[int, int]]] = defaultdict(set)
    for p in ev.restored:
        spans[(p.ref.layer, p.ref.shard)].add((p.ref.start, p.ref.end))
    first = first_pages(ev) or dict.fromkeys(spans, 0)
    if not first:
        return 0
    cover = []
    for lid, start in first.items():
        end = start
        for s, e in sorted(spans.get(lid, ())):
            if e <= start:
                continue
            if s != end:
                break
            end = e
        cover.append(end if end > start else 0)
    return min(cover)


@dataclass(frozen=True, slots=True)
class KVHits:
    key = "kv_hits"
    needs_scores = False
    suite: str = ""

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        return Verdict(case.id, self.key, "skip", "kv_hits judges connector hit counts, not tokens",
                       detail="run this suite through the KV round trip (a suite with a [kv] table)")

    def judge_kv(self, case: Case, ev: CaseEvidence) -> Verdict:
        want = ev.expected_hit
        cover = restored_cover(ev)
        evidence = {"expected": want, "engine_cached": ev.engine_cached,
                    "connector_matched": ev.connector_matched, "connector_external": ev.connector_external,
                    "restored_tokens": cover, "prompt_len": ev.prompt_len, "chunk_size": ev.chunk_size,
                    "stored_times": dict(ev.stored_times), "lane": ev.lane}
        name = f"{self.suite}/{case.id}" if self.suite else case.id
        if ev.error is not None or ev.finish_reason == "error":
            why = ev.error or "the engine finished the request with an error"
            return Verdict(case.id, self.key, "error", first_line(f"kv_hits error: {why}"),
                           detail=f"{name}: kv_hits ERROR\n  {why}", evidence=evidence)
        problems = []
        if ev.engine_cached is None:
            problems.append("the engine reported no num_cached_tokens for the request")
        elif ev.engine_cached != want:
            problems.append(f"engine      : {ev.engine_cached} prompt tokens cached, expected {want}")
        if ev.connector_external is None:
            problems.append("connector   : never saw the request (no hit count recorded)")
        elif ev.connector_external != want:
            problems.append(f"connector   : served {ev.connector_external} tokens, expected {want}")
        if cover != want:
            windowed = any(start > 0 for start in first_pages(ev).values())
            claim = ev.connector_external if ev.connector_external is not None else ev.engine_cached
            hint = " -> tokens were claimed but not restored (silent recompute)" if (
                claim is not None and claim > cover) else ""
            problems.append(f"restored    : pages cover [0, {cover}) in every layer, expected [0, {want})"
                            f"{' (sliding-window layers from their window)' if windowed else ''}"
                            + hint)
        twice = {k: n for k, n in ev.stored_times.items() if n > 1}
        if twice:
            problems.append(f"store       : {len(twice)} chunk(s) stored more than once, e.g. "
                            f"{next(iter(twice))[:12]} x{next(iter(twice.values()))}")
        counts = (f"engine {ev.engine_cached}, connector {ev.connector_external}, restored {cover}")
        if not problems:
            text = f"{want}/{ev.prompt_len} prompt tokens from the connector ({counts})"
            return Verdict(case.id, self.key, "pass", f"kv_hits pass: {text}", evidence=evidence)
        lines = [f"{name}: kv_hits FAIL — expected {want} of {ev.prompt_len} prompt tokens from the "
                 f"connector (floor(({ev.prompt_len} - 1) / {ev.chunk_size}) * {ev.chunk_size})",
                 *[f"  {p}" for p in problems]]
        return Verdict(case.id, self.key, "fail", f"kv_hits FAIL: expected {want}, {counts}",
                       detail="\n".join(lines), evidence=evidence)


# ---------------------------------------------------------------------------------------------
# controls: faults planted in a perfect restore of each case (CaseEvidence.as_written)


def _hit_base(ev: CaseEvidence) -> CaseEvidence | str:
    if not ev.expected_hit:
        return f"no token expected from the connector ({ev.prompt_len} tokens, chunk {ev.chunk_size})"
    return ev.as_written()


def plant_no_cached(comp: Any, case: Case, ev: CaseEvidence) -> PlantedEvidence | str:
    base = _hit_base(ev)
    return base if isinstance(base, str) else PlantedEvidence(replace(base, engine_cached=0))


def plant_half_restored(comp: Any, case: Case, ev: CaseEvidence) -> PlantedEvidence | str:
    base = _hit_base(ev)
    if isinstance(base, str):
        return base
    if len(base.restored) < 2:
        return "fewer than two pages to restore half of"
    return PlantedEvidence(replace(base, restored=base.restored[: len(base.restored) // 2]))


def plant_perfect(comp: Any, case: Case, ev: CaseEvidence) -> PlantedEvidence | str:
    base = _hit_base(ev)
    return base if isinstance(base, str) else PlantedEvidence(base)


UNIT = Unit(KVHits, "the connector serves the expected prefix and the engine uses it", needs=TOKENS,
            across_devices="any", controls=ControlSet(needs=Needs(pages=True), mutations=(
                Mutation("engine reports 0 cached tokens (silent recompute)", "fail", plant_no_cached),
                Mutation("half the claimed pages never restored", "fail", plant_half_restored),
                Mutation("a perfect restore", "pass", plant_perfect),
            )))
