"""``vllm``: the pinned vLLM as the registry makes it — :class:`~harness.engines.vllm.runner.VLLMRunner`
with the :class:`~harness.abilities.Sampler` ability, its own sampler offline.

Every draw is one request (``max_tokens`` = the test's steps, ``logprobs=1``, the draw's own seed),
all of a pass in one ``generate`` call, every pass in one engine start: the invariance kind's
passes (:mod:`harness.engines.vllm.phase`), with the prefix cache on (the tests' prefixes are
block-aligned, so a draw computes one token). vLLM gives each seeded request its own generator, so
its draws must not depend on the batch: the ``alone`` pass runs the determinism requests one
``generate`` call each.

``vllm:logprobs_mode=processed_logprobs`` (any option ``vllm.LLM`` takes) is passed on; the mode is
what the logprob check judges against. Other vLLM releases are not driven offline here (the passes
run in this venv's vLLM): ``vllm@<version>`` has no sampler; serve it (``vllm-server@<version>``).
The ability sits here, not in :mod:`harness.engines.vllm.runner`, because the passes' runner
(:mod:`harness.engines.vllm.passes`) itself reads results with that module.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.abilities import SamplePass, SamplerTraits, Samples
from harness.api import EngineFailed, EngineRefused, Sampling
from harness.engines.base import ENGINES, RunnerContext, parse_options
from harness.engines.launch.draws import params, samples
from harness.engines.vllm.passes import Group, Pass, Request, run_vllm_group
from harness.engines.vllm.runner import VLLMRunner
from harness.models import ModelRef

TIMEOUT_S = float(os.environ.get("HARNESS_SAMPLING_TIMEOUT_S", "5400"))
MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
JUDGED = ("raw_logprobs", "processed_logprobs")


class PinnedVLLM(VLLMRunner):
    """The pinned vLLM (``vllm`` / ``vllm:<options>``): a :class:`VLLMRunner` that also samples."""

    def sampler_traits(self) -> SamplerTraits:
        mode = self._mode()
        return SamplerTraits("vllm", mode if mode in JUDGED else f"{mode} (not judged)", "request")

    def _mode(self) -> str:
        mode = str(self.settings.get("logprobs_mode", "raw_logprobs"))
        if mode not in MODES:
            raise EngineRefused(f"{self.name}: logprobs_mode {mode!r} is not one of {', '.join(MODES)}")
        return mode

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        settings = {**self.settings, "enable_prefix_caching": True}
        # no partial prefills: vLLM 0.32 rewinds a seeded request's generator when it discards the
        # token sampled after a partial prefill (gpu_model_runner: gen.set_offset), which a CPU
        # torch.Generator refuses ("CPU Generator does not use offset") — a prefix that is not
        # block-aligned (a control site) leaves up to a block to prefill per draw, and thousands of
        # draws in one call fill the token budget mid-prefill
        settings.setdefault("enable_chunked_prefill", False)
        if not settings["enable_chunked_prefill"]:
            settings.setdefault("max_num_batched_tokens", max(int(settings.get("max_model_len") or 0), 8192))
        logged = self._mode() in JUDGED
        keys: dict[str, list[str]] = {}
        phase = []
        for p in passes:
            rs = []
            for r in p.requests:
                over: dict[str, Any] = {**params(r.sampling), "max_tokens": r.sampling.max_tokens}
                ks = keys[f"{p.name}/{r.key}"] = [f"{r.key}#{i}" for i in range(r.n)]
                rs += [
                    Request(
                        k, r.prompt_ids, skip_reading=False, sampling={**over, "seed": r.sampling.seed + i}
                    )
                    for i, k in enumerate(ks)
                ]
            phase.append(Pass(p.name, tuple(rs), mode="alone" if p.alone else "together"))
        folder = Path(tempfile.mkdtemp(prefix="sampling-vllm-", dir=self.run_dir))
        t0 = time.perf_counter()
        g = run_vllm_group(
            Group("sampler", settings, tuple(phase)),
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
        self.meta["version"] = g.version
        self.settings = settings  # what drew, for the record
        out: dict[str, dict[str, Samples]] = {}
        for p in passes:
            got: dict[str, Samples] = {}
            for r in p.requests:
                outs = [g.output(p.name, k) for k in keys[f"{p.name}/{r.key}"]]
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


@ENGINES.register("vllm", help="the pinned vLLM as a candidate (vllm:dtype=bfloat16)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> PinnedVLLM:
    return PinnedVLLM(
        model,
        parse_options(arg, spec),
        name=ctx.name or spec,
        run_dir=ctx.run_dir,
        concurrency=ctx.concurrency,
    )
