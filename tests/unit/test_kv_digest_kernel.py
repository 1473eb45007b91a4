"""The fused digest kernel's CPU twin and the digest-only capture.

The Triton kernel runs here under Triton's interpreter (``TRITON_INTERPRET=1``, in a child process:
the switch is read when the kernel is defined): its digests must equal the host's ``mx128`` digest of
the same bytes bit for bit, for both cache layouts and for page and group counts that do not divide the
tiles. Every variant runs on a bfloat16 cache; float32 and uint8 caches (the kernel reads 32-bit words of
any dtype) run the default variant in both layouts. tests/device/kv_capture_gpu.py runs the same source on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.kinds.kv.capture import PageTag, read_capture, written_digests
from harness.kinds.kv.capture_write import CaptureWriter, HostStager, _PageLines
from harness.kv_pages.digest import cache_digests, digest_bytes, page_digests
from harness.kv_pages.identity import PageRef

ROOT = Path(__file__).resolve().parents[2]

TWIN = r"""
import json, sys
import numpy as np, torch
from harness.kv_pages import digest_triton as dt
from harness.kv_pages.digest import digest_bytes, format_sums, fused_digests, fused_lane_sums
out = {}
g = torch.Generator().manual_seed(0)
for dtype in (torch.bfloat16, torch.float32, torch.uint8):
    raw = torch.randint(0, 256, (13, 2, 4, 2, 16), dtype=torch.uint8, generator=g)  # 512-byte pages
    kv = raw.view(dtype)
    ids = [12, 0, 5, 7, 3, 11, 2]
    want = [digest_bytes(kv[b].contiguous().view(torch.uint8).numpy().tobytes(), "mx128") for b in ids]
    split = kv.transpose(0, 1).contiguous()  # [2, blocks, ...]: K and V of a block apart
    want_split = [digest_bytes(split[:, b].contiguous().view(torch.uint8).numpy().tobytes(), "mx128")
                  for b in ids]
    out[f"{dtype}-default"] = fused_digests(kv, ids, dt.layout_of(kv)) == want
    out[f"{dtype}-split-default"] = fused_digests(split, ids, dt.layout_of(split, 1)) == want_split
    if dtype != torch.bfloat16:
        continue  # the kernel reads 32-bit words of any dtype: the dtype is only the host's view
    for block, pages, unroll, partials in ((16, 3, False, False), (64, 8, True, False), (128, 16, False, True),
                                           (256, 5, True, True)):  # tiles and groups with tails, every variant
        s = fused_lane_sums(kv, ids, dt.layout_of(kv), variant="tiles", block=block, pages=pages, num_warps=1,
                            unroll=unroll, partials=partials)
        got = format_sums(s.numpy().view(np.uint32), dt.layout_of(kv).nbytes)
        out[f"{dtype}-tiles-{block}-{pages}-{unroll}-{partials}"] = got == want
    for rows, row_block, stages in ((4, 32, 1), (2, 128, 2), (8, 256, 3)):  # even tiles, a tail tile, padding
        s = fused_lane_sums(kv, ids, dt.layout_of(kv), variant="rows", rows=rows, row_block=row_block,
                            stages=stages, row_warps=1)
        got = format_sums(s.numpy().view(np.uint32), dt.layout_of(kv).nbytes)
        out[f"{dtype}-rows-{rows}-{row_block}-{stages}"] = got == want
    for variant in ("rows", "tiles"):
        s = fused_lane_sums(split, ids, dt.layout_of(split, 1), variant=variant, row_block=32, block=32)
        out[f"{dtype}-split-{variant}"] = format_sums(s.numpy().view(np.uint32), dt.layout_of(split, 1).nbytes
                                                      ) == want_split
