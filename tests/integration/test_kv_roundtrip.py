"""The KV round-trip gate with the REAL pinned vLLM on CPU: write -> fresh engine -> compare.

One gate run, shared by every test here: three engine starts (producer, consumer, the refusal
probe; ≈1 min each on 2 cores). The planted-fault lanes (one byte flipped, one page dropped) run
inside the same consumer engine, so they cost no extra start.

``HARNESS_KV_TAP_TEST=1`` also runs the tap around vLLM's ExampleConnector (two more starts): the
suite finds its off-by-one at N = k*32 + 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.kinds.kv.capture import read_capture
from harness.kv_pages.identity import prefix_keys
from harness.pipeline import GateResult, run_gate_by_name
from harness.records import load_record
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import PIN

pytestmark = pytest.mark.integration

EXPECTED_HITS = {"n_lt_c": 0, "n_eq_c": 0, "n_c_plus_1": 64, "n_2c_plus_k": 128, "shared_a": 64,
                 "shared_b": 128}


@pytest.fixture(scope="module")
def kv_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[GateResult, Workspace]:
    import shutil

    root = tmp_path_factory.mktemp("kv")
    for sub in ("suites", "models", "goldens"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    ws = Workspace(root)
    return run_gate_by_name(ws, "tiny-llama", "kv_roundtrip", "vllm", auto_record=False), ws


def by(res: GateResult, comparator: str) -> dict[str, object]:
    return {v.case_id: v for v in res.record.verdicts if v.comparator == comparator}


def test_every_restored_page_is_byte_equal_and_the_gate_passes(kv_run) -> None:  # noqa: ANN001
    res, _ = kv_run
    rec = res.record
    assert rec.outcome == "pass", rec.summary
    assert rec.kind == "kv_roundtrip" and rec.candidate.engine == "vllm"
    assert rec.candidate.version == PIN.version
    assert rec.summary.startswith(
        "kv-roundtrip: 24/24 pages byte-equal across 2 layers, 0 missing, 0 extra")
    assert all(v.status == "pass" for v in by(res, "byte_equal").values())
    assert load_record(res.path) == rec


def test_each_request_got_exactly_the_expected_prompt_tokens_from_the_connector(kv_run) -> None:  # noqa: ANN001
    res, _ = kv_run
    hits = by(res, "kv_hits")
    for cid, want in EXPECTED_HITS.items():
        e = hits[cid].evidence
        got = (e["expected"], e["engine_cached"], e["connector_external"], e["restored_tokens"])
        assert got == (want,) * 4, cid


def test_tokens_after_the_restore_equal_the_no_connector_golden(kv_run) -> None:  # noqa: ANN001
    res, _ = kv_run
    strict = by(res, "strict")
    assert set(strict) == set(EXPECTED_HITS)
    for v in strict.values():
        assert v.status == "pass" and v.evidence["vs_in_engine_reference"] == "equal"


def test_a_shared_prefix_is_stored_once_and_restored_byte_equal_for_both(kv_run) -> None:  # noqa: ANN001
    res, ws = kv_run
    run = ws.runs / res.record.extra["run_dir"]
    from harness.suites import find_suite

    cases = {c.id: c for c in find_suite(ws.suites, "kv_roundtrip").build_cases(lambda t: [])}
    shared = prefix_keys(cases["shared_a"].prompt_ids, 64)[0]
    assert shared == prefix_keys(cases["shared_b"].prompt_ids, 64)[0]
    stored = [s for s in read_capture(run / "capture" / "producer").stored if s["key"] == shared]
    assert sorted((s["case"], s["dedup"]) for s in stored) == [("shared_a", False), ("shared_b", True)]
    assert (run / "store" / shared[:2] / shared).is_dir()
    for cid in ("shared_a", "shared_b"):
        assert by(res, "byte_equal")[cid].status == "pass"


def test_planted_faults_fail_and_name_the_page(kv_run) -> None:  # noqa: ANN001
    res, _ = kv_run
    lanes = res.record.extra["control_lanes"]
    flip = lanes["flip"]
    assert flip["byte_equal"]["status"] == "fail"
    d = flip["byte_equal"]["evidence"]["differ"]
    fact = flip["planted"]
    assert [(x["layer"], x["start"], x["end"], x["offset"], x["count"]) for x in d] == [
        (fact["layer"], fact["start"], fact["end"], fact["offset"], 1)]
    assert f"first difference at byte {fact['offset']}" in flip["byte_equal"]["detail"]
    drop = lanes["drop"]
    assert drop["byte_equal"]["status"] == "fail" and drop["kv_hits"]["status"] == "fail"
    m = drop["byte_equal"]["evidence"]["missing"]
    assert [(x["layer"], x["start"]) for x in m] == [(drop["planted"]["layer"], drop["planted"]["start"])]
    assert "planted drop" in m[0]["reason"]
    # every control bit: none of the gated comparators is vacuous
    assert all(c.ok for c in res.record.controls), [c for c in res.record.controls if not c.ok]


def test_a_chunk_size_off_the_block_grid_is_refused_naming_group_and_sizes(kv_run) -> None:  # noqa: ANN001
    res, _ = kv_run
    cfg = by(res, "kv_config")["chunk_size=48"]
    assert cfg.status == "refused"
    for needle in ("chunk_size 48", "group 0", "block size 32"):
        assert needle in cfg.summary
    assert by(res, "kv_refusal")["chunk_size=48"].status == "pass" and "kv_refusal" in res.record.gates


def test_figures_and_nothing_written_outside_the_run(kv_run) -> None:  # noqa: ANN001
    res, ws = kv_run
    fig = res.record.extra["figures"]
    assert fig["pages_compared"] == 24
    assert fig["record_on_s"] > 0 and fig["record_off_s"] > 0 and "capture_overhead_pct" in fig
    t = fig["throughput"]
    assert t["bytes"] == 24 * 16384
    assert t["compare_Bps"] > 0 and t["memcpy_Bps"] > 0 and t["digest_Bps"] > 0
    assert fig["producer_engine_start_s"] > 0 and fig["consumer_engine_start_s"] > 0
    assert sorted(p.name for p in ws.root.iterdir()) == ["goldens", "models", "reports", "suites"]
    assert sorted(p.name for p in (ws.root / "reports").iterdir()) == ["records", "runs"]
    runs = list(ws.runs.iterdir())
    assert [p.name for p in runs] == [res.record.extra["run_dir"]]
    assert {p.name for p in runs[0].iterdir()} >= {"capture", "store", "producer.engine.log"}


@pytest.mark.skipif(os.environ.get("HARNESS_KV_TAP_TEST") != "1",
                    reason="two more engine starts; set HARNESS_KV_TAP_TEST=1 to run the tap around "
                           "vLLM's ExampleConnector")
def test_the_tap_around_vllms_example_connector(tmp_path: Path) -> None:
    import shutil

    for sub in ("suites", "models", "goldens"):
        shutil.copytree(REPO_ROOT / sub, tmp_path / sub)
    ws = Workspace(tmp_path)
    res = run_gate_by_name(ws, "tiny-llama", "kv_roundtrip", "vllm", auto_record=False,
                   connector="ExampleConnector")
    rec = res.record
    assert rec.extra["mode"] == "tap" and rec.candidate.name.endswith(":ExampleConnector")
    # every page it serves comes back byte-equal, but it never serves a prompt of k*32 + 1 tokens:
    # it stores under the first floor((N-1)/32)*32 tokens and looks up under floor((N-2)/32)*32
    pages, hits = by(res, "byte_equal"), by(res, "kv_hits")
    assert {c for c, v in pages.items() if v.status != "pass"} == {"n_c_plus_1"}, rec.summary
    assert len(pages["n_c_plus_1"].evidence["missing"]) == 4
    assert {c for c, v in hits.items() if v.status != "pass"} == {"n_c_plus_1"}
    assert hits["n_c_plus_1"].evidence["connector_external"] == 0 and rec.outcome == "fail"
    assert hits["n_eq_c"].evidence["engine_cached"] == 32  # C = 32 for a block-granular store
    flip = rec.extra["control_lanes"]["flip"]
    assert flip["byte_equal"]["status"] == "fail"
    # ExampleConnector's store lands inside the run, never in its /tmp default
    assert any((ws.runs / rec.extra["run_dir"] / "connector-store").iterdir())
