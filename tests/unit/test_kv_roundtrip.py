"""The round trip's planning and judging, without engines: passes, refusals, evidence from captures."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.api import Case
from harness.compare.byte_equal import ByteEqual
from harness.kinds.kv.capture import PageTag, read_capture
from harness.kinds.kv.capture_write import CaptureWriter, SchedulerLog
from harness.kinds.kv.judge import Judge
from harness.kinds.kv.passes import Phase, consumer_passes, producer_passes
from harness.kinds.kv.refusal import refusal_controls, refusal_verdicts
from harness.kinds.kv.settings import KVSettings
from harness.kv_pages.identity import PageRef, prefix_keys
from tests.pins import PIN

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
CASE = Case("c1", tuple(range(2, 2 + 70)))


def test_timing_passes_never_share_a_prefix_with_each_other_or_the_workload() -> None:
    cases = [CASE, Case("c2", tuple(range(100, 140)))]
    passes = producer_passes(cases, reps=2, vocab=512, copies=3)
    assert [p["name"] for p in passes] == ["warm", "off0", "on0", "off1", "on1", "write"]
    first_blocks = [tuple(r["prompt_ids"][:32]) for p in passes for r in p["requests"]]
    assert len(first_blocks) == len(set(first_blocks))  # every request: a different first block
    for p in passes[1:-1]:
        assert len(p["requests"]) == 3 * len(cases)
        on = p["name"].startswith("on")
        assert all(r["lane"] == "scratch" and r["capture"] == on for r in p["requests"])
        assert sorted(len(r["prompt_ids"]) for r in p["requests"]) == sorted([40, 70] * 3)
    assert [r["lane"] for r in passes[-1]["requests"]] == ["clean", "clean"]


def test_consumer_lanes_clean_reference_and_controls() -> None:
    (p,) = consumer_passes([CASE], CASE, ["flip", "drop"])
    lanes = [(r["lane"], r.get("passive", False), r.get("skip_reading", False)) for r in p["requests"]]
    assert lanes == [("clean", False, False), ("ref", True, True), ("flip", False, False),
                     ("drop", False, False)]


def phase(tmp_path: Path, name: str, ok: bool, reason: str = "") -> Phase:
    cap = read_capture(tmp_path) if (tmp_path / "scheduler.jsonl").exists() else None
    return Phase(name, ok, reason, PIN.version, {}, (), cap, tmp_path / "none.log")


def test_the_refusal_probe_must_refuse_and_name_group_and_both_sizes(tmp_path: Path) -> None:
    kv = KVSettings(refuse_chunk_size=48)
    started = refusal_verdicts(phase(tmp_path, "refusal", True), kv)
    assert [v.status for v in started] == ["pass", "fail"] and "was accepted" in started[1].summary
    crashed = refusal_verdicts(phase(tmp_path, "refusal", False, "RuntimeError: boom"), kv)
    assert [v.status for v in crashed] == ["error", "fail"]
    SchedulerLog(tmp_path).write("refused", reason="chunk_size 48 is bad")
    vague = refusal_verdicts(phase(tmp_path, "refusal", False, "x"), kv)
    assert [v.status for v in vague] == ["refused", "fail"] and "group 0" in vague[1].summary
    SchedulerLog(tmp_path).write("refused", reason="chunk_size 48 is not a multiple of KV-cache group 0's "
                                                   "block size 32 (FullAttentionSpec)")
    named = refusal_verdicts(phase(tmp_path, "refusal", False, "x"), kv)
    assert [v.status for v in named] == ["refused", "pass"]


def test_the_refusal_gate_has_controls_that_bite(tmp_path: Path) -> None:
    """kv_refusal is gated: an engine that starts anyway, and a refusal that does not name the
    group, are planted against the real refusal and must both fail it."""
    kv = KVSettings(refuse_chunk_size=48)
    SchedulerLog(tmp_path).write("refused", reason="chunk_size 48 is not a multiple of KV-cache group 0's "
                                                   "block size 32 (FullAttentionSpec)")
    controls = refusal_controls(phase(tmp_path, "refusal", False, "x"), kv)
    assert [(c.mutation, c.got, c.ok) for c in controls] == [
        ("the engine starts with the off-grid chunk size", "fail", True),
        ("the refusal does not name the group", "fail", True)]


def capture_pages(folder: Path, side: str, lane: str, flip: bool = False) -> None:
    data = torch.arange(2 * 2 * 64, dtype=torch.float32).reshape(2, 2, 64) + 1
    if flip:
        data.view(torch.uint8).reshape(2, -1)[1, 9] ^= 1
    keys = prefix_keys(CASE.prompt_ids, 32)
    w = CaptureWriter(folder)
    for layer in LAYERS:
        refs = [PageRef(keys[j], layer, 0, 32 * j, 32 * (j + 1)) for j in range(2)]
        w.pages(side, refs, [PageTag("r", "c1", lane)] * 2, data)  # type: ignore[arg-type]
    w.close()


def setup(folder: Path) -> SchedulerLog:
    log = SchedulerLog(folder)
    log.write("setup", groups=[{"index": 0, "block_size": 32, "layers": LAYERS, "paged": True}], tp=1)
    return log


def test_evidence_from_captures_judges_pages_by_identity(tmp_path: Path) -> None:
    prod_dir, cons_dir = tmp_path / "producer", tmp_path / "consumer"
    setup(prod_dir)
    setup(cons_dir).write("request", req="r", case="c1", lane="clean", prompt_len=70, local_hit=0,
                          matched=64, external=64, **{"async": False})
    capture_pages(prod_dir, "written", "clean")
    capture_pages(cons_dir, "restored", "clean")
    capture_pages(cons_dir, "restored", "flip", flip=True)
    prod, cons = phase(prod_dir, "producer", True), phase(cons_dir, "consumer", True)
    judge = Judge("tiny-llama", "kv_roundtrip", 32)
    ev = judge.evidence(CASE, "clean", prod, cons)
    assert ev.expected_hit == 64 and len(ev.expected) == 4 and ev.connector_external == 64
    assert ByteEqual().judge_kv(CASE, ev).status == "pass"
    bad = ByteEqual().judge_kv(CASE, judge.evidence(CASE, "flip", prod, cons))
    assert bad.status == "fail"
    assert [(d["start"], d["offset"]) for d in bad.evidence["differ"]] == [(32, 9)] * 2


def test_a_store_folder_gone_is_a_named_error_for_every_expected_page(tmp_path: Path) -> None:
    prod_dir, cons_dir = tmp_path / "producer", tmp_path / "consumer"
    setup(prod_dir)
    capture_pages(prod_dir, "written", "clean")
    setup(cons_dir).write("store_problem", req="r", case="c1", lane="clean", kind="unreadable",
                          reason="store folder run/store does not exist")
    (cons_dir / "worker-0.pages.jsonl").touch()
    ev = Judge("m", "s", 32).evidence(CASE, "clean", phase(prod_dir, "p", True), phase(cons_dir, "c", True))
    v = ByteEqual().judge_kv(CASE, ev)
    assert v.status == "error" and len(v.evidence["errors"]) == 4
    assert "store folder run/store does not exist" in v.detail
