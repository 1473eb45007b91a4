"""byte_equal: every KV page restored from a connector is byte-for-byte the page the engine wrote.

Pages are matched by identity (token-prefix key, layer, shard), never by block id. Digests are
compared first; bytes are read only when the digests differ, to name the first differing byte and
count the differing bytes. A page that was expected back but never restored is ``missing``; a page
restored outside the expected range, or one the producer never wrote, is ``extra``; both fail. A page
the store could not serve because its file is truncated or corrupted, or a capture file that cannot
be read back, is an ``error`` naming that page: never a silent pass.

It judges KV pages, not generated tokens: the KV round trip (:mod:`harness.kinds.kv.roundtrip`) calls
:meth:`ByteEqual.judge_kv` with one case's :class:`~harness.kv_pages.evidence.CaseEvidence`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from harness.api import Case, Output, Verdict
from harness.compare.unit import TOKENS, ControlSet, Mutation, Needs, PlantedEvidence, Unit
from harness.kv_pages.evidence import CaptureError, CaseEvidence, MemoryPage, Page
from harness.kv_pages.identity import PageRef

SHOW = 8
"""Pages listed per kind in a failure's detail (all of them are in the evidence)."""


def diff_bytes(a: bytes, b: bytes) -> tuple[int | None, int]:
    """(first differing byte offset, number of differing bytes); a length difference counts.

    Equal pages (digests by two algorithms, or ones that differ only in how they were taken) cost
    one ``memcmp``; pages that differ are compared byte by byte in numpy."""
    if a == b:
        return None, 0
    x, y = np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)
    n = min(x.size, y.size)
    neq = x[:n] != y[:n]
    count = int(np.count_nonzero(neq)) + abs(x.size - y.size)
    if neq.any():
        return int(np.argmax(neq)), count
    return (n, count) if x.size != y.size else (None, 0)


def _ref_json(r: PageRef) -> dict[str, Any]:
    return {"key": r.key, "layer": r.layer, "group": r.group, "start": r.start, "end": r.end,
            "shard": r.shard}


class PageJudgement(NamedTuple):
    """How one expected or restored page fared (a named tuple: a gate makes one per page, and a
    frozen dataclass costs four times as much to build as the digest comparison it reports)."""

    ref: PageRef
    kind: str
    """``equal``, ``differ``, ``missing``, ``extra`` or ``error``."""
    written_digest: str = ""
    restored_digest: str = ""
    nbytes: int = 0
    offset: int | None = None
    count: int = 0
    reason: str = ""

    def line(self) -> str:
        where = self.ref.describe()
        if self.kind == "differ":
            return (f"{where}\n      first difference at byte {self.offset} of {self.nbytes}, "
                    f"{self.count} byte{'s' if self.count != 1 else ''} differ\n"
                    f"      written {self.written_digest}  restored {self.restored_digest}")
        return f"{where}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        d = {**_ref_json(self.ref), "kind": self.kind}
        if self.kind == "differ":
            d.update(offset=self.offset, count=self.count, nbytes=self.nbytes,
                     written_digest=self.written_digest, restored_digest=self.restored_digest)
        elif self.reason:
            d["reason"] = self.reason
        return d


def _digest(data: bytes) -> str:
    """The engine's page digest of host bytes. Imported on use: its module carries the GPU kernels
    (torch), which judging and planting on the host never need."""
    from harness.kv_pages.digest import digest_bytes

    return digest_bytes(data)


def _matches(data: bytes, digest: str) -> bool | None:
    """Whether ``data`` has ``digest``, by the algorithm the digest names (imported on use, as above)."""
    from harness.kv_pages.digest import matches

    return matches(data, digest)


def _read_checked(page: Page, side: str) -> bytes | str:
    """The page's bytes, or why they cannot be trusted (unreadable, or not what was digested)."""
    try:
        data = page.read()
    except CaptureError as e:
        return f"{side} bytes unreadable: {e}"
    if _matches(data, page.digest) is False:  # by the algorithm the digest names
        return f"{side} capture file corrupted: its bytes no longer match the digest taken in the engine"
    return data


