"""vLLM: the pinned release (the oracle's engine, :mod:`.runner`, run by :mod:`.worker` in a child
process; :mod:`.serve` and :mod:`.pool`: one engine fed workload after workload), passes of requests
in one start (:mod:`.passes`, the sampler's :mod:`.sampler`), other releases in their own venvs
(:mod:`.release`, :mod:`.preload`, :mod:`.wheels`), and vLLM's OpenAI server (:mod:`.server`).
The worker and its helpers (:mod:`.full`, :mod:`.facts`) run under any release's interpreter:
standard library and vLLM only."""

from harness.engines.vllm import release, sampler, server  # noqa: F401 - they register
