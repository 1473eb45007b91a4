"""Page digests: xxh128 of host pages, mx128 on devices (the CPU path of the same torch code a CUDA
cache uses) and on hosts without xxhash; each digest names its algorithm and is checked by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.kv_pages.digest import (
    HOST,
    NAME,
    XXH128,
    as_page_bytes,
    digest_bytes,
    host_digests,
    matches,
    mx128_host_digests,
    page_digests,
)
from harness.workspace import REPO_ROOT


def pages(n: int = 4, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 32, 128, generator=g).to(dtype)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(0, 16383), st.integers(1, 255))
def test_any_single_byte_change_changes_that_page_digest_only(page: int, offset: int, xor: int) -> None:
    x = pages()
    before = page_digests(x)
    y = x.clone()
    raw = y.view(torch.uint8).reshape(4, -1)
    raw[page, offset] ^= xor
    after = page_digests(y)
    assert [a == b for a, b in zip(before, after, strict=True)] == [i != page for i in range(4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int8])
def test_digests_are_of_bytes_not_values_and_agree_with_the_host_path(dtype: torch.dtype) -> None:
    x = pages(3, 1, dtype) if dtype.is_floating_point else torch.randint(0, 100, (3, 1, 32, 128)).to(dtype)
    ds = page_digests(x)
    assert HOST == XXH128  # xxhash is a dependency: host pages get XXH3-128
    assert all(d.startswith(HOST + ":") and len(d) == len(HOST) + 33 for d in ds)
    for i, d in enumerate(ds):
        assert digest_bytes(x[i].contiguous().numpy().tobytes()
                            if dtype != torch.bfloat16 else as_page_bytes(x[i:i + 1]).numpy().tobytes()) == d
    # the same bytes seen through another dtype give the same digest
    as_bytes = as_page_bytes(x)
    assert page_digests(as_bytes) == ds


def test_layout_does_not_matter_only_the_logical_page_bytes_do() -> None:
    x = pages(4)
    strided = torch.empty(4, 2, 1, 32, 128)[:, 0]  # a per-layer view of a shared allocation
    strided.copy_(x)
    assert not strided.is_contiguous()
    assert page_digests(strided) == page_digests(x)


@pytest.mark.parametrize("algorithm", [NAME, XXH128])
def test_length_is_part_of_the_digest_and_odd_sizes_work(algorithm: str) -> None:
    assert digest_bytes(b"\x00" * 4, algorithm) != digest_bytes(b"\x00" * 5, algorithm) != digest_bytes(
        b"", algorithm)
    assert digest_bytes(b"abc", algorithm) != digest_bytes(b"abd", algorithm)
    assert page_digests(torch.zeros(0, 16, dtype=torch.uint8)) == []
    assert len(set(page_digests(torch.zeros(3, 7, dtype=torch.uint8)))) == 1


def test_word_order_matters_position_is_mixed_in() -> None:
    a = np.arange(64, dtype=np.uint32)
    b = a.copy()
    b[[3, 40]] = b[[40, 3]]
    assert digest_bytes(a.tobytes()) != digest_bytes(b.tobytes())
    assert digest_bytes(a.tobytes(), NAME) != digest_bytes(b.tobytes(), NAME)


def test_batching_and_slicing_do_not_change_digests() -> None:
    x = pages(40, 3)
    whole = page_digests(x)
    assert whole == [page_digests(x[i:i + 1])[0] for i in range(40)]
    assert len(set(whole)) == 40


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_the_torch_path_a_gpu_uses_gives_the_host_paths_bits(n: int, nbytes: int, seed: int) -> None:
    from harness.kv_pages.digest import device_digests

    raw = torch.randint(0, 256, (n, nbytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    assert device_digests(raw) == mx128_host_digests(raw.numpy()) == host_digests(raw.numpy(), NAME)
    # host pages: XXH3-128 of each page's bytes, exactly what the xxhash package says
    want = [f"xxh128:{xxhash.xxh3_128_hexdigest(raw[i].numpy().tobytes())}" for i in range(n)]
    assert page_digests(raw) == host_digests(raw.numpy()) == want


def test_mx128_bits_are_those_records_hold() -> None:
    """Digests recorded before xxh128, and before the K was taken out of the lane sums, still check."""
    assert digest_bytes(bytes(range(256)) * 4, NAME) == "mx128:baadcea31d19568545224f48895b4488"
    assert digest_bytes(np.arange(40000, dtype=np.uint32).tobytes() + b"xyz", NAME) == \
        "mx128:9983bb4013218bb5cc38009f5e3b6dba"
    from harness.kv_pages.digest import device_digests

    page = torch.frombuffer(bytearray(bytes(range(256)) * 4), dtype=torch.uint8).reshape(1, -1)
    assert device_digests(page) == ["mx128:baadcea31d19568545224f48895b4488"]


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=0, max_size=3000), st.integers(0, 2**31), st.integers(1, 255))
def test_a_digest_is_checked_by_the_algorithm_it_names(data: bytes, at: int, xor: int) -> None:
    for algorithm in (NAME, XXH128):
        d = digest_bytes(data, algorithm)
        assert d.startswith(algorithm + ":") and matches(data, d) is True
        if data:
            bad = bytearray(data)
            bad[at % len(data)] ^= xor
            assert matches(bytes(bad), d) is False
    assert matches(data, "sha1:" + "0" * 40) is None  # someone else's digest: nothing to check it by


FALLBACK = """
import json, sys
sys.modules["xxhash"] = None  # an interpreter without xxhash (a vLLM release's venv)
import numpy as np
from harness.kv_pages import digest
raw = np.frombuffer(bytes(range(256)) * 40, np.uint8).reshape(5, -1)
print(json.dumps({"host": digest.HOST, "digests": digest.host_digests(raw), "one": digest.digest_bytes(b"abc")}))
"""


def test_without_xxhash_host_pages_get_the_mx128_digest_every_device_computes() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    p = subprocess.run([sys.executable, "-c", FALLBACK], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    raw = np.frombuffer(bytes(range(256)) * 40, np.uint8).reshape(5, -1)
    assert got["host"] == NAME
    assert got["digests"] == mx128_host_digests(raw)
    assert got["one"] == digest_bytes(b"abc", NAME) != digest_bytes(b"abc")
