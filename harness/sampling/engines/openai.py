"""``openai:<base-url>``: any OpenAI-compatible server's sampler, over HTTP.

Every draw is one ``POST <base>/v1/completions`` with the prefix as a list of token ids, ``n = 1``,
``max_tokens`` = the test's steps, ``logprobs = 1``, the draw's own ``seed`` and every sampling
parameter in the body (``top_k``, ``min_p`` and ``repetition_penalty`` are vLLM's extensions,
which servers built on it accept). Tokens come back as ids (vLLM's ``return_token_ids``, or
``token_id:N`` logprob tokens). Options after the URL, comma-separated:

==================  =========================================================================
``chain``           the sampler chain the server documents (default ``vllm``;
                    ``llama.cpp``, ``transformers``: :data:`~harness.sampling.transforms.CHAINS`)
``logprobs_mode``   what its logprobs are (default ``raw_logprobs``, vLLM's default)
``c``               requests in flight (default 8)
``model``           the served model name (default: the first ``/v1/models`` lists)
``timeout``         seconds per request (default 120)
==================  =========================================================================

Each draw is its own seeded request, so the ``alone`` lane (each draw with nothing else in flight)
checks what a server promises about seeded requests under load.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness.api import EngineFailed, EngineInfo, EngineRefused, RunFacts, SamplePass, SamplerTraits, Samples
from harness.engines import RunnerContext, split_spec
from harness.excerpt import clip
from harness.models import ModelRef
from harness.sampling.engines.base import SAMPLERS, params, samples
from harness.sampling.transforms import CHAINS

TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


class OpenAISampler:
    def __init__(self, spec: str, model: ModelRef, ctx: RunnerContext) -> None:
        _name, arg = split_spec(spec)
        parts = (arg or "").split(",")
        self.base = parts[0].rstrip("/")
        if not self.base.startswith(("http://", "https://")):
            raise EngineRefused(f"{spec}: give the server's base URL, e.g. openai:http://127.0.0.1:8000")
        opts = dict(p.partition("=")[::2] for p in parts[1:] if p)
        self.chain = opts.pop("chain", "vllm")
        if self.chain not in CHAINS:
            raise EngineRefused(f"{spec}: chain {self.chain!r} is not one of {', '.join(CHAINS)}")
        self.mode = opts.pop("logprobs_mode", "raw_logprobs")
        self.c = int(opts.pop("c", 8))
        self.served = opts.pop("model", "")
        self.timeout = float(opts.pop("timeout", 120))
        if opts:
            raise EngineRefused(
                f"{spec}: unknown option(s) {', '.join(sorted(opts))}; valid: chain, "
                f"logprobs_mode, c, model, timeout"
            )
        self.name, self.model = ctx.name or spec, model
        self.version = ""
        self.timings: dict[str, float] = {}

    def traits(self) -> SamplerTraits:
        return SamplerTraits(self.chain, self.mode, "request", dict(CHAINS.get(self.chain).unsupported))

    def info(self) -> EngineInfo:
        return EngineInfo(
            self.name,
            "openai",
            self.version or "unknown",
            settings={"chain": self.chain, "logprobs_mode": self.mode, "model": self.served},
            environment={"base_url": self.base, "concurrency": self.c},
        )

    def _post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise EngineFailed(f"{path}: HTTP {e.code}: {clip(repr(e.read()))}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise EngineFailed(f"{path}: {e}") from None

    def start(self) -> None:
        models = self._post("/v1/models").get("data") or []
        if not self.served:
            if not models:
                raise EngineFailed(f"{self.base}/v1/models lists no model")
            self.served = str(models[0].get("id"))
        self.version = str(next((m.get("owned_by") for m in models if m.get("id") == self.served), "") or "")

    def _one(self, prompt: Sequence[int], s: Any, seed: int) -> tuple[list[int], list[float]]:
        body = {
            "model": self.served,
            "prompt": list(prompt),
            "max_tokens": int(s.max_tokens),
            "n": 1,
            "logprobs": 1,
            "seed": int(seed),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **params(s),
        }
        ch = (self._post("/v1/completions", body).get("choices") or [{}])[0]
        lp = ch.get("logprobs") or {}
        ids = ch.get("token_ids")
        if ids is None:
            toks = [TOKEN_ID.match(str(t)) for t in lp.get("tokens") or []]
            if not toks or not all(toks):
                raise EngineRefused(f"{self.base} returns no token ids (return_token_ids / token_id:N)")
            ids = [int(m.group(1)) for m in toks if m]
        return [int(t) for t in ids], [float(x) for x in lp.get("token_logprobs") or []]

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        out: dict[str, dict[str, Samples]] = {}
        t0 = time.perf_counter()
        for p in passes:
            got = {}
            with ThreadPoolExecutor(1 if p.alone else self.c) as pool:
                for r in p.requests:
                    res = list(
                        pool.map(
                            lambda i, r=r: self._one(r.prompt_ids, r.sampling, r.sampling.seed + i),
                            range(r.n),
                        )
                    )
                    got[r.key] = samples(
                        r.key, [a for a, _ in res], [b for _, b in res], r.sampling.max_tokens
                    )
            out[p.name] = got
        self.timings["sample_wall_s"] = time.perf_counter() - t0
        return out

    def facts(self) -> RunFacts:
        return RunFacts(timings=dict(self.timings))

    def close(self) -> None:
        """The server is not ours to stop."""


@SAMPLERS.register(
    "openai",
    help="an OpenAI-compatible server taking token-id prompts "
    "(openai:<url>,chain=vllm,logprobs_mode=raw_logprobs)",
)
def _factory(spec: str, model: ModelRef, ctx: RunnerContext) -> OpenAISampler:
    return OpenAISampler(spec, model, ctx)
