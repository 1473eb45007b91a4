"""``ortgenai``: ONNX Runtime GenAI on the oracle's weights, exported by the package's model builder.

``.venvs/onnxruntime-genai-<version>/`` holds onnxruntime-genai, onnxruntime, and for the builder
onnx, onnx-ir and the oracle's own torch, transformers, tokenizers and safetensors. Conversion:
``python -m onnxruntime_genai.models.builder -i <model> -o <dest> -p fp32 -e cpu``, once per model
digest. Generation: greedy ``og.Generator`` on the CPU provider, the prompt as token ids, the whole
vocabulary's logits read at every step; teacher forcing through the same decode path (one token
at a time). See ``workers/ortgenai_worker.py``.
"""

from __future__ import annotations

from harness.engines.pip.runner import EngineSpec, register_pip_engine
from harness.engines.pip.venvs import PipEngine, oracle

VERSION = "0.18.0"

SPEC = EngineSpec(
    key="ortgenai",
    title="ONNX Runtime GenAI",
    venv=PipEngine("onnxruntime-genai", VERSION,
                   ("onnxruntime==1.31.1", "onnx==1.23.2", "onnx-ir==1.1.0", oracle("torch"),
                    oracle("transformers"), oracle("numpy"), oracle("safetensors"), oracle("tokenizers"),
                    "tqdm"),
                   "import onnxruntime_genai as og; print(og.__version__)",
                   ("onnxruntime", "onnx", "onnx-ir", "torch", "transformers", "numpy")),
    worker="ortgenai_worker.py",
    conversion="onnxruntime_genai.models.builder -p fp32 -e cpu",
    greedy_request={"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0, "min_length": 0,
                    "top_k": 1, "provider": "cpu", "precision": "fp32"},
)


register_pip_engine(SPEC, help="ONNX Runtime GenAI on the model's weights, exported on first use")
