"""vllm.cpp, built from the user's source on first use (:mod:`.build`): the harness's worker
(``vllmcpp_worker.cpp``) driving the library (:mod:`.runner`), and vllm.cpp's own OpenAI server
(:mod:`.server`)."""

from harness.engines.vllmcpp import runner, server  # noqa: F401 - they register
