"""byte_equal and kv_hits on synthetic round trips: each failure kind fails, and says where."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.api import Case
from harness.compare import build
from harness.compare.byte_equal import ByteEqual, diff_bytes, summary_line
from harness.compare.kv_hits import KVHits
from harness.kv_pages.digest import digest_bytes
from harness.kv_pages.evidence import CaseEvidence, MemoryPage, Problem
from harness.kv_pages.identity import PageRef, expected_hit_tokens, prefix_keys
from tests.conftest import make_output

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
PAGE = 512


def evidence(n_prompt: int = 137, chunk: int = 64, seed: int = 0) -> CaseEvidence:
    ids = list(range(7, 7 + n_prompt))
    hit = expected_hit_tokens(n_prompt, chunk)
    rng = np.random.default_rng(seed)
    expected, written, restored = [], {}, []
    for layer in LAYERS:
        for j, key in enumerate(prefix_keys(ids, 32, hit)):
            ref = PageRef(key, layer, 0, 32 * j, 32 * (j + 1))
            data = rng.integers(0, 256, PAGE, dtype=np.uint8).tobytes()
            expected.append(ref)
            written[ref.id] = MemoryPage(ref, digest_bytes(data), data)
            restored.append(MemoryPage(ref, digest_bytes(data), data))
    return CaseEvidence("tiny-llama", "c01", "clean", n_prompt, chunk, hit, tuple(expected), written,
                        tuple(restored), engine_cached=hit, connector_matched=hit, connector_external=hit)


CASE = Case("c01", tuple(range(7, 144)))


def flipped(ev: CaseEvidence, i: int, offset: int) -> CaseEvidence:
    r = list(ev.restored)
    b = bytearray(r[i].data)
    b[offset] ^= 0x10
    r[i] = MemoryPage(r[i].ref, digest_bytes(bytes(b)), bytes(b))
    return replace(ev, restored=tuple(r))


def test_a_clean_round_trip_passes_and_counts_pages_and_layers() -> None:
    v = ByteEqual("kv_roundtrip").judge_kv(CASE, evidence())
    assert v.status == "pass" and v.summary == "byte_equal pass: 8/8 pages byte-equal across 2 layers"
    assert v.evidence["bytes"] == 8 * PAGE
    assert summary_line([v, v]) == "kv-roundtrip: 16/16 pages byte-equal across 2 layers, 0 missing, 0 extra"


def test_one_flipped_byte_fails_naming_model_layer_range_offset_count_and_both_digests() -> None:
    ev = evidence()
    bad = flipped(ev, 5, 300)
    v = ByteEqual("kv_roundtrip").judge_kv(CASE, bad)
    assert v.status == "fail"
    d = v.evidence["differ"][0]
    ref = ev.restored[5].ref
    got = (d["layer"], d["start"], d["end"], d["offset"], d["count"])
    assert got == (ref.layer, ref.start, ref.end, 300, 1)
    assert d["written_digest"] == ev.restored[5].digest and d["restored_digest"] == bad.restored[5].digest
    for needle in ("kv_roundtrip/c01: byte_equal FAIL", "tiny-llama", ref.layer,
                   f"tokens [{ref.start}, {ref.end})", "first difference at byte 300 of 512, 1 byte differ",
                   ev.restored[5].digest):
        assert needle in v.detail, needle
    assert summary_line([v]).endswith("0 missing, 0 extra, 1 differ")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 7), st.integers(0, PAGE - 1))
def test_any_flip_anywhere_is_found_at_its_exact_offset(i: int, offset: int) -> None:
    v = ByteEqual().judge_kv(CASE, flipped(evidence(), i, offset))
    assert v.status == "fail" and [(d["offset"], d["count"]) for d in v.evidence["differ"]] == [(offset, 1)]


def test_a_page_never_restored_is_missing_and_fails() -> None:
    ev = evidence()
    v = ByteEqual().judge_kv(CASE, replace(ev, restored=ev.restored[1:]))
    assert v.status == "fail" and len(v.evidence["missing"]) == 1
    assert "expected back, never restored" in v.detail


def test_a_dropped_page_reported_by_the_store_fails_with_its_reason() -> None:
    ev = evidence()
    ev = replace(ev, restored=ev.restored[1:],
                 problems=(Problem(ev.restored[0].ref, "missing", "page not in the store (planted drop)"),))
    v = ByteEqual().judge_kv(CASE, ev)
    assert v.status == "fail" and "planted drop" in v.evidence["missing"][0]["reason"]


def test_a_corrupted_store_file_is_a_named_error_not_a_pass() -> None:
    ev = evidence()
    ref = ev.restored[2].ref
    ev = replace(ev, restored=ev.restored[:2] + ev.restored[3:],
                 problems=(Problem(ref, "truncated", "ab/ab00/model.layers.0.self_attn.attn.kv: cut short"),))
    v = ByteEqual().judge_kv(CASE, ev)
    assert v.status == "error" and v.evidence["errors"][0]["start"] == ref.start
    assert "cut short" in v.detail and "byte_equal ERROR" in v.summary


def test_extra_pages_fail_outside_the_range_or_never_written() -> None:
    ev = evidence()
    stray_ref = PageRef("f" * 32, LAYERS[0], 0, 128, 160)
    stray = MemoryPage(stray_ref, digest_bytes(b"x"), b"x")
    v = ByteEqual().judge_kv(CASE, replace(ev, restored=ev.restored + (stray,)))
    assert v.status == "fail" and "never wrote" in v.evidence["extra"][0]["reason"]
    ev2 = replace(ev, written={**ev.written, stray_ref.id: stray}, restored=ev.restored + (stray,))
    v = ByteEqual().judge_kv(CASE, ev2)
    assert v.status == "fail"
    assert "outside the expected hit range [0, 128)" in v.evidence["extra"][0]["reason"]


@dataclass(frozen=True)
class Unreadable:
    """A page whose bytes must not be needed: reading them fails the test."""

    ref: PageRef
    digest: str
    nbytes: int

    def read(self) -> bytes:
        raise AssertionError("bytes were read although the digests matched")

    def check_present(self) -> str | None:
        return None


def test_digests_first_bytes_only_on_mismatch() -> None:
    ev = evidence()
    ev = replace(ev, written={k: Unreadable(p.ref, p.digest, p.nbytes) for k, p in ev.written.items()},
                 restored=tuple(Unreadable(p.ref, p.digest, p.nbytes) for p in ev.restored))
    assert ByteEqual().judge_kv(CASE, ev).status == "pass"


def test_a_capture_whose_bytes_no_longer_match_its_digest_is_an_error() -> None:
    ev = evidence()
    p = ev.restored[0]
    liar = MemoryPage(p.ref, "mx128:" + "0" * 32, p.data)  # digest says one thing, bytes another
    v = ByteEqual().judge_kv(CASE, replace(ev, restored=(liar,) + ev.restored[1:]))
    assert v.status == "error" and "capture file corrupted" in v.evidence["errors"][0]["reason"]


def test_digests_by_two_algorithms_are_settled_by_the_bytes() -> None:
    """A producer with xxhash (xxh128) and a consumer without it (mx128): the digests cannot be
    compared, so the bytes are; equal bytes pass, a flipped byte fails at its offset, and each side's
    bytes are still checked against its own digest."""
    ev = evidence()
    mixed = tuple(MemoryPage(p.ref, digest_bytes(p.data, "mx128"), p.data) for p in ev.restored)
    assert {p.digest.split(":")[0] for p in ev.written.values()} == {"xxh128"}
    v = ByteEqual().judge_kv(CASE, replace(ev, restored=mixed))
    assert v.status == "pass" and v.evidence["equal"] == len(mixed)
    bad = bytearray(mixed[2].data)
    bad[77] ^= 4
    flipped = MemoryPage(mixed[2].ref, digest_bytes(bytes(bad), "mx128"), bytes(bad))
    v = ByteEqual().judge_kv(CASE, replace(ev, restored=mixed[:2] + (flipped,) + mixed[3:]))
    assert v.status == "fail" and [(d["offset"], d["count"]) for d in v.evidence["differ"]] == [(77, 1)]
    liar = MemoryPage(mixed[1].ref, mixed[1].digest, bytes(bad))  # its own mx128 digest no longer holds
    v = ByteEqual().judge_kv(CASE, replace(ev, restored=mixed[:1] + (liar,) + mixed[2:]))
    assert v.status == "error" and "capture file corrupted" in v.evidence["errors"][0]["reason"]


def test_nothing_expected_and_nothing_restored_passes_and_says_why() -> None:
    v = ByteEqual().judge_kv(CASE, evidence(40))
    assert v.status == "pass" and "no page expected back (40 tokens, chunk 64)" in v.summary


def test_diff_bytes() -> None:
    assert diff_bytes(b"abc", b"abc") == (None, 0)
    assert diff_bytes(b"abc", b"abd") == (2, 1)
    assert diff_bytes(b"abc", b"ab") == (2, 1)
    assert diff_bytes(bytes(8), b"\x01" * 8) == (0, 8)
    page = bytes(range(256)) * 64
    assert diff_bytes(page, bytes(bytearray(page))) == (None, 0)  # two buffers, equal bytes


def test_registered_and_harmless_on_token_outputs() -> None:
    out = make_output("c01", [1, 2, 3])
    for name in ("byte_equal", "kv_hits"):
        assert build(name, {}).compare(out, out, CASE).status == "skip"


# ---------------------------------------------------------------------------------------------
# kv_hits


def test_hits_pass_when_engine_connector_and_restored_pages_agree() -> None:
    v = KVHits().judge_kv(CASE, evidence())
    assert v.status == "pass" and "128/137 prompt tokens" in v.summary


def test_a_silent_recompute_fails_even_with_byte_equal_pages() -> None:
    ev = replace(evidence(), engine_cached=0)
    assert ByteEqual().judge_kv(CASE, ev).status == "pass"
    v = KVHits().judge_kv(CASE, ev)
    assert v.status == "fail" and "engine      : 0 prompt tokens cached, expected 128" in v.detail


def test_claimed_but_not_restored_is_named_as_such() -> None:
    ev = evidence()
    ev = replace(ev, restored=tuple(p for p in ev.restored if p.ref.start != 64))
    v = KVHits().judge_kv(CASE, ev)
    assert v.status == "fail" and "cover [0, 64)" in v.detail and "silent recompute" in v.detail


def test_connector_count_mismatch_and_double_store_fail() -> None:
    v = KVHits().judge_kv(CASE, replace(evidence(), connector_external=64))
    assert v.status == "fail" and "connector   : served 64 tokens, expected 128" in v.detail
    v = KVHits().judge_kv(CASE, replace(evidence(), stored_times={"a" * 32: 2}))
    assert v.status == "fail" and "stored more than once" in v.detail


def test_a_failed_request_is_an_error() -> None:
    v = KVHits().judge_kv(CASE, replace(evidence(), finish_reason="error"))
    assert v.status == "error"


def windowed(ev: CaseEvidence, layer: str, first: int) -> CaseEvidence:
    """``layer`` as a sliding-window layer: no page (expected or restored) before token ``first``."""
    keep = lambda ref: ref.layer != layer or ref.start >= first  # noqa: E731
    return replace(ev, expected=tuple(r for r in ev.expected if keep(r)),
                   restored=tuple(p for p in ev.restored if keep(p.ref)))


def test_a_sliding_window_layer_is_covered_from_its_window() -> None:
    ev = windowed(evidence(), LAYERS[1], 64)  # 128 tokens served, window 64: blocks 2 and 3 only
    assert KVHits().judge_kv(CASE, ev).status == "pass"
    assert ByteEqual().judge_kv(CASE, ev).status == "pass"
    # the window's first page never restored: a gap at the layer's start, not a pass
    gap = replace(ev, restored=tuple(p for p in ev.restored if (p.ref.layer, p.ref.start) != (LAYERS[1], 64)))
    v = KVHits().judge_kv(CASE, gap)
    assert v.status == "fail" and "sliding-window layers from their window" in v.detail
    assert v.evidence["restored_tokens"] == 0
    # a page missing in the middle of the window stops the cover there
    mid = replace(ev, restored=tuple(p for p in ev.restored if (p.ref.layer, p.ref.start) != (LAYERS[1], 96)))
    assert KVHits().judge_kv(CASE, mid).evidence["restored_tokens"] == 96
