"""The block dimension of a paged KV cache, read from the tensor's shape: every layout vLLM's backends
hand a connector gives the same pages, byte for byte, and a wrong dimension is refused by name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.kinds.kv.capture import PageTag, read_capture
from harness.kinds.kv.capture_write import CaptureWriter, gather
from harness.kv_pages.digest import cache_digests, page_digests
from harness.kv_pages.identity import PageRef
from harness.kv_pages.layout import (
    CacheLayoutError,
    block_dim,
    block_dim_of,
    block_dims,
    check_ids,
    layer_tensor,
)

N_BLOCKS, BLOCK, HEADS, HEAD = 7, 16, 2, 8
PAGE_NBYTES = 2 * BLOCK * HEADS * HEAD * 2  # keys and values, bfloat16


def reference_pages() -> torch.Tensor:
    """[blocks, 2 (K, V), block, heads, head] bfloat16, every page different."""
    g = torch.Generator().manual_seed(3)
    return torch.randn(N_BLOCKS, 2, BLOCK, HEADS, HEAD, generator=g).to(torch.bfloat16)


# name -> (the cache as that backend lays it out, the page of block b in the reference's byte order)
LAYOUTS = {
    # flash attention, the CPU backend from vLLM 0.18: blocks first
    "blocks first [N, 2, block, heads, head]": lambda ref: ref,
    # the CPU backend up to vLLM 0.17: keys and values first, heads before tokens
    "kv first [2, N, heads, block, head]": lambda ref: ref.permute(1, 0, 3, 2, 4).contiguous(),
    # the old paged-attention layout: keys and values first, a flat page
    "kv first, flat [2, N, block*heads*head]": lambda ref: (
        ref.movedim(1, 0).reshape(2, N_BLOCKS, -1).contiguous()
    ),
}


def page_bytes_in_layout(kv: torch.Tensor, dim: int, b: int) -> bytes:
    return kv.select(dim, b).contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_is_found_from_its_shape_and_reads_its_own_pages(name: str, tmp_path: Path) -> None:
    kv = LAYOUTS[name](reference_pages())
    dim = block_dim_of(kv, N_BLOCKS, PAGE_NBYTES)
    assert dim == (0 if name.startswith("blocks first") else 1)
    assert block_dim_of(kv, N_BLOCKS) == dim and block_dim_of(kv, page_nbytes=PAGE_NBYTES) == dim
    ids = [5, 1, 3]
    pages = gather(kv, ids, dim)
    assert pages.shape[0] == 3
    assert [p.contiguous().view(torch.uint8).numpy().tobytes() for p in pages] == [
        page_bytes_in_layout(kv, dim, b) for b in ids
    ]
    assert cache_digests(kv, ids, dim) == page_digests(pages)
    # the capture writer records what it read: the page's bytes, size and shape, not the tensor's
    w = CaptureWriter(tmp_path)
    refs = [
        PageRef(f"k{b:031d}", "model.layers.0.self_attn.attn", 0, BLOCK * i, BLOCK * (i + 1))
        for i, b in enumerate(ids)
    ]
    w.cache_pages("written", refs, [PageTag("r0", "c01", "clean")] * 3, kv, ids, block_dim=dim)
    w.close()
    got = read_capture(tmp_path).side("written")
    assert [p.read() for p in got] == [page_bytes_in_layout(kv, dim, b) for b in ids]
    assert {p.shape for p in got} == {tuple(n for i, n in enumerate(kv.shape) if i != dim)}


def test_a_wrong_block_dimension_fails_loudly_not_with_other_bytes() -> None:
    kv = LAYOUTS["kv first [2, N, heads, block, head]"](reference_pages())
    # the old assumption (blocks first): block 5 is not on dimension 0 of this cache
    with pytest.raises(
        CacheLayoutError, match=r"block ids \[5\] are outside dimension 0 .*shape \[2, 7, 2, 16, 8\]"
    ):
        cache_digests(kv, [1, 5], 0)
    with pytest.raises(CacheLayoutError, match="outside dimension 0"):
        gather(kv, [5], 0)
    with pytest.raises(CacheLayoutError, match="block dimension 9 of a 5-dimensional"):
        check_ids(kv, [0], 9)
    check_ids(kv, [0, 6], 1)  # in range: nothing to say


def test_a_shape_that_fits_no_or_several_dimensions_is_named() -> None:
    with pytest.raises(
        CacheLayoutError, match=r"layer L: .*shape \[2, 7, 32\].*looking for 9 blocks.*no dimension"
    ):
        block_dim((2, 7, 32), 2, num_blocks=9, where="layer L")
    # 7 heads and 7 blocks, pages of the size either would give: cannot tell, so refuse
    with pytest.raises(CacheLayoutError, match=r"dimensions \[0, 1\] all fit"):
        block_dim((7, 7, 4), 2, num_blocks=7, page_nbytes=56)
    with pytest.raises(CacheLayoutError, match="neither its block count nor its page size"):
        block_dim((7, 2, 4), 2)
    # either fact alone decides when one dimension fits it
    assert block_dim((2, 9, 2, 4), 2, num_blocks=9) == 1
    assert block_dim((2, 9, 2, 4), 2, page_nbytes=2 * 2 * 4 * 2) == 1
    assert block_dim((2, 9, 2, 4), 2, num_blocks=9, page_nbytes=2 * 2 * 4 * 2) == 1


def test_block_dims_reads_the_engine_config_once_per_layer() -> None:
    spec = SimpleNamespace(page_size_bytes=PAGE_NBYTES)
    config = SimpleNamespace(
        num_blocks=N_BLOCKS, kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=["a", "b"])]
    )
    dims = block_dims(config)
    assert dims.num_blocks == N_BLOCKS and dims.page_bytes == {"a": PAGE_NBYTES, "b": PAGE_NBYTES}
    old = LAYOUTS["kv first, flat [2, N, block*heads*head]"](reference_pages())
    new = LAYOUTS["blocks first [N, 2, block, heads, head]"](reference_pages())
    assert (dims("a", old), dims("b", new)) == (1, 0)
    assert dims.found == {"a": 1, "b": 0}


def test_older_releases_keep_a_list_of_tensors_per_layer() -> None:
    kv = reference_pages()
    assert layer_tensor([kv]) is kv and layer_tensor(kv) is kv
    assert layer_tensor([]) is None and layer_tensor(torch.tensor([])) is None and layer_tensor(None) is None
