"""The :class:`~harness.abilities.Sampler` ability of ``openai:<url>``: the server's own sampler.

Every draw is one ``POST <base>/v1/completions`` through the runner's :class:`~.transport.Transport`
(the API key, retries, redacted excerpts), not streamed, with the prefix as a list of token ids,
``n = 1``, ``max_tokens`` = the test's steps, ``logprobs = 1``, the draw's own ``seed`` and every
sampling parameter in the body (``top_k``, ``min_p`` and ``repetition_penalty`` are vLLM's
extensions, which servers built on it accept). Tokens come back as ids (vLLM's
``return_token_ids``, or ``token_id:N`` logprob tokens). ``chain`` and ``logprobs_mode`` (spec
options) say what the server's sampler promises; ``c`` requests are in flight.

Each draw is its own seeded request, so the ``alone`` lane (each draw with nothing else in flight)
checks what a server promises about seeded requests under load.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness.abilities import SamplePass, SampleRequest, SamplerTraits, Samples
from harness.api import EngineFailed, EngineRefused, Sampling
from harness.engines.launch.draws import params, samples
from harness.engines.openai.options import OpenAIOptions
from harness.engines.openai.transport import Fault, Transport
from harness.sampling.transforms import CHAINS

TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


class OpenAISampling:
    """Mixed into :class:`~harness.engines.openai.runner.OpenAIRunner`: needs its ``options``,
    ``http``, ``start`` (which reads the served model) and ``timings``."""

    name: str
    options: OpenAIOptions
    http: Transport
    timings: dict[str, float]
    _served: dict[str, Any]

    def start(self) -> None: ...

    def sampler_traits(self) -> SamplerTraits:
        o = self.options
        return SamplerTraits(o.chain, o.logprobs_mode, "request", dict(CHAINS.get(o.chain).unsupported))

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        if not self._served:
            self.start()
        out: dict[str, dict[str, Samples]] = {}
        t0 = time.perf_counter()
        for p in passes:
            got = {}
            with ThreadPoolExecutor(1 if p.alone else self.options.concurrency) as pool:
                for r in p.requests:

                    def one(i: int, r: SampleRequest = r) -> tuple[list[int], list[float]]:
                        return self._draw(r.prompt_ids, r.sampling, r.sampling.seed + i)

                    res = list(pool.map(one, range(r.n)))
                    toks, lps = [a for a, _ in res], [b for _, b in res]
                    got[r.key] = samples(r.key, toks, lps, r.sampling.max_tokens)
            out[p.name] = got
        self.timings["sample_wall_s"] = time.perf_counter() - t0
        return out

    def _draw(self, prompt: Sequence[int], s: Sampling, seed: int) -> tuple[list[int], list[float]]:
        body = {
            **dict(self.options.body),
            "model": self._served.get("id", self.options.model),
            "prompt": [int(t) for t in prompt],
            "max_tokens": int(s.max_tokens),
            "n": 1,
            "logprobs": 1,
            "seed": int(seed),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **params(s),
        }
        try:
            reply = self.http.with_retries(lambda: self.http.complete(body, stream=False))
        except Fault as f:
            raise EngineFailed(f"{self.name}: a draw failed: {self.http.redact(f.describe())}") from None
        ids = reply.token_ids
        if ids is None:
            found = [TOKEN_ID.match(t) for t in reply.lp_tokens]
            if not found or not all(found):
                raise EngineRefused(
                    f"{self.name}: the server returns no token ids (return_token_ids / token_id:N)"
                )
            ids = [int(m.group(1)) for m in found if m]
        return [int(t) for t in ids], [float("nan") if x is None else float(x) for x in reply.lp_chosen]
