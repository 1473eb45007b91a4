"""``make bench``: the harness's hot paths on this machine, each beside its limit, as one JSON record.

    python benchmarks/bench.py [--out reports/bench] [--quick] [--no-gate] [--only compare,full,kv,gate]

Parts (each measured in this process, on the same bytes as its limit):

* ``compare``: strict + near-tie + vLLM rule + top-k KL (k = 5) over 10^6 positions, fused kernel vs
  the numpy kernels vs a per-token loop doing the same work (``benchmarks/compare_throughput.py``);
  goal 20 M positions/s;
* ``full``: full-vocabulary KL + NMSE facts (:func:`harness.compare.kernels.full.row_facts`) over two
  ``[256, 49152]`` float32 arrays (smollm2's vocabulary), against memcpy of the same bytes (one
  thread): the compiled kernel on numba's threads and on one thread, and the numpy path;
* ``kv``: the KV gate's compare (digests first), the byte compare where digests do not settle it,
  the diff of pages one byte apart, and the host page digests (``xxh128``; ``mx128``, the fallback),
  against memcpy of the same bytes (:func:`harness.kinds.kv.bench.throughput`), on 64 KiB pages (an 8B
  model's block) and 16 KiB pages (tiny-llama's); the written and restored copies of a page are
  separate buffers, as when read back from two capture files;
* ``gate``: ``make gate MODEL=tiny-llama SPEED=0`` (committed goldens, the transformers candidate),
  timed in this process, against the candidate engine's own wall time.

Writes ``<out>/<sha12>-<time>.json`` (schema in :mod:`harness.perf`) and prints one line per figure.
A part that fails is named under ``errors`` and the others still run.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness.perf import Figure, Limit, bench_record, rate, write_bench  # noqa: E402

ROUNDS = 5
"""Each rate is the fastest of this many rounds (:func:`harness.perf.rate`): the machine is shared."""


def part_compare(quick: bool) -> tuple[list[Figure], dict]:
    import compare_throughput as ct

    r = ct.run(200_000 if quick else 1_000_000, 5, repeats=3 if quick else 5,
               loop_positions=50_000 if quick else 200_000)
    loop = Limit("per-token loop, same work", r["loop_positions_per_s"], "positions/s")
    params = {"positions": r["positions"], "k": 5, "agree": "every position",
              "kl_gap": r["kl_max_gap_vs_loop"]}
    return [Figure("compare.fused", r["fused_positions_per_s"], "positions/s", loop,
                   goal=ct.GOAL_POSITIONS_PER_S, params=params),
            Figure("compare.numpy", r["numpy_positions_per_s"], "positions/s", loop, params=params)], r


def part_full(quick: bool) -> tuple[list[Figure], dict]:
    from harness.compare.kernels.full import row_facts

    n, v = (64 if quick else 256), 49152
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((n, v)).astype(np.float32) * 3
    o = logits - np.log(np.exp(logits.astype(np.float64)).sum(axis=1, keepdims=True)).astype(np.float32)
    c = (o + rng.standard_normal((n, v)).astype(np.float32) * 0.01).astype(np.float32)
    nbytes = o.nbytes + c.nbytes
    dst = np.empty_like(o)
    min_s = 0.3 if quick else 1.0
    memcpy = rate(nbytes, lambda: (np.copyto(dst, o), np.copyto(dst, c)), min_s, ROUNDS)
    fused = rate(nbytes, lambda: row_facts(o, c), min_s, ROUNDS)  # after a warm-up call (numba's first)
    plain = rate(nbytes, lambda: row_facts(o, c, compiled=False), min_s, ROUNDS)
    one = _one_thread(lambda: rate(nbytes, lambda: row_facts(o, c), min_s, ROUNDS))
    r = {"positions": n, "vocab": v, "bytes": nbytes, "compiled_Bps": fused, "numpy_Bps": plain,
         "compiled_one_thread_Bps": one, "memcpy_Bps": memcpy, "positions_per_s": fused / nbytes * n}
    limit = Limit("memcpy of the same bytes", memcpy, "B/s")
    p = {"positions": n, "vocab": v, "positions_per_s": fused / nbytes * n}
    return [Figure("full.kl_nmse", fused, "B/s", limit, goal=0.5 * memcpy, params={**p, "path": "compiled"}),
            Figure("full.kl_nmse_one_thread", one, "B/s", limit, goal=0.5 * memcpy,
                   params={**p, "path": "compiled", "threads": 1}),
            Figure("full.kl_nmse_numpy", plain, "B/s", limit, params={**p, "path": "numpy"})], r


def _one_thread(measure):  # noqa: ANN001, ANN202
    """``measure()`` with the compiled kernel on one thread, as memcpy runs: on a shared host the
    threaded figure also measures how the other jobs leave the cores."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return measure()
    finally:
        numba.set_num_threads(threads)


