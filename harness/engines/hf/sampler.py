"""The :class:`~harness.abilities.Sampler` ability of ``hf``: transformers ``generate(do_sample=True)``
with its own logits processors.

The prefix (all but its last token) is run once into a KV cache; each chunk of up to
:data:`CHUNK` draws copies that cache, repeats it over the chunk and calls ``generate`` on the
whole prefix (so the repetition penalty sees every input id, as in any ``generate`` call) with
``torch.manual_seed(seed + chunk)``. The generation config holds the setting's parameters and
nothing else (a model's ``generation_config.json`` — a ``top_k=50``, a repetition penalty — never
sneaks in): temperature, top_k (0: off), top_p, min_p, repetition_penalty. transformers has no
presence or frequency penalty: those tests are refused.

Logprobs: ``hf:logprobs=processed`` (default) is ``log_softmax`` of ``generate``'s ``scores`` —
the logits after every processor, i.e. of the distribution it drew from; ``hf:logprobs=raw`` is
``log_softmax`` of its ``logits`` (before any). One generator per call: a draw depends on the rest
of its chunk, and nothing is promised across a batch.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.abilities import SamplePass, SamplerTraits, Samples
from harness.api import Sampling
from harness.engines.launch.draws import samples
from harness.sampling.transforms import TRANSFORMERS

CHUNK = 64
"""Draws per ``generate`` call: the cache of a 100-token prefix repeated 64 times is ~70 MB for
SmolLM2-135M in float32."""

LOGPROBS = {"processed": "processed_logprobs", "raw": "raw_logprobs"}
"""The ``logprobs`` option -> which logprobs the draws come with."""


class HFSampling:
    """Mixed into :class:`~harness.engines.hf.runner.HFRunner`: needs its ``lm``, ``device``, ``timings``,
    ``start`` and ``logprobs_mode``."""

    lm: Any
    device: str
    timings: dict[str, float]
    logprobs_mode: str
    _lm: Any

    def start(self) -> None: ...

    def sampler_traits(self) -> SamplerTraits:
        return SamplerTraits("transformers", self.logprobs_mode, "call", dict(TRANSFORMERS.unsupported))

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        import torch

        if self._lm is None:
            self.start()
        prefixes: dict[tuple[int, ...], Any] = {}
        out: dict[str, dict[str, Samples]] = {}
        t0 = time.perf_counter()
        for p in passes:
            got = {}
            for r in p.requests:
                try:
                    s = self._draw(tuple(r.prompt_ids), r.sampling, r.n, torch, prefixes)
                    got[r.key] = Samples(r.key, s.tokens, s.logprobs)
                except (RuntimeError, ValueError) as e:
                    got[r.key] = Samples(r.key, np.zeros((0, 1), np.int32), error=f"transformers failed: {e}")
            out[p.name] = got
        self.timings["sample_wall_s"] = time.perf_counter() - t0
        return out

    def _cache(self, prefix: tuple[int, ...], torch: Any, prefixes: dict[tuple[int, ...], Any]) -> Any:
        if prefix not in prefixes:
            if len(prefixes) > 8:
                prefixes.pop(next(iter(prefixes)))
            ids = torch.tensor([list(prefix[:-1])], device=self.device)
            with torch.inference_mode():
                prefixes[prefix] = self.lm(input_ids=ids, use_cache=True).past_key_values
        return prefixes[prefix]

    def _config(self, s: Sampling, steps: int) -> Any:
        from transformers import GenerationConfig

        base = self.lm.generation_config
        return GenerationConfig(
            do_sample=True,
            max_new_tokens=steps,
            temperature=float(s.temperature),
            top_k=int(s.top_k),
            top_p=float(s.top_p),
            min_p=float(s.min_p) if s.min_p > 0 else None,
            repetition_penalty=float(s.repetition_penalty),
            eos_token_id=base.eos_token_id,
            pad_token_id=base.pad_token_id if base.pad_token_id is not None else base.eos_token_id,
            output_scores=self.logprobs_mode == "processed_logprobs",
            output_logits=self.logprobs_mode == "raw_logprobs",
            return_dict_in_generate=True,
        )

    def _draw(
        self, prefix: tuple[int, ...], s: Sampling, n: int, torch: Any, prefixes: dict[tuple[int, ...], Any]
    ) -> Samples:
        steps = s.max_tokens
        cfg = self._config(s, steps)
        cache = self._cache(prefix, torch, prefixes)
        eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
        draws: list[list[int]] = []
        lps: list[list[float]] = []
        for c in range(0, n, CHUNK):
            b = min(CHUNK, n - c)
            kv = copy.deepcopy(cache)
            kv.batch_repeat_interleave(b)
            ids = torch.tensor([list(prefix)] * b, device=self.device)
            torch.manual_seed(int(s.seed) + c // CHUNK)
            with torch.inference_mode():
                g = self.lm.generate(
                    ids, attention_mask=torch.ones_like(ids), past_key_values=kv, generation_config=cfg
                )
            new = g.sequences[:, len(prefix) :].tolist()
            rows = g.scores if self.logprobs_mode == "processed_logprobs" else g.logits
            lp = torch.stack([torch.log_softmax(r.float(), dim=-1) for r in rows], dim=1)  # [b, T, V]
            for i, toks in enumerate(new):
                cut = next((j + 1 for j, t in enumerate(toks) if t in eos), len(toks))
                draws.append(toks[:cut])
                lps.append([float(lp[i, j, t]) for j, t in enumerate(toks[:cut])])
        return samples("", draws, lps, steps)
