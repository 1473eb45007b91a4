"""ONNX Runtime GenAI worker (runs in ``.venvs/onnxruntime-genai-<version>/``; protocol:
``worker_protocol.py``).

Conversion: the package's own model builder, ``python -m onnxruntime_genai.models.builder -i
<model folder> -o <dest> -p fp32 -e cpu``: an fp32 ONNX graph of the oracle's weights plus
``genai_config.json``. Architectures the builder does not know are refused with its words.

Generation: ``og.Generator`` one case at a time on the CPU provider, ``do_sample=False``
(greedy), ``num_beams=1``, ``repetition_penalty=1``, ``min_length=0`` and ``max_length`` = prompt +
``max_tokens``, set explicitly over ``genai_config.json``'s ``search`` defaults (the record names
what those were). The prompt goes in as the oracle's ids (``append_tokens``); before each
``generate_next_token`` the step's logits (``get_logits``: the whole vocabulary) are kept, so each
row is the distribution the token was chosen from. Teacher forcing goes through the same decode
path: the prompt appended, then the given continuation one token at a time, the logits read before
each.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from worker_protocol import Engine, Generated, Refused, main


class OrtGenAI(Engine):
    @staticmethod
    def convert(source: str, dest: str, options: dict[str, Any]) -> dict[str, Any]:
        import subprocess
        import sys

        import onnxruntime
        import onnxruntime_genai as og
        import transformers

        precision = options.get("precision", "fp32")
        cache = os.path.join(dest, ".builder-cache")
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", source, "-o", dest,
               "-p", precision, "-e", "cpu", "-c", cache]
        res = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(res.stdout[-20000:] + res.stderr[-20000:])
        if res.returncode != 0:
            text = (res.stderr or res.stdout).strip().splitlines()
            last = next((x for x in reversed(text) if "Error" in x or "error" in x), text[-1] if text else "")
            last = last.replace(source, os.path.basename(source.rstrip("/")))
            if "is not currently supported" in last or "NotImplementedError" in last:
                raise Refused(f"the onnxruntime-genai {og.__version__} model builder: {last.strip()}")
            raise RuntimeError(f"the model builder exited with {res.returncode}: {last.strip()}")
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
        with open(os.path.join(dest, "genai_config.json")) as fh:
            search = json.load(fh).get("search", {})
        return {"converter": f"onnxruntime_genai.models.builder (onnxruntime-genai {og.__version__}, "
                             f"onnxruntime {onnxruntime.__version__}, "
                             f"transformers {transformers.__version__})",
                "command": " ".join(["python", *cmd[1:3], "-i", "<model>", "-o", "<dest>", *cmd[7:11]]),
                "precision": precision, "genai_search_defaults": search}

    def version(self) -> str:
        import onnxruntime_genai as og

        return og.__version__

    def start(self) -> None:
        import onnxruntime_genai as og

        path = self.req["model"]
        config = og.Config(path)
        config.clear_providers()  # the CPU provider
        self.model = og.Model(config)
        with open(os.path.join(path, "genai_config.json")) as fh:
            cfg = json.load(fh)
        self.defaults = cfg.get("search", {})
        eos = cfg.get("model", {}).get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.vocab = int(cfg.get("model", {}).get("vocab_size", 0))
        moved = {k: v for k, v in self.defaults.items() if k in GREEDY and GREEDY[k] != v}
        if moved:
            self.notes.append("genai_config.json search defaults overridden for greedy decoding: "
                              + ", ".join(f"{k} {v!r} -> {GREEDY[k]!r}" for k, v in sorted(moved.items())))

    def _generator(self, max_length: int) -> Any:
        import onnxruntime_genai as og

        params = og.GeneratorParams(self.model)
        params.set_search_options(**GREEDY, max_length=max_length)
        return og.Generator(self.model, params)

    @staticmethod
    def _row(gen: Any) -> np.ndarray:
        return np.asarray(gen.get_logits(), np.float32).reshape(-1)

    def generate(self, prompt_ids: list[int], max_tokens: int, k: int) -> Generated:
        gen = self._generator(len(prompt_ids) + max_tokens)
        gen.append_tokens(np.asarray([prompt_ids], np.int32))
        ids: list[int] = []
        rows = []
        while not gen.is_done() and len(ids) < max_tokens:
            rows.append(self._row(gen))
            gen.generate_next_token()
            ids.append(int(gen.get_next_tokens()[0]))
        finish = "stop" if ids and ids[-1] in self.eos else "length"
        logits = np.stack(rows) if rows else np.zeros((0, self.vocab), np.float32)
        return Generated(ids, "", finish, logits=logits)

    def score(self, prompt_ids: list[int], continuation: list[int]) -> np.ndarray:
        gen = self._generator(len(prompt_ids) + len(continuation) + 1)
        gen.append_tokens(np.asarray([prompt_ids], np.int32))
        rows = []
        for t, tok in enumerate(continuation):
            rows.append(self._row(gen))
            if t + 1 < len(continuation):
                gen.append_tokens(np.asarray([[tok]], np.int32))
        return np.stack(rows)


GREEDY = {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0, "min_length": 0,
          "temperature": 1.0, "top_k": 1, "top_p": 1.0}
"""Every search option that could change a greedy decode (see module doc)."""


if __name__ == "__main__":
    main(OrtGenAI)