kv = torch.randint(0, 256, (9, 1024), dtype=torch.uint8, generator=g)
before = fused_digests(kv, list(range(9)), dt.layout_of(kv))
kv[4, 777] ^= 0x10
after = fused_digests(kv, list(range(9)), dt.layout_of(kv))
out["flip"] = [a != b for a, b in zip(before, after)] == [i == 4 for i in range(9)]
# the mx128 bits of records written before the K was taken out of the sums
old = torch.frombuffer(bytearray(bytes(range(256)) * 4), dtype=torch.uint8).reshape(1, -1)
out["same_bits_as_before"] = fused_digests(old, [0], dt.layout_of(old)) == ["mx128:baadcea31d19568545224f48895b4488"]
print(json.dumps(out))
"""


def test_the_fused_kernel_under_the_interpreter_equals_the_host_digest() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", TWIN], capture_output=True, text=True, env=env, timeout=600,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got and all(got.values()), got


def _cache(blocks: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**15), 2**15, (blocks, 2, 4, 2, 32), dtype=torch.int16, generator=g).view(torch.bfloat16)


def _refs(ids: list[int], layer: str = "model.layers.0.attn") -> tuple[list[PageRef], list[PageTag]]:
    return ([PageRef(f"{b:032x}", layer, 0, 16 * i, 16 * i + 16) for i, b in enumerate(ids)],
            [PageTag("r0", "c01", "clean")] * len(ids))


def test_cache_digests_read_pages_in_place() -> None:
    kv = _cache()
    ids = [7, 2, 9]
    assert cache_digests(kv, ids) == page_digests(kv[ids])
    assert cache_digests(kv.transpose(0, 1).contiguous(), ids, block_dim=1) == [
        digest_bytes(kv[b].contiguous().view(torch.uint8).numpy().tobytes()) for b in ids]


@settings(max_examples=25, deadline=None)
@given(victim=st.integers(0, 11), offset=st.integers(0, 2 * 4 * 2 * 32 * 2 - 1), xor=st.integers(1, 255))
def test_digest_only_capture_fetches_exactly_the_page_that_differs(victim: int, offset: int, xor: int,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("cap")
    kv = _cache()
    ids = list(range(12))
    refs, tags = _refs(ids)
    w = CaptureWriter(tmp / "producer", keep="mismatch")
    w.cache_pages("written", refs, tags, kv, ids)
    w.close()
    expected = written_digests(tmp / "producer")
    assert len(expected) == 12
    store = kv[victim].contiguous().view(torch.uint8).numpy().tobytes()  # what the store holds of it
    restored = kv.clone()  # the consumer's live cache, one byte off
    restored.view(torch.uint8).reshape(12, -1)[victim, offset] ^= xor
    r = CaptureWriter(tmp / "consumer", keep="mismatch")
    r.cache_pages("restored", refs, tags, restored, ids, expected=[expected[x.id] for x in refs])
    r.close()
    cap = read_capture(tmp / "consumer")
    kept = [p for p in cap.pages if p.path is not None]
    assert [p.ref.key for p in kept] == [refs[victim].key]  # bytes left the cache for that page only
    a, b = np.frombuffer(store, np.uint8), np.frombuffer(kept[0].read(), np.uint8)
    assert int(np.argmax(a != b)) == offset and int((a != b).sum()) == 1
    assert {p.digest for p in cap.pages if p.path is None} <= set(expected.values())
    assert cap.captured_bytes == len(store)


def test_full_capture_keeps_every_page_and_its_index_lines_are_json(tmp_path: Path) -> None:
    kv = _cache()
    ids = [3, 4, 5]
    refs, tags = _refs(ids)
    w = CaptureWriter(tmp_path, keep="all")
    w.cache_pages("written", refs, tags, kv, ids, keep_bytes=[True, False, True])
    w.close()
    cap = read_capture(tmp_path)
    assert [p.path is not None for p in cap.pages] == [True, False, True] and not cap.malformed
    assert [p.read() for p in cap.pages if p.path] == [kv[3].contiguous().view(torch.uint8).numpy().tobytes(),
                                                      kv[5].contiguous().view(torch.uint8).numpy().tobytes()]
    lines = [json.loads(x) for x in (tmp_path / "worker-0.pages.jsonl").read_text().splitlines()]
    assert [x["kept"] for x in lines if x["t"] == "page"] == ["all", "duplicate", "all"]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8), st.text(max_size=20),
       st.one_of(st.none(), st.integers(0, 2**40)), st.integers(-1, 9), st.sampled_from(["written", "restored"]))
def test_page_lines_are_exactly_sorted_json(case: str, lane: str, req: str, key: str, offset: int | None,
                                            step: int, side: str) -> None:
    ref, tag = PageRef(key, "model.layers.3.attn", 1, 32, 48, 2), PageTag(req, case, lane)
    line = _PageLines(side, "bfloat16", [2, 16, 8, 128], 65536, step, "worker-0.pages.bin")
    want = json.dumps({"t": "page", "side": side, "key": key, "layer": ref.layer, "group": 1, "start": 32,
                       "end": 48, "shard": 2, "req": req, "case": case, "lane": lane, "digest": "mx128:ab",
                       "nbytes": 65536, "dtype": "bfloat16", "shape": [2, 16, 8, 128], "kept": "mismatch",
                       "file": "worker-0.pages.bin" if offset is not None else None, "offset": offset,
                       "step": step}, sort_keys=True)
    assert line(ref, tag, "mx128:ab", "mismatch", offset) == want


def test_host_stager_copies_host_pages_at_once() -> None:
    raw = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    handle, host = HostStager().start(raw)
    raw[0, 0] = 99  # the copy was taken before the cache moved on
    HostStager.wait(handle)
    assert handle is None and host[0, 0] == 0 and host.shape == (3, 4)


def test_a_large_batch_is_one_columnar_line_read_back_page_by_page(tmp_path: Path) -> None:
    kv = _cache(blocks=80, seed=3)
    ids = list(range(70))
    refs, tags = _refs(ids)
    for folder, cut in ((tmp_path / "columns", 70), (tmp_path / "lines", 10)):  # 10-page batches: per page
        w = CaptureWriter(folder, keep="all")
        for lo in range(0, 70, cut):
            w.cache_pages("written", refs[lo:lo + cut], tags[lo:lo + cut], kv, ids[lo:lo + cut],
                          keep_bytes=[i % 3 != 0 for i in range(lo, min(70, lo + cut))])
        w.close()
    a, b = read_capture(tmp_path / "columns"), read_capture(tmp_path / "lines")
    assert len((tmp_path / "columns" / "worker-0.pages.jsonl").read_text().splitlines()) == 2  # pages + batch
    assert not a.malformed and len(a.pages) == 70
    assert [(p.ref, p.digest, p.offset, p.path is None) for p in a.pages] == [
        (p.ref, p.digest, p.offset, p.path is None) for p in b.pages]
    assert [p.read() for p in a.pages if p.path] == [p.read() for p in b.pages if p.path]
