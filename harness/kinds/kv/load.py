"""The KV round trip under load (a suite whose ``[kv]`` table has a ``[kv.load]`` lane).

Restored KV has been reported corrupted only under load (CPU offload under load; a connector that
reports a full hit and an output that diverges at token 0), while the plain round trip restores one
request at a time. Here:

1. **producer**: every request alone (one ``generate`` call each), through the harness store:
   its pages are stored and captured, and its output is the reference ("the same request alone");
2. **consumer** (a fresh engine, prefix caching on, a KV pool of ``pool_blocks`` blocks): every
   request at once (``load`` pass: 64-256 in flight), the connector restoring from the store while
   the scheduler preempts and the prefix cache evicts; one request is replayed in a planted-fault
   lane (a stored byte flipped); then the same load reading no cache at all (``ref`` pass), which
   says whether the engine itself is bit-exact under this load for each request.

The requests share prefixes of several lengths (each base case of the suite cut at each
``prefix_tokens``) and end in tokens of their own. The judging is in :mod:`harness.kinds.kv.load_judge`.
"""

from __future__ import annotations

import os
import random
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.api import Case, EngineInfo, Output
from harness.kinds.kv.config import STORE_CLASS, STORE_MODULE
from harness.kinds.kv.load_judge import judge_load
from harness.kinds.kv.passes import merge_compat, request, run_phase
from harness.kinds.kv.roundtrip import FLIP, RoundTrip
from harness.kinds.kv.settings import KVSettings, LoadSettings, engine_settings, transfer
from harness.models import ModelRef
from harness.suites import Suite, SuiteError

FLIP_LANE = "flip"


