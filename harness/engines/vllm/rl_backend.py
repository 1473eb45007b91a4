"""A CPU weight-transfer backend for vLLM's RL path: the trainer's tensors in a safetensors file.

vLLM's RL API (``LLM.init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``) hands each update to a backend from
``vllm.distributed.weight_transfer.factory.WeightTransferEngineFactory``. The shipped backends move
tensors by CUDA IPC handles (``ipc``), NCCL broadcasts (``nccl``, ``sparse_nccl``, ``nccl_m2n``) or
NIXL/RDT (``sharded_rdt``): none of them runs on a CPU (``ipc`` starts and answers the handshake, then
its ``receive_weights`` calls ``torch.cuda.get_device_properties``). This backend, registered at run
time under :data:`BACKEND` through the same factory, carries the bytes in a file the trainer wrote
(a folder on ``/dev/shm`` where there is one: shared memory) and lets vLLM do everything else
exactly as it does for ``ipc``: ``start_weight_update`` puts every layer back into checkpoint layout
(``initialize_layerwise_reload``), ``update_weights`` feeds the tensors to the model's own
``load_weights`` (checkpoint names: vLLM fuses q/k/v and gate/up itself), and
``finish_weight_update`` re-runs each layer's post-load processing (the CPU GEMM re-packs its
weights) via ``finalize_layerwise_reload``.

Update info: ``{"path": FILE, "names": [...]}``, the names to load from the file (all of them when
absent). Standard library only at import; vLLM and torch are imported by :func:`register`, which the
RL worker calls before the engine starts (the engine-core process is forked from it, so the factory
entry is inherited there).
"""

from __future__ import annotations

from typing import Any

BACKEND = "harness_files"
"""The name this backend is registered under (``weight_transfer_config={"backend": ...}``)."""


def register() -> str:
    """Register the backend with vLLM's factory (once per process); returns its name."""
    from dataclasses import dataclass, field

    import torch
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND in WeightTransferEngineFactory._registry:
        return BACKEND

    @dataclass
    class FilesInitInfo(WeightTransferInitInfo):
        folder: str = ""

    @dataclass
    class FilesUpdateInfo(WeightTransferUpdateInfo):
        path: str = ""
        names: list[str] | None = field(default=None)

    class FilesWeightTransferEngine(WeightTransferEngine[FilesInitInfo, FilesUpdateInfo]):
        init_info_cls = FilesInitInfo
        update_info_cls = FilesUpdateInfo

        def init_transfer_engine(self, init_info: FilesInitInfo) -> None:
            self.folder = init_info.folder
            self.received: list[dict[str, Any]] = []

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            self.received = []
            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def receive_weights(self, update_info: FilesUpdateInfo) -> None:
            from safetensors import safe_open

            weights = []
            with safe_open(update_info.path, framework="pt", device="cpu") as f:
                names = list(f.keys()) if update_info.names is None else list(update_info.names)
                for name in names:
                    weights.append((name, f.get_tensor(name)))
            self.received.append(
                {
                    "path": update_info.path,
                    "names": names,
                    "bytes": int(sum(t.numel() * t.element_size() for _, t in weights)),
                }
            )
            self.model.load_weights(weights)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # no device to synchronize

        def shutdown(self) -> None:
            self.received = []

    del torch
    WeightTransferEngineFactory.register_engine(BACKEND, FilesWeightTransferEngine)
    return BACKEND


def received(worker: Any) -> list[dict[str, Any]]:
    """What the worker's backend loaded during the last update (run in the engine's worker process by
    ``collective_rpc``): one entry per ``update_weights`` call."""
    engine = getattr(worker, "weight_transfer_engine", None)
    return list(getattr(engine, "received", []))
