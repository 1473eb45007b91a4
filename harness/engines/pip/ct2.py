"""``ct2``: CTranslate2 on the oracle's weights, converted by CTranslate2's transformers converter.

``.venvs/ctranslate2-<version>/`` holds ctranslate2 and, for its converter, the oracle's own torch,
transformers, tokenizers and safetensors (so the converter reads the checkpoint as the ``hf``
candidate does). Conversion: ``TransformersConverter(folder).convert(quantization="float32")``, once
per model digest. Generation: greedy ``generate_batch`` (the prompt decoded step by step, its
default) with every option that could change a greedy decode set to its neutral value, the whole
vocabulary's logits at every position, the end token kept; teacher forcing by constrained decoding
of prompt + continuation (``forward_batch`` crashes on Gemma 3 past its sliding window). See
``workers/ct2_worker.py``.

``ct2:prefill=once`` forwards the prompt in one pass instead (``include_prompt_in_result=False``,
faster): on Gemma 3 with a prompt longer than the sliding window its logits are not the step-by-step
decode's, which are vLLM's (tiny-gemma3 smoke c06, 84 tokens, window 64: top-1 ``um`` -1.99
against vLLM's ``ness`` -2.02, which the step-by-step decode gives).

The worker runs with ``OMP_WAIT_POLICY=PASSIVE``: CTranslate2's OpenMP threads spin while they wait
for each other by default, and on a machine whose cores other jobs share, 2 intra-op threads took
2.5 s for 64 tiny-llama tokens that 1 thread made in 0.04 s (passive: 0.025 s). Time only; the
numbers are the same.
"""

from __future__ import annotations

from harness.engines.pip.runner import EngineSpec, register_pip_engine
from harness.engines.pip.venvs import PipEngine, oracle

VERSION = "4.8.5"

SPEC = EngineSpec(
    key="ct2",
    title="CTranslate2",
    venv=PipEngine("ctranslate2", VERSION,
                   (oracle("torch"), oracle("transformers"), oracle("numpy"), oracle("safetensors"),
                    oracle("tokenizers")),
                   "import ctranslate2; print(ctranslate2.__version__)", ("torch", "transformers", "numpy")),
    worker="ct2_worker.py",
    conversion="ctranslate2.converters.TransformersConverter, quantization float32",
    options={"threads": "intra-op threads (default: every core)",
             "prefill": "decode (default: the prompt decoded step by step, CTranslate2's default) or once "
                        "(include_prompt_in_result=False: one pass, wrong past Gemma 3's sliding window)"},
    greedy_request={"include_prompt_in_result": True, "beam_size": 1, "sampling_topk": 1,
                    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                    "min_length": 0, "return_end_token": True, "compute_type": "float32"},
    env={"OMP_WAIT_POLICY": "PASSIVE"},
)


register_pip_engine(SPEC, help="CTranslate2 on the model's weights, converted on first use (ct2:threads=2)")
