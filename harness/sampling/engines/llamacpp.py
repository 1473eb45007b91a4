"""``llamacpp``: llama.cpp's sampler chain as llama-cpp-python builds it, on the oracle's weights.

The :class:`~harness.engines.llamacpp.LlamaCppRunner` of the same spec builds the venv and writes
the GGUF (F32 by default: the oracle's weights bit for bit); the draws run in that venv
(:mod:`.llamacpp_worker`), with token-id prompts (the server refuses those): the statistical draws
apply the sampler chain ``Llama.generate`` builds to the engine's own logits along the oracle's
path, and the requests the determinism lanes replay go through ``Llama.generate`` itself, prefix
cache and all. Draws are made one at a time, so there is no batch to be invariant to; the same seed
twice must still give the same tokens.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from harness.api import EngineInfo, RunFacts, SamplePass, SamplerTraits, Samples
from harness.engines import RunnerContext, make_runner
from harness.engines.llamacpp import LlamaCppRunner
from harness.engines.procs import run_engine
from harness.engines.worker_lines import WorkerFailed, check_result
from harness.excerpt import tail
from harness.models import ModelRef
from harness.sampling.engines.base import SAMPLERS, params, samples

WORKER = Path(__file__).with_name("llamacpp_worker.py")
TIMEOUT_S = float(os.environ.get("HARNESS_SAMPLING_TIMEOUT_S", "5400"))


class LlamaCppSampler:
    def __init__(self, spec: str, model: ModelRef, ctx: RunnerContext) -> None:
        runner = make_runner(spec, model, ctx)
        assert isinstance(runner, LlamaCppRunner)
        self.runner, self.name, self.model, self.run_dir = runner, runner.name, model, ctx.run_dir
        self.version = ""
        self.timings: dict[str, float] = {}

    def traits(self) -> SamplerTraits:
        return SamplerTraits("llama.cpp", "raw_logprobs", "serial")

    def info(self) -> EngineInfo:
        base = self.runner.info()
        settings = {k: v for k, v in base.settings.items() if k in ("gguf", "gguf_sha256")}
        settings["n_ctx"] = self.runner.flags.get("n_ctx")
        return EngineInfo(
            self.name,
            "llama.cpp",
            f"llama-cpp-python {self.runner.version}",
            settings=settings,
            environment={k: v for k, v in base.environment.items() if k != "protocol"},
        )

    def start(self) -> None:
        self.runner.prepare()
        self.timings.update(self.runner.timings)

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        venv, gguf = self.runner.venv, self.runner.gguf
        assert venv is not None and gguf is not None, "start() first"
        work = Path(tempfile.mkdtemp(prefix="sampling-llamacpp-", dir=self.run_dir))
        req, res, log = work / "request.json", work / "result.jsonl", work / "worker.log"
        replayed = {r.key for p in passes if p.name != "main" for r in p.requests}
        req.write_text(
            json.dumps(
                {
                    "gguf": str(gguf.path),
                    "n_ctx": int(self.runner.flags.get("n_ctx", 4096)),
                    "n_threads": int(self.runner.flags.get("n_threads", os.cpu_count() or 1)),
                    "passes": [
                        {
                            "name": p.name,
                            "requests": [
                                {
                                    "key": r.key,
                                    "prompt_ids": list(r.prompt_ids),
                                    "path": list(r.path),
                                    "n": r.n,
                                    # what the lanes replay runs through Llama.generate itself
                                    "via": "generate" if r.key in replayed else "chain",
                                    "sampling": {
                                        **params(r.sampling),
                                        "max_tokens": r.sampling.max_tokens,
                                        "seed": r.sampling.seed,
                                    },
                                }
                                for r in p.requests
                            ],
                        }
                        for p in passes
                    ],
                }
            )
        )
        t0 = time.perf_counter()
        exited = run_engine([str(venv.python), str(WORKER), str(req), str(res)], log, TIMEOUT_S,
                            label="llama.cpp draws")
        try:
            done = check_result(res, "the llama.cpp sampling worker", exited,
                                doing=f"drawing samples for {sum(len(p.requests) for p in passes)} requests")
        except WorkerFailed as e:
            raise e.engine_error(tail(log.read_text(errors="replace"))) from None
        self.version = str(done.meta.get("version", ""))
        self.timings.update({**done.meta.get("timings", {}), "sample_wall_s": time.perf_counter() - t0})
        width = {(p.name, r.key): r.sampling.max_tokens for p in passes for r in p.requests}
        out: dict[str, dict[str, Samples]] = {p.name: {} for p in passes}
        for d in done.of("draws"):
            key = (d["pass"], d["key"])
            out[d["pass"]][d["key"]] = samples(d["key"], d["tokens"], d["logprobs"], width[key])
        return out

    def facts(self) -> RunFacts:
        return RunFacts(timings=dict(self.timings))

    def close(self) -> None:
        """The worker has exited by the time ``sample`` returns."""


@SAMPLERS.register("llamacpp", help="llama-cpp-python's sampler chain (Llama.generate), F32 GGUF by default")
def _factory(spec: str, model: ModelRef, ctx: RunnerContext) -> LlamaCppSampler:
    return LlamaCppSampler(spec, model, ctx)