def judge_page(ref: PageRef, written: Page, restored: Page) -> PageJudgement:
    if (why := written.check_present()) is not None:
        return PageJudgement(ref, "error", reason=f"written capture {why}")
    if (why := restored.check_present()) is not None:
        return PageJudgement(ref, "error", reason=f"restored capture {why}")
    if written.digest == restored.digest and written.nbytes == restored.nbytes:  # the same algorithm too
        return PageJudgement(ref, "equal", written.digest, restored.digest, written.nbytes)
    a, b = _read_checked(written, "written"), _read_checked(restored, "restored")
    if isinstance(a, str) or isinstance(b, str):
        why = a if isinstance(a, str) else str(b)
        return PageJudgement(ref, "error", written.digest, restored.digest, reason=why)
    offset, count = diff_bytes(a, b)
    if count == 0:
        return PageJudgement(ref, "equal", written.digest, restored.digest, len(a))
    return PageJudgement(ref, "differ", written.digest, restored.digest, len(a), offset, count)


ERROR_PROBLEMS = ("truncated", "corrupt", "unreadable")


def judge_pages(expected: Sequence[PageRef], written: Mapping[tuple[str, str, int], Page],
                restored: Iterable[Page], problems: Mapping[tuple[str, str, int], tuple[str, str]],
                expected_hit: int = 0) -> list[PageJudgement]:
    """Every expected page and every restored page, judged. ``problems``: id -> (kind, reason)."""
    got: dict[tuple[str, str, int], Page] = {}
    extra: list[PageJudgement] = []
    for p in restored:
        if p.ref.id in got:
            extra.append(PageJudgement(p.ref, "extra", restored_digest=p.digest,
                                       reason="restored twice for the same request"))
        got[p.ref.id] = p
    want = {r.id for r in expected}
    out = []
    for ref in expected:
        r = got.get(ref.id)
        if r is None:
            kind, reason = problems.get(ref.id, ("missing", "expected back, never restored"))
            out.append(PageJudgement(ref, "error" if kind in ERROR_PROBLEMS else "missing",
                                     reason=f"{kind}: {reason}"))
            continue
        w = written.get(ref.id)
        if w is None:
            out.append(PageJudgement(ref, "extra", restored_digest=r.digest,
                                     reason="restored, but the producer never wrote this page"))
            continue
        out.append(judge_page(ref, w, r))
    for pid, r in got.items():
        if pid not in want:
            why = ("the producer never wrote this page" if pid not in written else
                   f"outside the expected hit range [0, {expected_hit})")
            extra.append(PageJudgement(r.ref, "extra", restored_digest=r.digest, reason=f"restored, {why}"))
    return out + extra


@dataclass(frozen=True, slots=True)
class ByteEqual:
    key = "byte_equal"
    needs_scores = False
    suite: str = ""

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict:
        return Verdict(case.id, self.key, "skip", "byte_equal judges KV pages, not tokens",
                       detail="run this suite through the KV round trip (a suite with a [kv] table: "
                              "make gate MODEL=<model> SUITE=<suite>)")

    def judge_kv(self, case: Case, ev: CaseEvidence) -> Verdict:
        problems = {p.ref.id: (p.kind, p.reason) for p in ev.problems}
        pages = judge_pages(ev.expected, ev.written, ev.restored, problems, ev.expected_hit)
        by: dict[str, list[PageJudgement]] = {k: [] for k in ("equal", "differ", "missing", "extra", "error")}
        for j in pages:
            by[j.kind].append(j)
        n = len(ev.expected)
        layers = sorted({r.layer for r in ev.expected})
        evidence = {
            "pages": n, "equal": len(by["equal"]), "differ": [j.to_json() for j in by["differ"]],
            "missing": [j.to_json() for j in by["missing"]], "extra": [j.to_json() for j in by["extra"]],
            "errors": [j.to_json() for j in by["error"]], "layers": layers,
            "bytes": sum(j.nbytes for j in by["equal"] + by["differ"]), "lane": ev.lane,
            "expected_hit": ev.expected_hit,
        }
        name = f"{self.suite}/{case.id}" if self.suite else case.id
        if not (by["differ"] or by["missing"] or by["extra"] or by["error"]):
            text = (f"{n}/{n} pages byte-equal across {len(layers)} layers" if n else
                    f"no page expected back ({ev.prompt_len} tokens, chunk {ev.chunk_size}), "
                    f"none restored")
            return Verdict(case.id, self.key, "pass", f"byte_equal pass: {text}", evidence=evidence)
        status = "fail" if (by["differ"] or by["missing"] or by["extra"]) else "error"
        head = (f"{len(by['equal'])}/{n} pages byte-equal, {len(by['differ'])} differ, "
                f"{len(by['missing'])} missing, {len(by['extra'])} extra"
                + (f", {len(by['error'])} error" if by["error"] else ""))
        lines = [f"{name}: byte_equal {status.upper()} — {head}",
                 f"  model      : {ev.model}   lane: {ev.lane}   prompt {ev.prompt_len} tokens, "
                 f"expected back [0, {ev.expected_hit}) in chunks of {ev.chunk_size}"]
        for kind, label in (("differ", "differs"), ("missing", "missing"), ("extra", "extra"),
                            ("error", "error")):
            for j in by[kind][:SHOW]:
                lines.append(f"  {label:<10} : {j.line()}")
            if len(by[kind]) > SHOW:
                lines.append(f"  {'':<10}   ... and {len(by[kind]) - SHOW} more (see the evidence)")
        lines += [f"  {note}" for note in ev.notes]
        return Verdict(case.id, self.key, status, f"byte_equal {status.upper()}: {head}",
                       detail="\n".join(lines), evidence=evidence)


