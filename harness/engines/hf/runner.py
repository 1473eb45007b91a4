"""``hf``: Hugging Face transformers, greedy, one case at a time (no padding, so no padding noise).

Options (``hf:device=cuda,dtype=bfloat16``): ``device`` (cpu default), ``dtype`` (float32 default),
``kv`` (``plain`` default; ``quanto-int4`` / ``quanto-int2``: a quantized KV cache, decoded one token
per step, see :mod:`harness.engines.hf.decode`), ``decode`` (``generate``: transformers' ``generate``,
the default with a plain cache; ``step``: the harness's one-token-per-step loop, the only path for a
quantized cache — an A/B of caches compares both arms on it), ``weights`` (another checkpoint of the
named model, gated against its goldens: see :mod:`harness.engines.launch.weights`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.abilities import TensorAbility
from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.device import device_block
from harness.engines.base import ENGINES, RunnerContext, parse_options
from harness.engines.hf.decode import (
    KV_CHOICES,
    decode,
    kv_bytes,
    make_cache,
    score_forward,
    tensors_forward,
    tensors_stepwise,
)
from harness.engines.hf.sampler import LOGPROBS, HFSampling
from harness.engines.launch.layer_taps import LayerTaps, family_at
from harness.engines.launch.weights import Weights, checkpoint_for
from harness.models import ModelRef
from harness.teacher import scored_output

DTYPES = ("float32", "bfloat16", "float16")


class HFRunner(HFSampling):
    """transformers in this process; it also draws samples with ``generate``'s own sampler
    (:mod:`harness.engines.hf.sampler`: ``logprobs=processed|raw`` says which logprobs come back)."""

    def __init__(self, model: ModelRef, options: Mapping[str, str], name: str = "hf") -> None:
        self.name = name
        self.model = model
        self.device = options.get("device", "cpu")
        self.dtype = options.get("dtype", "float32")
        self.kv = options.get("kv", "plain")
        self.decode = options.get("decode", "generate" if self.kv == "plain" else "step")
        unknown = set(options) - {"device", "dtype", "kv", "decode", "weights", "logprobs"}
        if unknown:
            raise EngineRefused(f"hf: unknown option(s) {', '.join(sorted(unknown))}; "
                                "valid: device, dtype, kv, decode, weights, logprobs")
        self.logprobs_mode = LOGPROBS.get(options.get("logprobs", "processed"), "")
        if not self.logprobs_mode:
            raise EngineRefused(f"{name}: logprobs must be processed or raw")
        self.weights: Weights | None = (checkpoint_for(model, options["weights"], name)
                                        if "weights" in options else None)
        if self.decode not in ("generate", "step") or (self.decode == "generate" and self.kv != "plain"):
            raise EngineRefused(f"hf: decode {self.decode!r}: 'generate' (plain cache only) or 'step'")
        if self.kv not in KV_CHOICES:
            raise EngineRefused(f"hf: kv {self.kv!r} not one of {', '.join(KV_CHOICES)}")
        if self.dtype not in DTYPES:
            raise EngineRefused(f"hf: dtype {self.dtype!r} not one of {', '.join(DTYPES)}")
        self.timings: dict[str, float] = {}
        self.kv_facts: dict[str, float] = {}
        """KV bytes held by the cache after the longest case, read from the cache tensors."""
        self._lm: Any = None

    @property
    def path(self) -> str:
        """The checkpoint it loads: the named model's, or the ``weights`` option's."""
        return self.weights.path if self.weights else self.model.path

    @property
    def lm(self) -> Any:
        """The loaded transformers model (after ``start``): what its sampler draws with."""
        assert self._lm is not None, "start() first"
        return self._lm

    def info(self) -> EngineInfo:
        import transformers

        return EngineInfo(self.name, "transformers", transformers.__version__,
                          settings={"device": self.device, "dtype": self.dtype,
                                    **({"kv": self.kv} if self.kv != "plain" else {}),
                                    **({"decode": self.decode} if self.decode != "generate" else {}),
                                    **({"logprobs": self.logprobs_mode}
                                       if self.logprobs_mode != "processed_logprobs" else {}),
                                    **({"weights": self.weights.to_json()} if self.weights else {})})

    def start(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        t0 = time.perf_counter()
        try:
            self._lm = AutoModelForCausalLM.from_pretrained(
                self.path, dtype=getattr(torch, self.dtype)).to(self.device).eval()
        except (OSError, ValueError, RuntimeError) as e:
            raise EngineFailed(f"transformers could not load {self.path}: {e}") from None
        self.timings["engine_start_s"] = time.perf_counter() - t0

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        import torch

        assert self._lm is not None, "start() first"
        outs, n_tokens = [], 0
        t0 = time.perf_counter()
        for case in cases:
            try:
                outs.append(self._one(case, sampling, torch))
                n_tokens += len(outs[-1].token_ids)
            except RuntimeError as e:
                outs.append(Output(case.id, (), error=f"transformers failed: {e}"))
        self.timings["generate_s"] = time.perf_counter() - t0
        self.timings["output_tokens"] = n_tokens
        return outs

    def run_and_score(self, cases: Sequence[Case], sampling: Sampling,
                      continuations: Mapping[str, Sequence[int]] | None, k: int
                      ) -> tuple[list[Output], list[Output]]:
        """Generate, then score prompt + ``continuations`` (None: its own outputs) through the same
        KV cache path."""
        outs = self.run(cases, sampling)
        if continuations is None:
            continuations = {o.case_id: o.token_ids for o in outs if o.error is None}
        scores = []
        t0 = time.perf_counter()
        for case in cases:
            cont = continuations.get(case.id)
            if cont is None:
                continue
            if self.kv == "plain":
                rows = score_forward(self._lm, case.prompt_ids, cont, k, sampling.full_vocab)
                scores.append(scored_output(case.id, cont, *rows))
            else:
                d = decode(self._lm, case.prompt_ids, len(cont), k,
                           make_cache(self.kv, self._lm.config), forced=cont, full=sampling.full_vocab)
                scores.append(scored_output(case.id, cont, d.top_ids, d.top_logprobs, d.chosen, d.full))
        self.timings["score_s"] = time.perf_counter() - t0
        return outs, scores

    def capture_tensors(self, cases: Sequence[Case], continuations: Mapping[str, Sequence[int]]
                        ) -> dict[str, dict[str, np.ndarray]]:
        """Per case: logits and every layer's hidden states at each position of the continuation
        (the row predicting continuation token t), through this runner's KV cache path."""
        out = {}
        for case in cases:
            cont = continuations.get(case.id)
            if not cont:
                continue
            ids, start = [*case.prompt_ids, *cont[:-1]], len(case.prompt_ids) - 1
            out[case.id] = (tensors_forward(self._lm, ids, start) if self.kv == "plain" else
                            tensors_stepwise(self._lm, ids, start, make_cache(self.kv, self._lm.config)))
        return out

    def tensor_ability(self) -> TensorAbility:
        fam = family_at(self.path)
        why = {"layers": fam} if isinstance(fam, str) else {}
        if self.kv != "plain":
            why["layers"] = (f"hf:kv={self.kv} reads its quantized cache only when decoding one token per "
                             "step; a whole-sequence forward pass would not")
        # the note is in committed records as written (the taps are harness.engines.launch.layer_taps)
        return TensorAbility(continuation=True, layers=not why, why_not=why,
                             note="forward hooks on transformers' modules (harness.engines.layer_taps)")

    def capture_layers(self, sequences: Mapping[str, Sequence[int]]) -> dict[str, dict[str, np.ndarray]]:
        """One forward pass per sequence with taps on every sub-block (plain cache only)."""
        import torch

        assert self._lm is not None, "start() first"
        ability = self.tensor_ability()
        if not ability.layers:
            raise EngineRefused(f"{self.name}: {ability.reason('layers')}")
        fam = family_at(self.path)
        assert not isinstance(fam, str)
        taps = LayerTaps(self._lm, fam)
        out = {}
        t0 = time.perf_counter()
        try:
            for sid, ids in sequences.items():
                taps.arm()
                with torch.inference_mode():
                    logits = self._lm(torch.tensor([list(ids)], device=self.device)).logits
                got = {k: v.numpy() for k, v in taps.take().items()}
                got["logits"] = logits[0].float().cpu().numpy()
                out[sid] = {k: got[k] for k in taps.names() if k in got}
        finally:
            taps.close()
        self.timings["tensors_s"] = time.perf_counter() - t0
        return out

    def _decode_path(self, case: Case, sampling: Sampling) -> Output:
        tok = self._lm.generation_config
        eos = tok.eos_token_id if isinstance(tok.eos_token_id, list) else [tok.eos_token_id]
        d = decode(self._lm, case.prompt_ids, sampling.max_tokens, max(sampling.logprobs, 1),
                   make_cache(self.kv, self._lm.config), eos=[e for e in eos if e is not None],
                   full=sampling.full_vocab)
        self._note_kv(d.kv_bytes, d.cached_tokens)
        finish = "stop" if d.tokens and d.tokens[-1] in eos else "length"
        return Output(case.id, tuple(d.tokens), self.model.decode(d.tokens), d.top_ids, d.top_logprobs,
                      d.chosen, finish, full_logprobs=d.full)

    def _note_kv(self, nbytes: int, cached_tokens: int) -> None:
        """Keep the KV footprint of the longest case: the engine's own cache tensors, measured."""
        if cached_tokens > self.kv_facts.get("cached_tokens", 0):
            self.kv_facts = {"kv_bytes": nbytes, "cached_tokens": cached_tokens,
                             "kv_bytes_per_token": nbytes / max(cached_tokens, 1)}

    def _one(self, case: Case, sampling: Sampling, torch: Any) -> Output:
        if self.decode == "step":
            return self._decode_path(case, sampling)
        ids = torch.tensor([list(case.prompt_ids)], device=self.device)
        with torch.inference_mode():
            g = self._lm.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=sampling.max_tokens,
                do_sample=False, output_logits=True, return_dict_in_generate=True)
        gen = g.sequences[0, ids.shape[1]:].tolist()
        if getattr(g, "past_key_values", None) is not None:
            self._note_kv(kv_bytes(g.past_key_values), int(ids.shape[1]) + max(len(gen) - 1, 0))
        logits = torch.stack(g.logits, dim=1)[0].float()  # [T, V], raw (unprocessed) logits
        lp = torch.log_softmax(logits, dim=-1)
        k = max(sampling.logprobs, 1)
        top = lp.topk(k, dim=-1)
        chosen = lp.gather(1, torch.tensor(gen, device=lp.device)[:, None])[:, 0]
        tok = self._lm.generation_config
        eos = tok.eos_token_id if isinstance(tok.eos_token_id, list) else [tok.eos_token_id]
        finish = "stop" if gen and gen[-1] in eos else "length"
        return Output(
            case.id, tuple(int(t) for t in gen), self.model.decode(gen),
            top.indices.cpu().numpy().astype(np.int32), top.values.cpu().numpy().astype(np.float32),
            chosen.cpu().numpy().astype(np.float32), finish,
            full_logprobs=lp.cpu().numpy() if sampling.full_vocab else None)

    def facts(self) -> RunFacts:
        cap: dict[str, Any] = {}
        if self.kv_facts.get("kv_bytes_per_token"):
            cap = {"bytes_per_token": float(self.kv_facts["kv_bytes_per_token"]),
                   "at_cached_tokens": int(self.kv_facts["cached_tokens"]),
                   "kv_bytes": int(self.kv_facts["kv_bytes"]),
                   "source": "bytes held by the transformers cache tensors (quantized data, scales, "
                             "full-precision residual) after the longest case"}
        return RunFacts(timings=dict(self.timings), kv_capacity=cap,
                        device=device_block("cuda" if self.device.startswith("cuda") else "cpu"))

    def close(self) -> None:
        self._lm = None


@ENGINES.register("hf", help="Hugging Face transformers (hf:device=cuda,dtype=bfloat16,kv=quanto-int4)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> HFRunner:
    return HFRunner(model, parse_options(arg, spec), name=ctx.name or spec)
