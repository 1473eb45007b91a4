"""Hugging Face transformers in the harness's own process (:mod:`.runner`): its step-by-step decode
(:mod:`.decode`) and its sampler (:mod:`.sampler`)."""

from harness.engines.hf import runner  # noqa: F401 - it registers
