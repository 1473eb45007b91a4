"""The KV load lane's workload and judging, without engines: requests over shared prefixes, the
[kv.load] table's checks, and every gate of the lane biting on planted captures and counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.api import Case
from harness.kinds.kv.capture import PageTag, read_capture
from harness.kinds.kv.capture_write import CaptureWriter, SchedulerLog
from harness.kinds.kv.load import flip_requests, load_requests
from harness.kinds.kv.load_judge import BIT_EXACT, EVIDENCE, GATES, NEAR_TIE, PAGES, judge_load
from harness.kinds.kv.passes import Phase
from harness.kinds.kv.settings import LoadSettings
from harness.kv_pages.identity import PageRef, prefix_keys
from harness.suites import SuiteError
from harness.tomlcheck import Where
from tests.pins import PIN

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
BASES = [Case(f"b{i}", tuple(range(10 * i, 10 * i + 200))) for i in range(1, 4)]


def test_requests_share_prefixes_of_every_length_and_own_their_ends() -> None:
    load = LoadSettings(requests=60, prefix_tokens=(32, 96, 160), suffix_tokens=(8, 64), seed=3)
    reqs = load_requests(BASES, load, "kv_load.toml [kv.load]")
    assert len(reqs) == 60 and len({r.id for r in reqs}) == 60
    assert reqs == load_requests(BASES, load, "x"), "the workload must be the same every run"
    for r in reqs:
        p = int(r.id.split("/p")[1].split("/")[0])
        base = next(b for b in BASES if r.id.startswith(b.id + "/"))
        assert r.prompt_ids[:p] == base.prompt_ids[:p] and 8 <= len(r.prompt_ids) - p <= 64
    by_prefix = {(r.id.split("/")[0], r.id.split("/")[1]) for r in reqs}
    assert len(by_prefix) == 9  # 3 bases x 3 prefix lengths, each shared by several requests
    assert load_requests(BASES, LoadSettings(requests=60, seed=4), "x") != reqs


def test_the_planted_fault_lane_replays_prefixes_no_other_request_shares() -> None:
    """Under prefix caching a shared first block may be served by the engine itself, and a fault
    planted in the store's copy would never reach the buffer: the flip lane's prompts are unique."""
    reqs = load_requests(BASES, LoadSettings(requests=60), "x")
    flips = flip_requests(reqs, 2, 64)
    assert len(flips) == 2 and all(f.id.endswith("+flip") and len(f.prompt_ids) > 64 for f in flips)
    firsts = {r.prompt_ids[:32] for r in reqs}
    assert all(f.prompt_ids[:32] not in firsts for f in flips)


def test_a_base_shorter_than_the_longest_prefix_is_named() -> None:
    with pytest.raises(SuiteError, match=r"kv_load.toml \[kv.load\]: .*160 tokens.*too short: b9"):
        load_requests([*BASES, Case("b9", (1, 2, 3))], LoadSettings(), "kv_load.toml [kv.load]")


@pytest.mark.parametrize("table, needle", [
    ({"requests": 64, "pools": 3}, r"\[kv.load\].pools: unknown key 'pools'. Did you mean 'pool_blocks'"),
    ({"max_model_len": 200}, "does not fit max_model_len"),
    ({"pool_blocks": 8}, "cannot hold one request"),
    ({"suffix_tokens": [9, 3]}, "least, most"),
    ({"requests": 32}, "min_in_flight 64 > requests 32"),
    ({"prefix_tokens": [0, 32]}, r"\[kv.load\].prefix_tokens: expected a non-empty list of integers >= 1"),
    ({"timeout_s": 0}, r"\[kv.load\].timeout_s: expected an integer >= 1, got 0"),
])
def test_the_load_table_is_checked(table: dict[str, Any], needle: str) -> None:
    with pytest.raises(SuiteError, match=needle):
        LoadSettings.from_table(table, Where("kv_load.toml", ("kv", "load"), SuiteError), 32)


# ---------------------------------------------------------------------------------------------
# judging: one request (70 tokens: one stored chunk of 64, two pages per layer) plus its flip copy

REQ = Case("b1/p32/r000", tuple(range(2, 72)), "", ("load", "prefix:32"))
KEYS = prefix_keys(REQ.prompt_ids, 32)


def pages(folder: Path, side: str, lane: str, flip: bool = False) -> None:
    data = torch.arange(2 * 2 * 64, dtype=torch.float32).reshape(2, 2, 64) + 1
    if flip:
        data.view(torch.uint8).reshape(2, -1)[1, 9] ^= 1
    w = CaptureWriter(folder)
    for layer in LAYERS:
        refs = [PageRef(KEYS[j], layer, 0, 32 * j, 32 * (j + 1)) for j in range(2)]
        w.pages(side, refs, [PageTag("r", REQ.id, lane)] * 2, data)  # type: ignore[arg-type]
    w.close()


def log(folder: Path) -> SchedulerLog:
    s = SchedulerLog(folder)
    s.write("setup", groups=[{"index": 0, "block_size": 32, "layers": LAYERS, "paged": True}], tp=1)
    return s


def row(pass_name: str, lane: str, tokens: list[int], lp: float = -0.1) -> dict[str, Any]:
    n = len(tokens)
    return {"pass": pass_name, "case": REQ.id, "lane": lane, "token_ids": tokens, "text": "",
            "top_ids": [[t, t + 1] for t in tokens], "top_logprobs": [[lp, lp - 3.0]] * n,
            "chosen_logprobs": [lp] * n, "finish_reason": "length"}


LOADED = {"load": {"peak_in_flight": 129, "peak_running": 9, "num_preemptions": 12.0, "blocks_evicted": 40,
                   "external_prefix_cache_hits": 64.0, "prefix_cache_hits": 0.0, "samples": 50}}


def run(tmp_path: Path, *, restored_flip: bool = False, external: int = 64, under: list[int] | None = None,
        ref_lp: float = -0.1, observed: dict[str, Any] = LOADED) -> Any:
    prod_dir, cons_dir = tmp_path / "producer", tmp_path / "consumer"
    log(prod_dir)
    pages(prod_dir, "written", "clean")
    s = log(cons_dir)
    for lane in ("clean", "flip"):
        s.write("request", req="r", case=REQ.id, lane=lane, prompt_len=70, local_hit=0, matched=64,
                external=external, **{"async": False})
    pages(cons_dir, "restored", "clean", flip=restored_flip)
    pages(cons_dir, "restored", "flip", flip=True)
    (cons_dir / "planted-flip.json").write_text(json.dumps(
        {"kind": "flip", "layer": LAYERS[1], "start": 32, "end": 64, "offset": 9, "lane": "flip"}))
    toks = [5, 6, 7, 8]
    prod = Phase("producer", True, "", PIN.version, {}, (row("alone", "clean", toks),), read_capture(prod_dir),
                 tmp_path / "p.log")
    cons = Phase("consumer", True, "", PIN.version, {}, (row("load", "clean", under or toks),
                                                      row("ref", "ref", toks, ref_lp)),
                 read_capture(cons_dir), tmp_path / "c.log", observed=observed)
    return judge_load([REQ], [REQ], prod, cons, LoadSettings(min_in_flight=64), "kv_load")


def statuses(j: Any) -> dict[str, str]:
    return {v.comparator: v.status for v in j.verdicts}


def test_a_clean_load_run_passes_every_gate_and_its_controls_bite(tmp_path: Path) -> None:
    j = run(tmp_path)
    assert j.gates == GATES
    assert statuses(j) == {PAGES: "pass", BIT_EXACT: "pass", NEAR_TIE: "pass", EVIDENCE: "pass"}, j.summary
    assert j.extra["load"]["restores"] == 1 and j.extra["load"]["restored_pages"] == 4
    assert "peak 129 requests in flight" in j.summary
    bad = [(c.comparator, c.mutation, c.got) for c in j.controls if not c.ok]
    assert bad == [], bad
    flip = next(c for c in j.controls if c.comparator == PAGES and c.mutation.startswith("in-engine"))
    assert flip.got == "fail" and "byte 9" in flip.mutation
    assert {c.comparator for c in j.controls} >= set(GATES)


def test_a_restored_page_that_differs_fails_naming_layer_tokens_and_byte(tmp_path: Path) -> None:
    v = next(v for v in run(tmp_path, restored_flip=True).verdicts if v.comparator == PAGES)
    assert v.status == "fail" and "layer model.layers.0.self_attn.attn tokens [32, 64) differ at byte 9" in v.summary


def test_fewer_pages_restored_than_the_engine_asked_for_fails(tmp_path: Path) -> None:
    """A connector that claims a hit it does not restore (an output diverging at token 0 follows)."""
    v = next(v for v in run(tmp_path, external=128).verdicts if v.comparator == PAGES)
    assert v.status == "fail" and "4 pages restored, the engine asked the connector for 8" in v.summary


def test_an_output_that_diverges_under_load_fails_both_tiers(tmp_path: Path) -> None:
    s = statuses(run(tmp_path, under=[5, 9, 9, 9]))
    assert s[BIT_EXACT] == "fail" and s[NEAR_TIE] == "fail"


def test_bit_exact_is_not_the_bar_where_the_engine_itself_is_not_bit_exact_under_load(tmp_path: Path) -> None:
    j = run(tmp_path, ref_lp=-0.1000001)
    s = statuses(j)
    assert s[BIT_EXACT] == "skip" and s[NEAR_TIE] == "pass" and BIT_EXACT not in j.gates
    v = next(v for v in j.verdicts if v.comparator == BIT_EXACT)
    assert "not gated" in v.summary and "bit-exact to the request alone for 0/1 requests" in v.summary
    assert v.evidence["judged"] == "pass" and "not gated" in j.summary


@pytest.mark.parametrize("change, needle", [
    ({"num_preemptions": 0.0}, "preemptions 0"),
    ({"blocks_evicted": 0}, "evictions 0"),
    ({"peak_in_flight": 8}, "in flight at peak 8 < 64"),
])
def test_a_run_without_load_is_not_evidence(tmp_path: Path, change: dict[str, Any], needle: str) -> None:
    j = run(tmp_path, observed={"load": {**LOADED["load"], **change}})
    v = next(v for v in j.verdicts if v.comparator == EVIDENCE)
    assert v.status == "fail" and needle in v.summary


def test_unread_counters_are_an_error_not_a_pass(tmp_path: Path) -> None:
    j = run(tmp_path, observed={"load": {"counters_unreadable": "RuntimeError: no metrics"}})
    assert statuses(j)[EVIDENCE] == "error"
