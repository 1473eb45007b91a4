"""On-device KV page digests on a CUDA GPU: correctness against the host path, and throughput.

    python tests/device/kv_digest_cuda.py [--blocks 8192] [--pages 2048]

Self-contained (needs torch with CUDA and this repository on the path); not collected by pytest.
It builds synthetic paged KV caches shaped like vLLM's per-layer views ``[num_blocks, H, N, C]``
(bf16, fp16, fp32 and fp8 where torch has it), gathers scattered pages the way the harness
connectors do, and checks:

1. the digest of each page computed on the GPU equals the digest of the same bytes on the host;
2. flipping one byte of one page in device memory changes that page's digest and no other;

then prints, per dtype, the device digest rate next to a device-to-device copy (memcpy) of the same
pages and the device-to-host copy a byte comparison would need. Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from harness.kv_pages.digest import NAME, as_page_bytes, digest_bytes, page_digests  # noqa: E402


def timed(fn, reps: int = 10) -> float:  # noqa: ANN001
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def check(dtype: torch.dtype, blocks: int, n_pages: int, heads: int, block: int, width: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    raw = torch.randint(0, 256, (blocks, heads, block, width * torch.finfo(dtype).bits // 8),
                        dtype=torch.uint8, device="cuda", generator=gen)
    cache = raw.view(dtype)  # arbitrary bit patterns: digests are of bytes, NaNs included
    ids = torch.randperm(blocks, device="cuda", generator=gen)[:n_pages]
    pages = cache[ids]
    dev = page_digests(pages)
    host = as_page_bytes(pages).cpu().numpy()
    bad = [i for i in range(0, n_pages, max(1, n_pages // 64)) if digest_bytes(host[i].tobytes(), NAME) != dev[i]]
    victim, offset = n_pages // 3, host.shape[1] // 2 + 1
    flipped = pages.clone()
    as_page_bytes(flipped)[victim, offset] ^= 1
    changed = [i for i, (a, b) in enumerate(zip(dev, page_digests(flipped), strict=True)) if a != b]
    nbytes = host.size
    t_digest = timed(lambda: page_digests(pages))
    t_copy = timed(lambda: pages.clone())
    t_d2h = timed(lambda: pages.to("cpu"))
    t_gather = timed(lambda: cache[ids])
    return {
        "dtype": str(dtype).removeprefix("torch."), "pages": n_pages, "page_bytes": host.shape[1],
        "host_equals_device": not bad, "mismatched_pages": bad[:5],
        "flip_changes_only_its_page": changed == [victim],
        "digest_GBps": nbytes / t_digest / 1e9, "d2d_copy_GBps": nbytes / t_copy / 1e9,
        "d2h_copy_GBps": nbytes / t_d2h / 1e9, "gather_GBps": nbytes / t_gather / 1e9,
        "digest_ms": t_digest * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8192)
    ap.add_argument("--pages", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--width", type=int, default=256, help="K|V elements per head per token")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    if hasattr(torch, "float8_e4m3fn"):
        dtypes.append(torch.float8_e4m3fn)
    rows = [check(d, a.blocks, a.pages, a.heads, a.block, a.width) for d in dtypes]
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": rows},
                     indent=1))
    ok = all(r["host_equals_device"] and r["flip_changes_only_its_page"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
