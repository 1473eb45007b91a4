"""The llama.cpp draws' worker (:mod:`.llamacpp_worker`), run in the engine's own venv.

Each engine's sampler is an ability of its runner (:class:`~harness.abilities.Sampler`), beside the
runner in :mod:`harness.engines`: ``vllm`` (:mod:`harness.engines.vllm.sampler`), ``hf``
(:mod:`harness.engines.hf.sampler`), ``llamacpp`` (:mod:`harness.engines.llamacpp.sampler`, which
runs this worker), ``openai:<url>`` and ``vllm-server`` (:mod:`harness.engines.openai.sampler`).
"""
