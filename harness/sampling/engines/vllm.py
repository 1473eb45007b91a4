"""``vllm``: the pinned vLLM's own sampler, offline.

Every draw is one request (``max_tokens`` = the test's steps, ``logprobs=1``, the draw's own seed),
all of a pass in one ``generate`` call, every pass in one engine start: the invariance kind's
passes (:mod:`harness.invariance.phase`), with the prefix cache on (the tests' prefixes are
block-aligned, so a draw computes one token). vLLM gives each seeded request its own generator, so
its draws must not depend on the batch: the ``alone`` pass runs the determinism requests one
``generate`` call each.

``vllm:logprobs_mode=processed_logprobs`` (any option ``vllm.LLM`` takes) is passed on; the mode is
what the logprob check judges against. Other vLLM releases are not driven offline here (the
passes run in this venv's vLLM): serve one and use ``openai:<url>``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.api import (
    EngineFailed,
    EngineInfo,
    EngineRefused,
    RunFacts,
    SamplePass,
    SamplerTraits,
    Samples,
    Sampling,
)
from harness.engines import RunnerContext, make_runner
from harness.engines.vllm import VLLMRunner
from harness.invariance.plan import Group, Pass, Request
from harness.invariance.run import run_vllm_group
from harness.models import ModelRef
from harness.sampling.engines.base import SAMPLERS, params, samples

TIMEOUT_S = float(os.environ.get("HARNESS_SAMPLING_TIMEOUT_S", "5400"))
MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")


class VLLMSampler:
    def __init__(self, spec: str, model: ModelRef, ctx: RunnerContext) -> None:
        runner = make_runner(spec, model, ctx)
        if not isinstance(runner, VLLMRunner) or runner.python != sys.executable:
            raise EngineRefused(
                f"{spec}: the sampling gate drives the pinned vLLM offline; serve another "
                f"release and gate it as openai:<url>"
            )
        self.runner = runner
        self.name = runner.name
        self.model = model
        self.run_dir = ctx.run_dir
        self.settings = {**runner.settings, "enable_prefix_caching": True}
        self.mode = str(self.settings.get("logprobs_mode", "raw_logprobs"))
        if self.mode not in MODES:
            raise EngineRefused(f"{spec}: logprobs_mode {self.mode!r} is not one of {', '.join(MODES)}")
        self.version = ""
        self.timings: dict[str, float] = {}

    def traits(self) -> SamplerTraits:
        mode = (
            self.mode if self.mode in ("raw_logprobs", "processed_logprobs") else f"{self.mode} (not judged)"
        )
        return SamplerTraits("vllm", mode, "request")

    def info(self) -> EngineInfo:
        base = self.runner.info()
        return EngineInfo(self.name, "vllm", self.version or base.version, settings=dict(self.settings))

    def start(self) -> None:
        """The engine starts inside ``sample`` (one child process for every pass)."""

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        reqs: dict[str, list[str]] = {}
        phase = []
        for p in passes:
            rs = []
            for r in p.requests:
                over: dict[str, Any] = {**params(r.sampling), "max_tokens": r.sampling.max_tokens}
                keys = [f"{r.key}#{i}" for i in range(r.n)]
                reqs[f"{p.name}/{r.key}"] = keys
                rs += [
                    Request(
                        k, r.prompt_ids, skip_reading=False, sampling={**over, "seed": r.sampling.seed + i}
                    )
                    for i, k in enumerate(keys)
                ]
            phase.append(Pass(p.name, tuple(rs), mode="alone" if p.alone else "together"))
        folder = Path(tempfile.mkdtemp(prefix="sampling-vllm-", dir=self.run_dir))
        t0 = time.perf_counter()
        g = run_vllm_group(
            Group("sampler", self.settings, tuple(phase)),
            self.model,
            Sampling(max_tokens=1, logprobs=1),
            folder,
            {},
            TIMEOUT_S,
        )
        self.timings = {**dict(g.timings), "sample_wall_s": time.perf_counter() - t0}
        if g.status == "refused":
            raise EngineRefused(g.reason)
        if not g.ok:
            raise EngineFailed(g.reason, g.log_tail)
        self.version = g.version
        logged = self.mode in ("raw_logprobs", "processed_logprobs")
        out: dict[str, dict[str, Samples]] = {}
        for p in passes:
            got: dict[str, Samples] = {}
            for r in p.requests:
                outs = [g.output(p.name, k) for k in reqs[f"{p.name}/{r.key}"]]
                err = next((o.error for o in outs if o.error), None)
                if err:
                    got[r.key] = Samples(r.key, samples(r.key, [], None, 1).tokens, error=err)
                    continue
                lps = [list(o.chosen_logprobs) if o.chosen_logprobs is not None else [] for o in outs]
                got[r.key] = samples(
                    r.key, [o.token_ids for o in outs], lps if logged else None, r.sampling.max_tokens
                )
            out[p.name] = got
        return out

    def facts(self) -> RunFacts:
        return RunFacts(timings=dict(self.timings))

    def close(self) -> None:
        """The child process has exited by the time ``sample`` returns."""


@SAMPLERS.register("vllm", help="the pinned vLLM offline, one seeded request per draw")
def _factory(spec: str, model: ModelRef, ctx: RunnerContext) -> VLLMSampler:
    return VLLMSampler(spec, model, ctx)
