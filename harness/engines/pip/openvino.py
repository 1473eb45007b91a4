"""``openvino``: OpenVINO GenAI on the oracle's weights, exported by optimum-intel.

``.venvs/openvino-genai-<version>/`` holds openvino-genai (with openvino and openvino-tokenizers)
and, for the export, optimum-intel with the oracle's own torch. optimum-intel 2.2.0 requires
transformers < 5.6, so the export runs with its own transformers (the record names it), and it is
installed without its declared dependencies: those also name torchvision, whose wheel would
replace the oracle's CPU torch with another build; a text model's export needs none of it.

Conversion: ``optimum-cli export openvino --task text-generation-with-past --weight-format fp32``,
once per model digest. Generation: greedy ``LLMPipeline`` on the CPU, the prompt as token ids, with
``INFERENCE_PRECISION_HINT=f32`` and ``KV_CACHE_PRECISION=f32`` (the CPU plugin's defaults are bf16
compute and a u8 KV cache on CPUs with AVX-512 BF16 or AMX: ``openvino:precision=default`` keeps
them). OpenVINO GenAI returns no top-k logprobs (at most the chosen token's), so the distribution
comparators and the greedy self-check are impossible there. See ``workers/openvino_worker.py``.
"""

from __future__ import annotations

from harness.engines.pip.runner import EngineSpec, register_pip_engine
from harness.engines.pip.venvs import PipEngine, oracle

VERSION = "2026.4.1.0"

SPEC = EngineSpec(
    key="openvino",
    title="OpenVINO GenAI",
    venv=PipEngine("openvino-genai", VERSION,
                   ("openvino==2026.4.1", "openvino-tokenizers==2026.4.1.0", "optimum==2.3.0",
                    "transformers>=4.51,<5.6", "huggingface-hub>=0.23.2,<1.22", "nncf==3.4.0", "setuptools",
                    "requests", oracle("torch"), "safetensors"),
                   "import importlib.metadata as m, openvino_genai; print(m.version('openvino-genai'))",
                   ("openvino", "openvino-tokenizers", "optimum-intel", "optimum", "transformers", "torch",
                    "nncf", "numpy"),
                   no_deps=("optimum-intel==2.2.0",)),
    worker="openvino_worker.py",
    conversion="optimum-cli export openvino --task text-generation-with-past --weight-format fp32",
    options={"precision": "f32 (default: INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION f32) or default "
                          "(the CPU plugin's own)"},
    scores=False,
    full_vocab=False,
    greedy_request={"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0, "min_new_tokens": 0, "device": "CPU"},
    top_logprobs="OpenVINO GenAI returns no top-k logprobs (GenerationConfig.logprobs: \"Currently only "
                 "single top logprob can be returned\", and LLMPipeline returns none per token)",
)


register_pip_engine(SPEC, help="OpenVINO GenAI on the model's weights, exported on first use "
                               "(openvino:precision=default keeps the CPU plugin's bf16/u8 defaults)")
