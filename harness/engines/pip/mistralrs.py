"""``mistralrs``: mistral.rs on the model's own safetensors (no conversion).

``.venvs/mistralrs-<version>/`` holds the ``mistralrs`` wheel (a Rust engine with Python bindings;
no torch) and numpy for the worker. The worker loads the model folder with ``ModelDType.F32`` and
an f32 KV cache (mistral.rs's CPU default is f16: ``mistralrs:kv=f16`` keeps it). Its Python API
takes text prompts only: the worker sends each case's text (mistral.rs's own detokenization of the
oracle's ids) and reports what mistral.rs tokenizes it into, which the tokenizer verdict judges.
Top-k logprobs come back with token ids; greedy with every sampling field set explicitly. See
``workers/mistralrs_worker.py``.
"""

from __future__ import annotations

from harness.engines.pip.runner import EngineSpec, register_pip_engine
from harness.engines.pip.venvs import PipEngine, oracle

VERSION = "0.9.5"

SPEC = EngineSpec(
    key="mistralrs",
    title="mistral.rs",
    venv=PipEngine("mistralrs", VERSION, (oracle("numpy"),),
                   "import importlib.metadata as m, mistralrs; print(m.version('mistralrs'))", ("numpy",)),
    worker="mistralrs_worker.py",
    conversion=None,
    options={"kv": "f32 (default: MISTRALRS_CPU_KV_F32=1) or f16 (mistral.rs's own CPU default)"},
    scores=False,
    full_vocab=False,
    prompts="text",
    tokenized_by="mistralrs Runner.tokenize_text(text, add_special_tokens=True)",
    greedy_request={"temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0, "dtype": "f32",
                    "messages": "the prompt text as one message, rendered verbatim"},
)


register_pip_engine(SPEC, help="mistral.rs on the model's safetensors (text prompts; top-k logprobs)")
