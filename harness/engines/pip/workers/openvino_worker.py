"""OpenVINO GenAI worker (runs in ``.venvs/openvino-genai-<version>/``; protocol: ``worker_protocol.py``).

Conversion: optimum-intel's OpenVINO export (``optimum-cli export openvino --task
text-generation-with-past --weight-format fp32``): the oracle's float32 weights, uncompressed (the
export compresses weights to int8 by default for models over a billion parameters; ``fp32`` says
no), plus the tokenizer as OpenVINO models (``openvino_tokenizers``), which ``LLMPipeline`` loads
even when it is given token ids.

Generation: ``openvino_genai.LLMPipeline`` on ``CPU``, the prompt as the oracle's token ids (an
``ov.Tensor``), ``do_sample=False``, ``num_beams=1``, ``repetition_penalty=1``, no presence or
frequency penalty, ``min_new_tokens=0``. The CPU plugin's own defaults are *not* float32 on every
CPU: ``INFERENCE_PRECISION_HINT`` is bf16 where the CPU has AVX-512 BF16 or AMX, and the KV cache
is compressed (``KV_CACHE_PRECISION`` u8). The worker sets both to f32 (``precision=f32``, the
default) so only the engines differ, and records what the plugin's defaults were;
``precision=default`` leaves them to the plugin, to measure what they cost.

Logprobs: OpenVINO GenAI returns at most the chosen token's logprob (``GenerationConfig.logprobs``:
"Currently only single top logprob can be returned"), and only through the continuous-batching
outputs; no top-k, no scoring of given sequences. The record states it; the distribution
comparators are impossible there.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from worker_protocol import Engine, Generated, Refused, main

F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
"""The CPU plugin properties that make it compute in float32 (see module doc)."""

REFUSALS = ("not supported", "Unrecognized", "does not allow for the export")
"""Export errors that mean "this architecture (with these versions) is not exported", not a crash;
e.g. optimum-intel's Gemma 3 export config caps transformers at 5.0."""

GREEDY = {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0, "presence_penalty": 0.0,
          "frequency_penalty": 0.0, "min_new_tokens": 0, "ignore_eos": False}
"""Every generation option that could change a greedy decode, set explicitly."""


class OpenVINO(Engine):
    @staticmethod
    def convert(source: str, dest: str, options: dict[str, Any]) -> dict[str, Any]:
        import importlib.metadata as md
        import subprocess
        import sys

        with open(os.path.join(source, "config.json")) as fh:
            arch = ", ".join(json.load(fh).get("architectures", []))
        weights = options.get("weights", "fp32")
        cli = os.path.join(os.path.dirname(sys.executable), "optimum-cli")
        cmd = [cli, "export", "openvino", "--model", source, "--task", "text-generation-with-past",
               "--weight-format", weights, dest]
        res = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(res.stdout[-20000:] + res.stderr[-20000:])
        if res.returncode != 0:
            lines = (res.stderr or res.stdout).strip().splitlines()
            last = next((x for x in reversed(lines) if "Error" in x), lines[-1] if lines else "")
            if any(k in last for k in REFUSALS):
                raise Refused(f"optimum-intel's OpenVINO export cannot export {arch}: {last.strip()}")
            raise RuntimeError(f"optimum-cli export openvino exited with {res.returncode}: {last.strip()}")
        versions = ", ".join(f"{n} {md.version(n)}" for n in ("optimum-intel", "optimum", "openvino",
                                                                  "transformers", "torch"))
        return {"converter": f"optimum-cli export openvino ({versions})",
                "command": "optimum-cli export openvino --model <model> --task text-generation-with-past "
                           f"--weight-format {weights} <dest>",
                "weight_format": weights,
                "files": sorted(os.listdir(dest))}

    def version(self) -> str:
        import openvino_genai

        return openvino_genai.__version__.split("-")[0]

    def start(self) -> None:
        import openvino as ov
        import openvino_genai

        path = self.req["model"]
        precision = self.options.get("precision", "f32")
        if precision not in ("f32", "default"):
            raise Refused(f"precision={precision!r}: f32 (the default) or default (the CPU plugin's own)")
        core = ov.Core()
        defaults = {k: _name(core.get_property("CPU", k)) for k in F32}
        self.notes.append("the CPU plugin's own defaults here: "
                          + ", ".join(f"{k} {v}" for k, v in defaults.items()))
        props = dict(F32) if precision == "f32" else {}
        if props:
            self.notes.append("set for this run: " + ", ".join(f"{k} {v}" for k, v in props.items()))
        self.pipe = openvino_genai.LLMPipeline(path, "CPU", **props)
        self.ov = ov
        with open(os.path.join(path, "config.json")) as fh:
            cfg = json.load(fh)
        eos = cfg.get("eos_token_id")
        gen_path = os.path.join(path, "generation_config.json")
        if os.path.exists(gen_path):
            with open(gen_path) as fh:
                eos = json.load(fh).get("eos_token_id", eos)
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}

    def generate(self, prompt_ids: list[int], max_tokens: int, k: int) -> Generated:
        import openvino_genai

        config = openvino_genai.GenerationConfig()
        for key, value in GREEDY.items():
            setattr(config, key, value)
        config.max_new_tokens = max_tokens
        if self.eos:
            config.eos_token_id = min(self.eos)
            config.stop_token_ids = set(self.eos)
        ids_in = self.ov.Tensor(np.asarray([prompt_ids], np.int64))
        res = self.pipe.generate(ids_in, config)
        ids = [int(t) for t in res.tokens[0]]
        finish = "stop" if ids and ids[-1] in self.eos else "length"
        return Generated(ids, "", finish)


def _name(value: Any) -> str:
    """An OpenVINO element type as its name (``bf16``), anything else as text."""
    get = getattr(value, "get_type_name", None)
    return str(get()) if callable(get) else str(value)


if __name__ == "__main__":
    main(OpenVINO)
