"""KV capture at GPU scale: the fused digest kernel and the digest-only capture, on a synthetic cache.

    python tests/device/kv_capture_gpu.py [--tokens 100000] [--layers 32] [--out DIR]

Self-contained (torch with CUDA, Triton, this repository on the path); not collected by pytest.
The cache is shaped like an 8B model's: ``layers`` tensors ``[blocks, 2, 16, 8, 128]`` bf16 (a
page = one block of one layer, K and V, 64 KiB), random bits, ``tokens / 16`` pages per layer in
use, scattered over the blocks as a paged cache leaves them. In one run it checks, then times:

correctness (exit status 1 on any failure)
  1. fused kernel digests == host digests of the same bytes (a sample of pages of every layer),
     == the torch-ops digests (every page of one layer), for a ``[2, blocks, ...]`` layout too, and
     for fp32 / fp16 / fp8 caches;
  2. one flipped byte changes exactly its page's digest;
  3. digest-only capture, end to end: a pass records digests only; a byte flipped in the live
     cache makes the next (restore-side) pass fetch exactly that page's bytes, and the first
     differing byte against the stored copy is the flipped one;

rates (CUDA events, median of repeats, the same bytes in the same run)
  * device-to-device copy of the whole cache (the yardstick: bytes copied per second; twice that
    crosses the memory bus);
  * fused digest of every page (best of a small sweep of tile sizes), torch-ops digest;
  * device -> pinned host copy of every page (what a full-bytes capture must move) and a pageable
    copy of one layer;
  * capture time per pass through ``CaptureWriter``: digest-only vs full bytes (to a file).

Writes ``kv_gpu.json`` under ``--out`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness.kinds.kv.capture import PageTag, read_capture  # noqa: E402
from harness.kinds.kv.capture_write import CaptureWriter  # noqa: E402
from harness.kv_pages import digest_triton as dt  # noqa: E402
from harness.kv_pages.digest import NAME, device_digests, digest_bytes, fused_digests, fused_lane_sums  # noqa: E402
from harness.kv_pages.identity import PageRef  # noqa: E402

RESULTS: dict = {"checks": {}, "rates": {}, "errors": {}}


def dev_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, reps: int = 5) -> float:  # noqa: ANN001
    """Median seconds of ``fn`` over ``reps`` runs after one warm-up (events on a GPU)."""
    fn()
    dev_sync(device)
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def section(name: str):  # noqa: ANN201
    def wrap(fn):  # noqa: ANN001, ANN202
        def run(*a, **k):  # noqa: ANN002, ANN003, ANN202
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            except Exception as e:  # noqa: BLE001 - record and go on: device time is scarce
                RESULTS["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
                print(f"[{name}] ERROR {type(e).__name__}: {e}", flush=True)
            finally:
                print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
        return run
    return wrap


def make_cache(layers: int, blocks: int, device: torch.device, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(layers):
        raw = torch.randint(-(2**15), 2**15, (blocks, 2, 16, 8, 128), dtype=torch.int16, device=device,
                            generator=g)
        out.append(raw.view(torch.bfloat16))
    return out


def host_page(kv: torch.Tensor, b: int) -> bytes:
    return kv[b].contiguous().view(torch.uint8).cpu().numpy().tobytes()


@section("correctness")
def correctness(cache: list[torch.Tensor], ids: torch.Tensor, device: torch.device) -> None:
    c = RESULTS["checks"]
    lay = dt.layout_of(cache[0])
    sample = ids[torch.linspace(0, len(ids) - 1, 8).long()].tolist()
    bad = 0
    for kv in cache:
        got = fused_digests(kv, sample, lay)
        bad += sum(g != digest_bytes(host_page(kv, b), NAME) for g, b in zip(got, sample, strict=True))
    c["fused_eq_host"] = {"pages": len(sample) * len(cache), "mismatches": bad}
    sub = ids[:512]
    fused = fused_digests(cache[0], sub, lay)
    torch_ops = device_digests(cache[0].index_select(0, sub).view(len(sub), -1).view(torch.uint8))
    c["fused_eq_torch_ops"] = {"pages": len(sub), "mismatches": sum(a != b for a, b in zip(fused, torch_ops, strict=True))}
    # a [2, blocks, ...] layout: K and V of a block apart, the page = kv[:, b]
    n2 = min(1024, cache[1].shape[0])
    kv2 = cache[1][:n2].transpose(0, 1).contiguous()
    lay2 = dt.layout_of(kv2, 1)
    picks = list(range(0, n2, max(1, n2 // 11)))
    got = fused_digests(kv2, picks, lay2)
    want = [digest_bytes(kv2[:, b].contiguous().view(torch.uint8).cpu().numpy().tobytes(), NAME) for b in picks]
    c["split_layout_eq_host"] = {"pages": len(want), "mismatches": sum(a != b for a, b in zip(got, want, strict=True))}
    dtypes = {"float32": torch.float32, "float16": torch.float16}
    if hasattr(torch, "float8_e4m3fn"):
        dtypes["float8_e4m3fn"] = torch.float8_e4m3fn
    for name, dtype in dtypes.items():
        raw = torch.randint(0, 256, (256, 2, 16, 8, 256), dtype=torch.uint8, device=device)  # 64 KiB pages
        kv = raw.view(dtype)
        got = fused_digests(kv, list(range(0, 256, 17)), dt.layout_of(kv))
        want = [digest_bytes(host_page(kv, b), NAME) for b in range(0, 256, 17)]
        c[f"fused_eq_host_{name}"] = {"pages": len(want), "mismatches": sum(a != b for a, b in zip(got, want, strict=True))}
    # one flipped byte changes exactly its page
    kv = cache[min(2, len(cache) - 1)]
    before = fused_lane_sums(kv, ids, lay).cpu().numpy()
    victim = int(ids[len(ids) // 3])
    byte = 40961
    kv[victim].view(-1).view(torch.uint8)[byte] ^= 1
    after = fused_lane_sums(kv, ids, lay).cpu().numpy()
    kv[victim].view(-1).view(torch.uint8)[byte] ^= 1
    changed = np.flatnonzero((before != after).any(axis=1))
    c["flip_changes_one_page"] = {"changed": [int(ids[i]) for i in changed], "victim": victim,
                                  "ok": len(changed) == 1 and int(ids[changed[0]]) == victim}


def refs_for(layer: int, ids: list[int]) -> tuple[list[PageRef], list[PageTag]]:
    refs = [PageRef(f"{layer:02d}{b:030x}", f"model.layers.{layer}.self_attn.attn", 0, 16 * i, 16 * i + 16, 0)
            for i, b in enumerate(ids)]
    return refs, [PageTag("req-0", "c00", "clean")] * len(ids)


@section("digest_only_e2e")
def digest_only_e2e(cache: list[torch.Tensor], ids: list[int], folder: Path) -> None:
    layers = range(min(4, len(cache)))
    w = CaptureWriter(folder / "producer", 0, keep="mismatch")
    expected: dict = {}
    store = {}
    for li in layers:
        refs, tags = refs_for(li, ids)
        digs = w.cache_pages("written", refs, tags, cache[li], ids, step=0)
        expected.update({r.id: d for r, d in zip(refs, digs, strict=True)})
    w.close()
    li, pick = 1, len(ids) // 2
    victim = ids[pick]
    store[victim] = host_page(cache[li], victim)  # what the store holds of the written page
    byte = 12345
    cache[li][victim].view(-1).view(torch.uint8)[byte] ^= 4
    r = CaptureWriter(folder / "consumer", 0, keep="mismatch")
    for lj in layers:
        refs, tags = refs_for(lj, ids)
        r.cache_pages("restored", refs, tags, cache[lj], ids, step=1, expected=[expected[x.id] for x in refs])
    r.close()
    cache[li][victim].view(-1).view(torch.uint8)[byte] ^= 4
    cap = read_capture(folder / "consumer")
    kept = [p for p in cap.pages if p.path is not None]
    first = None
    if len(kept) == 1:
        a, b = np.frombuffer(store[victim], np.uint8), np.frombuffer(kept[0].read(), np.uint8)
        first = int(np.argmax(a != b)) if (a != b).any() else None
    RESULTS["checks"]["digest_only_fetches_the_flipped_page"] = {
        "pages_recorded": len(cap.pages), "pages_with_bytes": len(kept),
        "fetched": [p.ref.key for p in kept], "victim_key": refs_for(li, [victim])[0][0].key,
        "first_differing_byte": first, "flipped_byte": byte,
        "ok": len(kept) == 1 and first == byte and kept[0].ref.key == refs_for(li, [victim])[0][0].key}


@section("rates")
def rates(cache: list[torch.Tensor], ids: torch.Tensor, device: torch.device, sweep: bool) -> None:
    r = RESULTS["rates"]
    n_pages = len(ids) * len(cache)
    page = cache[0][0].numel() * cache[0].element_size()
    nbytes = n_pages * page
    r["bytes_per_pass"] = nbytes
    r["pages_per_pass"] = n_pages
    dst = [torch.empty_like(kv) for kv in cache[:2]]
    t = timed(lambda: [d.copy_(kv) for d, kv in zip(dst, cache[:2], strict=True)], device)
    layer_bytes = sum(kv.numel() * kv.element_size() for kv in cache[:2])
    r["d2d_copy_Bps"] = layer_bytes / t
    r["d2d_copy_note"] = "bytes copied per second (each byte is read once and written once)"

    lay = dt.layout_of(cache[0])
    sums = torch.zeros((len(ids) + 64, 4), dtype=torch.int32, device=device)
    configs = [(dt.BLOCK, dt.PAGES, dt.NUM_WARPS, dt.UNROLL, dt.PARTIALS)]
    if sweep:
        configs = [(b, p, w, u, q) for u in (False, True) for q in (False, True) for b in (1024, 2048)
                   for p in (16, 32) for w in (4, 8)]
    tried: dict = {}
    for b, p, w, u, q in configs:  # the whole cache: one layer is too short a launch to rank them
        name = f"block{b}_pages{p}_warps{w}_unroll{int(u)}_partials{int(q)}"
        try:
            tt = timed(lambda b=b, p=p, w=w, u=u, q=q: [
                fused_lane_sums(kv, ids, lay, sums, block=b, pages=p, num_warps=w, unroll=u, partials=q)
                for kv in cache], device, reps=3)
            tried[name] = nbytes / tt
        except Exception as e:  # noqa: BLE001
            tried[name] = f"{type(e).__name__}: {e}"[:200]
    r["fused_sweep_Bps"] = tried
    best = max(((k, v) for k, v in tried.items() if isinstance(v, float)), key=lambda kv: kv[1])[0]
    b, p, w, u, q = (int(x) for x in re.findall(r"\d+", best))
    r["fused_best"] = {"block": b, "pages": p, "num_warps": w, "unroll": bool(u), "partials": bool(q)}
    t = timed(lambda: [fused_lane_sums(kv, ids, lay, sums, block=b, pages=p, num_warps=w, unroll=bool(u),
                                    partials=bool(q)) for kv in cache], device, reps=7)
    r["fused_digest_Bps"] = nbytes / t
    r["fused_digest_s_per_pass"] = t
    sub = ids[: min(len(ids), 2048)]
    gathered = cache[0].index_select(0, sub).view(len(sub), -1).view(torch.uint8)
    t = timed(lambda: device_digests(gathered), device, reps=3)
    r["torch_ops_digest_Bps"] = len(sub) * page / t
    host_ring = [torch.empty((len(ids), page), dtype=torch.uint8, pin_memory=device.type == "cuda")
                 for _ in range(2)]

    def d2h_all() -> None:
        for i, kv in enumerate(cache):
            g = kv.index_select(0, ids).view(len(ids), -1).view(torch.uint8)
            host_ring[i % 2].copy_(g, non_blocking=True)
    t = timed(d2h_all, device, reps=3)
    r["d2h_pinned_Bps"] = nbytes / t
    r["d2h_pinned_s_per_pass"] = t
    g = cache[0].index_select(0, ids).view(len(ids), -1).view(torch.uint8)
    t0 = time.perf_counter()
    g.cpu()
    r["d2h_pageable_Bps"] = len(ids) * page / (time.perf_counter() - t0)



@section("capture_pass")
def capture_pass(cache: list[torch.Tensor], ids: list[int], folder: Path, device: torch.device) -> None:
    r = RESULTS["rates"]
    refs_tags = [refs_for(li, ids) for li in range(len(cache))]
    expected: list[list[str]] = []
    for mode in ("digests", "digests", "mismatch"):  # first pass warms up (kernel compile, imports)
        w = CaptureWriter(folder / f"dig-{mode}-{len(expected)}", 0, keep="mismatch")
        dev_sync(device)
        t0 = time.perf_counter()
        got = []
        for li, kv in enumerate(cache):
            refs, tags = refs_tags[li]
            got.append(w.cache_pages("written" if mode == "digests" else "restored", refs, tags, kv, ids,
                                     step=0, expected=expected[li] if mode == "mismatch" else None))
        w.close()
        dev_sync(device)
        dt_ = time.perf_counter() - t0
        if mode == "digests":
            expected = got
        r[f"capture_digest_only_{'restore' if mode == 'mismatch' else 'write'}_s_per_pass"] = dt_
    from harness.kv_pages.digest import cache_digests

    dev_sync(device)
    t0 = time.perf_counter()
    for kv in cache:
        cache_digests(kv, ids)
    dev_sync(device)
    r["digest_strings_s_per_pass"] = time.perf_counter() - t0
    r["digest_strings_note"] = "fused kernel + lane sums to the host + digest strings, no index lines"
    w = CaptureWriter(folder / "full", 0, keep="all")
    dev_sync(device)
    t0 = time.perf_counter()
    for li, kv in enumerate(cache):
        refs, tags = refs_tags[li]
        w.cache_pages("written", refs, tags, kv, ids, step=0)
    w.close()
    dev_sync(device)
    r["capture_full_bytes_s_per_pass"] = time.perf_counter() - t0
    r["capture_full_bytes_file"] = os.path.getsize(folder / "full" / "worker-0.pages.bin")
    r["capture_full_bytes_note"] = "fused digests + gather + pinned async copies + write to a file (page cache)"
    os.remove(folder / "full" / "worker-0.pages.bin")


def write_bench_record(out: Path) -> Path:
    """The rates as a bench record (schema in harness.perf), every figure beside its limit."""
    from harness.perf import Figure, Limit, bench_record, write_bench

    r, shape = RESULTS["rates"], RESULTS["shape"]
    copy = Limit("device-to-device copy, bytes copied", r["d2d_copy_Bps"], "B/s")
    p = {**shape, "pages": r["pages_per_pass"], "bytes": r["bytes_per_pass"]}
    figs = [Figure("kv.digest_gpu_fused", r["fused_digest_Bps"], "B/s", copy,
                   goal=max(1e12, 0.5 * r["d2d_copy_Bps"]), params={**p, **r.get("fused_best", {})}),
            Figure("kv.digest_gpu_torch_ops", r["torch_ops_digest_Bps"], "B/s", copy, params=p),
            Figure("kv.d2h_pinned", r["d2h_pinned_Bps"], "B/s", copy, params=p),
            Figure("kv.d2h_pageable", r["d2h_pageable_Bps"], "B/s", copy, params=p)]
    kern = Limit("fused digest kernel, one pass", r["fused_digest_s_per_pass"], "s")
    for key, name in (("capture_digest_only_write_s_per_pass", "kv.capture_digest_only_write"),
                      ("capture_digest_only_restore_s_per_pass", "kv.capture_digest_only_restore"),
                      ("digest_strings_s_per_pass", "kv.digest_strings")):
        if key in r:
            figs.append(Figure(name, r[key], "s", kern, better="lower", params=p))
    if "capture_full_bytes_s_per_pass" in r:
        figs.append(Figure("kv.capture_full_bytes", r["capture_full_bytes_s_per_pass"], "s",
                           Limit("device-to-host pinned copy, one pass", r["d2h_pinned_s_per_pass"], "s"),
                           better="lower", params=p))
    facts = {**RESULTS["env"], "load_avg_1m": os.getloadavg()[0], "cores": os.cpu_count()}
    device = {"class": f"gpu:{RESULTS['env']['device']}", "fingerprint": None, "facts": facts,
              "source": "tests/device/kv_capture_gpu.py (harness.device not present)"}
    rec = bench_record(figs, {"kv_gpu": RESULTS}, RESULTS["errors"], Path(__file__).resolve().parents[2], device)
    if os.environ.get("HARNESS_GIT_SHA"):  # a copy of this tree inside another checkout: the copy's commit
        rec["harness"] = {"sha": os.environ["HARNESS_GIT_SHA"],
                          "dirty": os.environ.get("HARNESS_GIT_DIRTY", "1") != "0"}
        rec["id"] = f"{rec['harness']['sha'][:12]}-{rec['id'].split('-', 1)[1]}"
    return write_bench(out, rec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--spare", type=int, default=512, help="blocks in the cache beyond those in use")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--skip-capture", action="store_true")
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    RESULTS["env"] = {"torch": torch.__version__, "triton": getattr(dt.triton, "__version__", None),
                      "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
                      "fused_available": dt.available(device), "python": platform.python_version()}
    pages = -(-a.tokens // 16)
    blocks = pages + a.spare
    RESULTS["shape"] = {"layers": a.layers, "blocks": blocks, "pages_in_use": pages, "block_size": 16,
                        "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "tokens": a.tokens}
    t0 = time.perf_counter()
    cache = make_cache(a.layers, blocks, device)
    g = torch.Generator().manual_seed(1)
    ids = torch.randperm(blocks, generator=g)[:pages].sort().values.to(device)  # scattered, as a paged cache leaves them
    dev_sync(device)
    print(f"cache built: {a.layers} x {tuple(cache[0].shape)} in {time.perf_counter() - t0:.1f} s", flush=True)
    correctness(cache, ids, device)
    with tempfile.TemporaryDirectory() as d:
        digest_only_e2e(cache, ids.tolist()[:256], Path(d))
    rates(cache, ids, device, not a.no_sweep)
    if not a.skip_capture:
        with tempfile.TemporaryDirectory() as d:
            capture_pass(cache, ids.tolist(), Path(d), device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kv_gpu.json").write_text(json.dumps(RESULTS, indent=2, sort_keys=True, default=str))
    try:
        write_bench_record(out)
    except Exception as e:  # noqa: BLE001
        RESULTS["errors"]["bench_record"] = f"{type(e).__name__}: {e}"
    c, r = RESULTS["checks"], RESULTS["rates"]
    ok = all((v.get("ok", v.get("mismatches", 1) == 0)) for v in c.values()) and not RESULTS["errors"]
    print(json.dumps(c, sort_keys=True))
    for k in sorted(r):
        v = r[k]
        print(f"  {k:44s} {v / 1e9:10.2f} GB/s" if k.endswith("Bps") and isinstance(v, float) else f"  {k:44s} {v}")
    print("errors:", list(RESULTS["errors"]))
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
