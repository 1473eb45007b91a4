"""llama.cpp's server (llama-cpp-python), built on first use and started and stopped by the harness
(:mod:`.runner`), on a GGUF of the model; its sampler draws in the venv without a server
(:mod:`.sampler`)."""

from harness.engines.llamacpp import runner  # noqa: F401 - it registers