def load_requests(cases: Sequence[Case], load: LoadSettings, where: str) -> list[Case]:
    """``load.requests`` prompts: base case ``i % B`` cut at prefix length ``(i // B) % P``, then
    ``suffix_tokens`` tokens of its own (drawn, seeded, from the base cases' own tokens)."""
    longest = max(load.prefix_tokens)
    short = [c.id for c in cases if len(c.prompt_ids) < longest]
    if not cases or short:
        raise SuiteError(f"{where}: every base case needs at least {longest} tokens (the longest shared "
                         f"prefix); too short: {', '.join(short) or 'no cases'}")
    rng = random.Random(load.seed)
    pool = sorted({t for c in cases for t in c.prompt_ids})
    out = []
    for i in range(load.requests):
        base = cases[i % len(cases)]
        p = load.prefix_tokens[(i // len(cases)) % len(load.prefix_tokens)]
        suffix = tuple(rng.choice(pool) for _ in range(rng.randint(*load.suffix_tokens)))
        out.append(Case(f"{base.id}/p{p}/r{i:03d}", tuple(base.prompt_ids[:p]) + suffix, "",
                        ("load", f"prefix:{p}", f"base:{base.id}")))
    return out


def flip_requests(requests: Sequence[Case], n: int, chunk: int) -> list[Case]:
    """Prompts for the planted-fault lane: each a request's tokens reversed, a prefix no other
    request shares, so the engine's own prefix cache cannot serve the page the store corrupts and
    the connector must load it (the producer stores them like the others)."""
    longer = [c for c in requests if len(c.prompt_ids) > chunk]
    return [Case(f"{c.id}+flip", tuple(reversed(c.prompt_ids)), "", ("flip",)) for c in longer[:n]]


def events_endpoint() -> str:
    """A short IPC path for vLLM's KV-cache event publisher (a socket path may not exceed ~100
    bytes, so not inside the run folder)."""
    return f"ipc://{tempfile.gettempdir()}/harness-kv-{os.getpid()}-{secrets.token_hex(4)}"


def consumer_engine(model: ModelRef, kv: KVSettings, load: LoadSettings, t: Mapping[str, Any],
                    endpoint: str) -> dict[str, Any]:
    """The consumer under load: prefix caching on (evictions), a small pool (preemptions), vLLM's
    counters kept, its KV-cache events published for :mod:`harness.kinds.kv.observe`."""
    return {**engine_settings(model, kv, t), "enable_prefix_caching": True,
            "num_gpu_blocks_override": load.pool_blocks, "max_model_len": load.max_model_len,
            "max_num_seqs": max(load.requests + load.flip_requests, 1), "disable_log_stats": False,
            "kv_events_config": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}}


def run_load(model: ModelRef, suite: Suite, cases: Sequence[Case], golden: Mapping[str, Output],
             run_dir: Path, kv: KVSettings, decode: Any = None, python: str | None = None) -> RoundTrip:
    """The round trip under load on the vLLM that ``python`` imports (default: the pin's)."""
    load = kv.load
    assert load is not None
    requests = load_requests(cases, load, f"{suite.path} [kv.load]")
    run_dir.mkdir(parents=True, exist_ok=True)
    cap, store = run_dir / "capture", run_dir / "store"
    chunk = kv.chunk_size
    flips = flip_requests(requests, load.flip_requests, chunk)
    t_prod = transfer(STORE_CLASS, STORE_MODULE, "kv_producer", {
        "capture_dir": str(cap / "producer"), "chunk_size": chunk, "lanes": {"clean": {"root": str(store)}}},
        kv.load_failure_policy)
    t_cons = transfer(STORE_CLASS, STORE_MODULE, "kv_consumer", {
        "capture_dir": str(cap / "consumer"), "chunk_size": chunk,
        "lanes": {"clean": {"root": str(store)}, FLIP_LANE: {"root": str(store), "fault": FLIP}}},
        kv.load_failure_policy)
    eng_p = {**engine_settings(model, kv, t_prod), "max_model_len": load.max_model_len}
    prod = run_phase(run_dir, "producer", model, eng_p, suite.sampling,
                     [{"name": "alone", "mode": "alone",
                       "requests": [request(c.id, c.prompt_ids) for c in [*requests, *flips]]}],
                     cap / "producer", timeout_s=load.timeout_s, python=python)
    timings: dict[str, float] = {"producer_engine_start_s": prod.timings.get("engine_start_s", float("nan"))}
    cons = None
    endpoint = events_endpoint()
    eng_c = consumer_engine(model, kv, load, t_cons, endpoint)
    if prod.ok:
        passes = [{"name": "load", "requests": [request(c.id, c.prompt_ids) for c in requests]
                   + [request(c.id, c.prompt_ids, FLIP_LANE) for c in flips]},
                  {"name": "ref", "requests": [request(c.id, c.prompt_ids, "ref", passive=True,
                                                       skip_reading=True, capture=False) for c in requests]}]
        try:
            cons = run_phase(run_dir, "consumer", model, eng_c, suite.sampling, passes, cap / "consumer",
                             timeout_s=load.timeout_s, python=python, observe={"events": endpoint})
        finally:
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
        timings["consumer_engine_start_s"] = cons.timings.get("engine_start_s", float("nan"))
    for ph in (prod, cons):
        for k, v in (ph.timings if ph is not None else {}).items():
            if k.startswith("pass_"):
                timings[f"{ph.name}_{k}"] = v
    version = prod.version or (cons.version if cons else "")
    info = EngineInfo("harness-store", "vllm", version or "unknown", settings={
        "connector": "harness-store", "chunk_size": chunk, "block_size": kv.block_size,
        "load_failure_policy": kv.load_failure_policy, "load": load.to_json(),
        **{k: v for k, v in eng_c.items() if k not in ("kv_transfer_config", "kv_events_config")}})
    extra: dict[str, Any] = {"run_dir": run_dir.name, "mode": "load", "connector": "harness-store",
                             "chunk_size": chunk}
    if compat := merge_compat([ph for ph in (prod, cons) if ph is not None]):
        extra["compat"] = compat
    judged = judge_load(requests, flips, prod, cons, load, suite.name, decode)
    extra.update(judged.extra)
    return RoundTrip(judged.verdicts, judged.controls, judged.gates, judged.summary, info, timings, extra,
                     run_dir)
