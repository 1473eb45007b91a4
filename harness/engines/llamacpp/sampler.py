"""The :class:`~harness.abilities.Sampler` ability of ``llamacpp``: llama.cpp's sampler chain as
llama-cpp-python builds it, on the oracle's weights.

The runner builds the venv and writes the GGUF (F32 by default: the oracle's weights bit for bit)
but starts no server: the draws run in that venv (``draws_worker.py`` beside it),
with token-id prompts (the server refuses those): the statistical draws apply the sampler chain
``Llama.generate`` builds to the engine's own logits along the oracle's path, and the requests the
determinism lanes replay go through ``Llama.generate`` itself, prefix cache and all. Draws are made
one at a time, so there is no batch to be invariant to; the same seed twice must still give the
same tokens.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.abilities import SamplePass, SamplerTraits, Samples
from harness.engines.launch.draws import params, samples
from harness.engines.launch.procs import run_engine
from harness.engines.launch.worker_lines import WorkerFailed, check_result
from harness.excerpt import tail

WORKER = Path(__file__).with_name("draws_worker.py")
TIMEOUT_S = float(os.environ.get("HARNESS_SAMPLING_TIMEOUT_S", "5400"))
PREFIX_CACHE_HINT = (
    "Llama.generate reuses the longest prefix it holds and evaluates only the rest, in a decode batch "
    "of another size, whose logits round differently; the dist sampler walks the candidates in "
    "token-id order, so a shift that small moves a seeded draw to a neighbouring id. "
    "llamacpp:prefix_cache=off evaluates every replayed prompt whole (docs/sampling.md)"
)
"""Why llama.cpp's same seed twice can differ with its prefix cache on (measured on smollm2-135m:
docs/sampling.md)."""


class LlamaCppSampling:
    """Mixed into :class:`~harness.engines.llamacpp.runner.LlamaCppRunner`: needs its ``prepare`` (the
    venv and the GGUF), ``flags``, ``run_dir`` and ``timings``."""

    flags: Mapping[str, str]
    run_dir: Path | None
    timings: dict[str, float]

    def prepare(self) -> tuple[Any, Any]: ...

    prefix_cache: bool

    def sampler_traits(self) -> SamplerTraits:
        hint = PREFIX_CACHE_HINT if self.prefix_cache else ""
        return SamplerTraits("llama.cpp", "raw_logprobs", "serial", seed_hint=hint)  # type: ignore[arg-type]

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        venv, gguf = self.prepare()
        work = Path(tempfile.mkdtemp(prefix="sampling-llamacpp-", dir=self.run_dir))
        req, res, log = work / "request.json", work / "result.jsonl", work / "worker.log"
        req.write_text(json.dumps(self._request(str(gguf.path), passes)))
        t0 = time.perf_counter()
        exited = run_engine(
            [str(venv.python), str(WORKER), str(req), str(res)], log, TIMEOUT_S, label="llama.cpp draws"
        )
        try:
            done = check_result(
                res,
                "the llama.cpp sampling worker",
                exited,
                doing=f"drawing samples for {sum(len(p.requests) for p in passes)} requests",
            )
        except WorkerFailed as e:
            raise e.engine_error(tail(log.read_text(errors="replace"))) from None
        self.timings.update({**done.meta.get("timings", {}), "sample_wall_s": time.perf_counter() - t0})
        width = {(p.name, r.key): r.sampling.max_tokens for p in passes for r in p.requests}
        out: dict[str, dict[str, Samples]] = {p.name: {} for p in passes}
        for d in done.of("draws"):
            key = (d["pass"], d["key"])
            out[d["pass"]][d["key"]] = samples(d["key"], d["tokens"], d["logprobs"], width[key])
        return out

    def _request(self, gguf: str, passes: Sequence[SamplePass]) -> dict[str, Any]:
        replayed = {r.key for p in passes if p.name != "main" for r in p.requests}
        return {
            "gguf": gguf,
            "n_ctx": int(self.flags.get("n_ctx", 4096)),
            "n_threads": int(self.flags.get("n_threads", os.cpu_count() or 1)),
            "prefix_cache": self.prefix_cache,
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
