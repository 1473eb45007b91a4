"""CTranslate2 worker (runs in ``.venvs/ctranslate2-<version>/``; protocol: ``worker_protocol.py``).

Conversion: CTranslate2's own transformers converter (``TransformersConverter``) on the model's
folder, ``quantization="float32"``: the oracle's float32 weights, not requantized. Families without
a loader in the converter are refused with the converter's words.

Generation: ``Generator.generate_batch`` one case at a time, greedy (``beam_size=1``,
``sampling_topk=1``), the prompt decoded through the KV cache one step at a time as CTranslate2
does by default (``include_prompt_in_result=True``, its tokens then cut from the result), the end
token kept (``return_end_token=True``: vLLM keeps it too), every other option at a value that
changes nothing (``repetition_penalty=1``, ``no_repeat_ngram_size=0``, ``min_length=0``) and
``return_logits_vocab=True``: the whole vocabulary's logits at every generated position. The prompt
goes in as the oracle's token ids, turned into the converted model's vocabulary strings one id at a
time (no tokenizer is involved: ``vocabulary.json`` is the id order). Teacher forcing goes through
the decode path: prompt + continuation as constrained start tokens (:meth:`CT2.score`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from worker_protocol import Engine, Generated, Refused, main

PREFILL_ONCE = """``prefill=once``: ``include_prompt_in_result=False``, the prompt forwarded in one pass
(faster, and what CTranslate2's documentation suggests for long inputs). On Gemma 3 with a prompt
longer than the sliding window its logits differ from the step-by-step decode of the same prompt
(up to 1.6 nats on tiny-gemma3, window 64), and the step-by-step ones are vLLM's."""

GREEDY = {"beam_size": 1, "sampling_topk": 1, "sampling_topp": 1.0, "sampling_temperature": 1.0,
          "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0,
          "include_prompt_in_result": False, "return_end_token": True, "return_logits_vocab": True}
"""Every generation option that could change a greedy decode, set explicitly (see module doc)."""


class CT2(Engine):
    @staticmethod
    def convert(source: str, dest: str, options: dict[str, Any]) -> dict[str, Any]:
        import ctranslate2
        import transformers
        from ctranslate2.converters import TransformersConverter
        from ctranslate2.converters.transformers import _MODEL_LOADERS

        config = type(transformers.AutoConfig.from_pretrained(source)).__name__
        if config not in _MODEL_LOADERS:
            raise Refused(f"CTranslate2 {ctranslate2.__version__}'s transformers converter has no loader "
                          f"for {config}; it converts "
                          f"{', '.join(sorted(n.removesuffix('Config') for n in _MODEL_LOADERS))}")
        quant = options.get("quantization", "float32")
        conv = TransformersConverter(source, load_as_float16=False, low_cpu_mem_usage=False)
        conv.convert(dest, quantization=quant, force=True)
        return {"converter": f"ctranslate2.converters.TransformersConverter (ctranslate2 "
                             f"{ctranslate2.__version__}, transformers {transformers.__version__})",
                "quantization": quant, "loader": type(_MODEL_LOADERS[config]).__name__}

    def version(self) -> str:
        import ctranslate2

        return ctranslate2.__version__

    def start(self) -> None:
        import ctranslate2

        model = self.req["model"]
        threads = int(self.options.get("threads", os.cpu_count() or 1))
        self.generator = ctranslate2.Generator(model, device="cpu", compute_type="float32",
                                               intra_threads=threads, inter_threads=1)
        with open(os.path.join(model, "vocabulary.json")) as fh:
            self.vocab: list[str] = json.load(fh)
        with open(os.path.join(model, "config.json")) as fh:
            self.config = json.load(fh)
        self.notes.append(f"compute_type {self.generator.compute_type}, {threads} intra threads; end token "
                          f"{self.config.get('eos_token')!r} (the converted config's eos_token)")

    def tokens(self, ids: list[int]) -> list[str]:
        bad = [i for i in ids if not 0 <= i < len(self.vocab)]
        if bad:
            raise ValueError(f"prompt ids {bad[:5]} are outside the converted vocabulary ({len(self.vocab)})")
        return [self.vocab[i] for i in ids]

    def generate(self, prompt_ids: list[int], max_tokens: int, k: int) -> Generated:
        if self.options.get("prefill", "decode") == "once":
            r = self.generator.generate_batch([self.tokens(prompt_ids)], max_length=max_tokens, **GREEDY)[0]
            ids = [int(t) for t in r.sequences_ids[0]]
            rows = r.logits[0]
        else:  # CTranslate2's own default: the prompt decoded through the cache, one step at a time
            n = len(prompt_ids)
            r = self.generator.generate_batch([self.tokens(prompt_ids)], max_length=n + max_tokens - 1,
                                              **{**GREEDY, "include_prompt_in_result": True})[0]
            ids = [int(t) for t in r.sequences_ids[0][n:]]
            rows = r.logits[0][n - 1:n - 1 + len(ids)]
        logits = np.stack([np.asarray(x, np.float32).reshape(-1) for x in rows]) if ids else \
            np.zeros((0, len(self.vocab)), np.float32)
        eos = self.config.get("eos_token")
        finish = "stop" if ids and self.vocab[ids[-1]] == eos else "length"
        return Generated(ids, "", finish, logits=logits)

    def score(self, prompt_ids: list[int], continuation: list[int]) -> np.ndarray:
        """Constrained decoding: ``generate_batch`` with prompt + continuation as start tokens and
        ``include_prompt_in_result=True`` decodes them one step at a time, through the KV cache, and
        returns the logits of every step: row i predicts token i + 1. (``forward_batch``, one pass
        over the whole sequence, crashes on Gemma 3 past its sliding window: "buffer to copy is of
        size 1046 but current storage size is 64".)"""
        start = prompt_ids + continuation[:-1]
        r = self.generator.generate_batch([self.tokens(start)], max_length=len(start),
                                          **{**GREEDY, "include_prompt_in_result": True})[0]
        rows = np.stack([np.asarray(x, np.float32).reshape(-1) for x in r.logits[0]])
        first = len(prompt_ids) - 1
        if rows.shape[0] < first + len(continuation):
            raise ValueError(f"{rows.shape[0]} logit rows for a {len(start)}-token forced sequence")
        return rows[first:first + len(continuation)]


if __name__ == "__main__":
    main(CT2)