def summary_line(verdicts: Iterable[Verdict]) -> str:
    """``kv-roundtrip: 412/412 pages byte-equal across 2 layers, 0 missing, 0 extra``."""
    pages = equal = missing = extra = differ = errors = 0
    layers: set[str] = set()
    for v in verdicts:
        if v.comparator != ByteEqual.key:
            continue
        e = v.evidence
        pages += int(e.get("pages", 0))
        equal += int(e.get("equal", 0))
        differ += len(e.get("differ", ()))
        missing += len(e.get("missing", ()))
        extra += len(e.get("extra", ()))
        errors += len(e.get("errors", ()))
        layers.update(e.get("layers", ()))
    text = (f"kv-roundtrip: {equal}/{pages} pages byte-equal across {len(layers)} layers, "
            f"{missing} missing, {extra} extra")
    if differ:
        text += f", {differ} differ"
    if errors:
        text += f", {errors} error"
    return text


# ---------------------------------------------------------------------------------------------
# controls: faults planted in a perfect restore of each case (CaseEvidence.as_written)


def _middle(ev: CaseEvidence) -> int | str:
    if not ev.restored:
        return f"no page expected back ({ev.prompt_len} tokens, chunk {ev.chunk_size})"
    i = len(ev.restored) // 2
    return i if ev.restored[i].nbytes else "the page to plant in is empty"


def plant_flip(comp: Any, case: Case, ev: CaseEvidence) -> PlantedEvidence | str:
    base = ev.as_written()
    if isinstance(base, str):
        return base
    if isinstance(i := _middle(base), str):
        return i
    page = base.restored[i]
    b = bytearray(page.read())
    at = len(b) // 2
    b[at] ^= 0x01
    flipped = MemoryPage(page.ref, _digest(bytes(b)), bytes(b))
    return PlantedEvidence(replace(base, restored=(*base.restored[:i], flipped, *base.restored[i + 1:])),
                           f"byte {at} of {page.ref.describe()}")


def plant_drop(comp: Any, case: Case, ev: CaseEvidence) -> PlantedEvidence | str:
    base = ev.as_written()
    if isinstance(base, str):
        return base
    if not base.restored:
        return f"no page expected back ({ev.prompt_len} tokens, chunk {ev.chunk_size})"
    return PlantedEvidence(replace(base, restored=base.restored[:-1]), base.restored[-1].ref.describe())


def plant_as_written(comp: Any, case: Case, ev: CaseEvidence) -> PlantedEvidence | str:
    base = ev.as_written()
    return base if isinstance(base, str) else PlantedEvidence(base)


UNIT = Unit(ByteEqual, "every restored KV page byte-equal to what was written", needs=TOKENS,
            across_devices="any", controls=ControlSet(needs=Needs(pages=True), mutations=(
                Mutation("flip one byte of one page", "fail", plant_flip),
                Mutation("drop one page", "fail", plant_drop),
                Mutation("identical copy", "pass", plant_as_written),
            )))
