"""Scheduler-side planning with vLLM's own scheduler-output types: which pages each step captures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

from harness.kinds.kv.plan import (
    NULL_BLOCK_ID,
    RequestTracker,
    Tags,
    describe_groups,
    first_block_in_window,
    groups_of,
)
from harness.kv_pages.identity import prefix_keys

PROMPT = list(range(10, 110))  # 100 tokens: blocks [0,32) [32,64) [64,96) are full


def tracker() -> RequestTracker:
    spec = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=64, dtype=torch.float32)
    return RequestTracker(groups_of(KVCacheConfig(16, [], [KVCacheGroupSpec(["l0", "l1"], spec)])))


def new_req(req_id: str, blocks: list[int], computed: int = 0, **tags: object) -> NewRequestData:
    sp = SamplingParams(max_tokens=4, extra_args={"harness_kv": {"case": "c01", **tags}})
    return NewRequestData(req_id=req_id, prompt_token_ids=PROMPT, mm_features=[], sampling_params=sp,
                          pooling_params=None, block_ids=(blocks,), num_computed_tokens=computed,
                          lora_request=None)


def output(new: list[NewRequestData], cached: CachedRequestData, sched: dict[str, int],
           finished: set[str] | None = None) -> SchedulerOutput:
    return SchedulerOutput(scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=sched,
                           total_num_scheduled_tokens=sum(sched.values()), scheduled_spec_decode_tokens={},
                           scheduled_encoder_inputs={}, finished_req_ids=finished or set(),
                           free_encoder_mm_hashes=[])


def test_tags_travel_in_sampling_params_extra_args() -> None:
    t = Tags.of(SamplingParams(extra_args={"harness_kv": {"case": "c7", "lane": "flip", "capture": False}}))
    assert t == Tags("c7", "flip", False, False)
    assert Tags.of(SamplingParams()) == Tags()


def test_chunked_prefill_pages_are_planned_in_the_step_that_completes_them() -> None:
    tr = tracker()
    step1 = tr.step(output([new_req("r", [5, 9])], CachedRequestData.make_empty(), {"r": 50}))
    pages = tr.written_pages(step1[0])
    keys = prefix_keys(PROMPT, 32)
    assert [(p.key, p.block_id, p.start, p.end, p.case) for p in pages] == [(keys[0], 5, 0, 32, "c01")]
    cached = CachedRequestData(req_ids=["r"], resumed_req_ids=set(), new_token_ids=[[]], all_token_ids={},
                               new_block_ids=[([2, 7],)], num_computed_tokens=[50], num_output_tokens=[0])
    step2 = tr.step(output([], cached, {"r": 50}))
    assert (step2[0].before, step2[0].after) == (50, 100)
    assert [(p.block_id, p.start) for p in tr.written_pages(step2[0])] == [(9, 32), (2, 64)]
    # decode steps and the partial last block are never pages
    cached = CachedRequestData(req_ids=["r"], resumed_req_ids=set(), new_token_ids=[[]], all_token_ids={},
                               new_block_ids=[None], num_computed_tokens=[100], num_output_tokens=[1])
    assert tr.written_pages(tr.step(output([], cached, {"r": 1}))[0]) == []


def test_a_prefix_seen_before_is_planned_as_a_digest_only_duplicate() -> None:
    tr = tracker()
    s = tr.step(output([new_req("a", [1, 2, 3, 4]), new_req("b", [5, 6, 7, 8])],
                       CachedRequestData.make_empty(), {"a": 100, "b": 100}))
    a, b = tr.written_pages(s[0]), tr.written_pages(s[1])
    assert [p.dup for p in a] == [False] * 3 and [p.dup for p in b] == [True] * 3
    assert [p.key for p in a] == [p.key for p in b] and [p.block_id for p in b] == [5, 6, 7]


def test_restored_ranges_map_to_the_allocated_blocks() -> None:
    tr = tracker()
    s = tr.step(output([new_req("r", [4, 8, 15, 16], computed=64, lane="flip")],
                       CachedRequestData.make_empty(), {"r": 36}))
    pages = tr.pages_in_range(s[0].state, 0, 64)
    assert [(p.block_id, p.start, p.lane) for p in pages] == [(4, 0, "flip"), (8, 32, "flip")]
    assert [p.start for p in tr.written_pages(s[0])] == [64]  # loaded blocks are not "written" again


@pytest.mark.parametrize("resumed", [True, False])
def test_resumed_requests_replace_their_block_table(resumed: bool) -> None:
    tr = tracker()
    tr.step(output([new_req("r", [1])], CachedRequestData.make_empty(), {"r": 10}))
    cached = CachedRequestData(req_ids=["r"], resumed_req_ids={"r"} if resumed else set(),
                               new_token_ids=[[]], all_token_ids={}, new_block_ids=[([3, 4, 5],)],
                               num_computed_tokens=[0 if resumed else 10], num_output_tokens=[0])
    tr.step(output([], cached, {"r": 90}))
    assert tr.requests["r"].block_ids == ([[3, 4, 5]] if resumed else [[1, 3, 4, 5]])
    tr.forget(["r"])
    assert "r" not in tr.requests


def hybrid_tracker(window: int = 64) -> RequestTracker:
    full = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=64, dtype=torch.float32)
    slide = SlidingWindowSpec(block_size=32, num_kv_heads=1, head_size=64, dtype=torch.float32,
                              sliding_window=window)
    return RequestTracker(groups_of(KVCacheConfig(16, [], [KVCacheGroupSpec(["full"], full),
                                                           KVCacheGroupSpec(["slide"], slide)])))


def test_groups_know_which_ones_free_blocks_outside_a_window() -> None:
    full, slide = hybrid_tracker().groups
    assert (full.window, slide.window) == (None, 64)
    # the hybrid allocator off: sliding-window layers become a FullAttentionSpec that keeps every block
    unified = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=64, dtype=torch.float32,
                                sliding_window=64)
    (g,) = groups_of(KVCacheConfig(16, [], [KVCacheGroupSpec(["a", "b"], unified)]))
    assert g.window is None


@pytest.mark.parametrize("window", [32, 64, 100])
def test_the_window_rule_is_vllms_own(window: int) -> None:
    """first_block_in_window agrees with vLLM's SlidingWindowManager on how many blocks it skips."""
    manager = SimpleNamespace(sliding_window=window, extra_retained_tokens=0)
    for computed in range(0, 300, 7):
        skipped = SlidingWindowManager.get_num_skipped_tokens(manager, computed)  # type: ignore[arg-type]
        assert first_block_in_window(computed, window, 32) == skipped // 32, computed
    assert first_block_in_window(300, None, 32) == 0


def test_null_blocks_of_a_sliding_window_group_are_not_pages() -> None:
    tr = hybrid_tracker()
    st = tr.step(output([new_req("r", [3, 4, 5, 6])], CachedRequestData.make_empty(), {"r": 1}))[0].state
    st.block_ids = [[3, 4, 5, 6], [NULL_BLOCK_ID, NULL_BLOCK_ID, 7, 8]]
    pages = tr.pages_in_range(st, 0, 96)
    assert [(p.group, p.block_id, p.start) for p in pages] == [(0, 3, 0), (0, 4, 32), (0, 5, 64),
                                                                 (1, 7, 64)]


def test_groups_are_described_in_a_few_words() -> None:
    gemma = [{"kind": "SlidingWindowSpec", "block_size": 32, "window": 64, "layers": 1},
             {"kind": "FullAttentionSpec", "block_size": 32, "window": None, "layers": 1},
             {"kind": "SlidingWindowSpec", "block_size": 32, "window": 64, "layers": 1}]
    assert describe_groups(gemma) == "3 (sliding 64 x2, full x1; block 32)"
    assert describe_groups([{"kind": "FullAttentionSpec", "block_size": 16}]) == "1 (full x1; block 16)"
    assert describe_groups([]) == ""
