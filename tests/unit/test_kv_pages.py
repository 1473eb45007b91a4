"""Page identity: token-prefix keys, block arithmetic, the expected hit rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.kv_pages.identity import PageRef, blocks_completed, expected_hit_tokens, prefix_key, prefix_keys

ids_strategy = st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=300)


@given(ids_strategy)
def test_a_page_key_is_the_hash_of_its_whole_prefix_whatever_the_block_size(ids: list[int]) -> None:
    k32, k64 = prefix_keys(ids, 32), prefix_keys(ids, 64)
    assert len(k32) == len(ids) // 32
    for j, key in enumerate(k32):
        assert key == prefix_key(ids[: (j + 1) * 32])
    # a 64-token chunk ends where every second 32-token block ends: same prefix, same key
    assert k64 == k32[1::2]


@given(ids_strategy, st.data())
def test_changing_one_token_changes_the_keys_of_every_page_from_its_block_on(ids: list[int], data) -> None:  # noqa: ANN001
    if len(ids) < 32:
        return
    i = data.draw(st.integers(0, len(ids) - 1))
    other = list(ids)
    other[i] += 1
    a, b = prefix_keys(ids, 32), prefix_keys(other, 32)
    for j in range(len(a)):
        assert (a[j] == b[j]) == ((j + 1) * 32 <= i), (i, j)


def test_block_ids_play_no_part_in_identity() -> None:
    ids = list(range(100))
    assert prefix_keys(ids, 32) == prefix_keys(list(ids), 32)
    ref = PageRef(prefix_keys(ids, 32)[0], "model.layers.0.self_attn.attn", 0, 0, 32)
    assert ref.id == (ref.key, "model.layers.0.self_attn.attn", 0)
    assert "tokens [0, 32)" in ref.describe() and "layer model.layers.0" in ref.describe()


@pytest.mark.parametrize("n, chunk, hit", [
    (1, 64, 0), (40, 64, 0), (63, 64, 0), (64, 64, 0), (65, 64, 64), (128, 64, 64), (129, 64, 128),
    (137, 64, 128), (33, 32, 32), (32, 32, 0),
])
def test_the_engine_keeps_at_least_the_last_prompt_token_to_compute(n: int, chunk: int, hit: int) -> None:
    assert expected_hit_tokens(n, chunk) == hit


def test_blocks_completed_counts_full_prompt_blocks_whose_last_token_lands_in_the_step() -> None:
    assert list(blocks_completed(0, 70, 70, 32)) == [0, 1]
    assert list(blocks_completed(64, 70, 70, 32)) == []  # chunked prefill: nothing new completes
    assert list(blocks_completed(50, 96, 200, 32)) == [1, 2]  # block 1 started in an earlier step
    assert list(blocks_completed(0, 200, 100, 32)) == [0, 1, 2]  # generated tokens are not pages
    with pytest.raises(ValueError):
        prefix_keys([1, 2], 0)