def part_kv(quick: bool) -> tuple[list[Figure], dict]:
    from harness.compare.byte_equal import judge_page
    from harness.kinds.kv.bench import throughput
    from harness.kv_pages.digest import HOST, digest_bytes
    from harness.kv_pages.evidence import MemoryPage
    from harness.kv_pages.identity import PageRef

    figs, runs = [], {}
    rng = np.random.default_rng(1)
    for label, page, n in (("64k", 65536, 64 if quick else 256), ("16k", 16384, 24)):
        written = [rng.integers(0, 256, page, dtype=np.uint8).tobytes() for _ in range(n)]
        pairs = [(a, bytes(bytearray(a))) for a in written]  # equal bytes, two buffers
        refs = [PageRef(f"{i:032x}", "layer", 0, 0, 16) for i in range(n)]
        mem = [(MemoryPage(r, digest_bytes(a), a), MemoryPage(r, digest_bytes(b), b))
               for r, (a, b) in zip(refs, pairs, strict=True)]

        def judge_all(mem=mem, refs=refs) -> None:  # noqa: ANN001
            for r, (w, x) in zip(refs, mem, strict=True):
                judge_page(r, w, x)
        t = throughput(judge_all, pairs, min_s=0.1 if quick else 0.5, rounds=ROUNDS)
        runs[label] = t
        memcpy = Limit("memcpy of the same bytes", t["memcpy_Bps"], "B/s")
        p = {"page_bytes": page, "pages": n}
        half = 0.5 * t["memcpy_Bps"]
        figs += [Figure(f"kv.compare_{label}", t["compare_Bps"], "B/s", memcpy, goal=half, params=p),
                 Figure(f"kv.compare_bytes_{label}", t["compare_bytes_Bps"], "B/s", memcpy, goal=half,
                        params=p),
                 Figure(f"kv.digest_host_{label}", t["digest_Bps"], "B/s", memcpy, goal=half,
                        params={**p, "algorithm": HOST}),
                 Figure(f"kv.diff_{label}", t["diff_Bps"], "B/s", memcpy,
                        params={**p, "pairs": "one byte apart"}),
                 Figure(f"kv.digest_host_mx128_{label}", t["digest_mx128_Bps"], "B/s", memcpy,
                        params={**p, "algorithm": "mx128"})]
    return figs, runs


def part_gate(quick: bool) -> tuple[list[Figure], dict]:
    from harness.pipeline import run_gate_by_name
    from harness.workspace import Workspace

    t0 = time.perf_counter()
    res = run_gate_by_name(Workspace.default(), "tiny-llama", "smoke", "hf", write=False, speed=False)
    wall = time.perf_counter() - t0
    t = dict(res.record.timings)
    r = {"wall_s": wall, "outcome": res.record.outcome, "timings": t}
    engine = float(t.get("candidate_wall_s", 0.0))
    if res.record.outcome != "pass":
        raise RuntimeError(f"the gate did not pass ({res.record.outcome}): {res.record.summary}")
    return [Figure("gate.wall", wall, "s", Limit("the candidate engine's own wall", engine, "s"),
                   better="lower",
                   params={"model": "tiny-llama", "suite": "smoke", "candidate": "hf",
                           "compare_s": t.get("compare_s"), "goldens_s": t.get("goldens_s")})], r


PARTS = {"compare": part_compare, "full": part_full, "kv": part_kv, "gate": part_gate}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    ap.add_argument("--quick", action="store_true", help="smaller sizes (tests)")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated parts: " + ",".join(PARTS))
    a = ap.parse_args(argv)
    names = [p for p in (a.only.split(",") if a.only else PARTS) if p and not (a.no_gate and p == "gate")]
    figures, runs, errors = [], {}, {}
    for name in names:
        t0 = time.perf_counter()
        try:
            figs, runs[name] = PARTS[name](a.quick)
            figures += figs
        except Exception as e:  # noqa: BLE001 - one failing part must not hide the others
            errors[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
        err = f"  ERROR {errors[name].splitlines()[0]}" if name in errors else ""
        print(f"[{name}] {time.perf_counter() - t0:.1f} s{err}", file=sys.stderr)
    record = bench_record(figures, runs, errors, ROOT)
    path = write_bench(Path(a.out), record)
    for f in figures:
        print(f.line())
    dev = record["device"]
    print(f"record: {path}  ({dev['class']}, load {dev['facts'].get('load_avg_1m')})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
