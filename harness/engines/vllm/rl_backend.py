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
weights) via ``finalize_layerwise_reload`` — all but the two cases in :data:`REPACKS`.

Update info: ``{"path": FILE, "names": [...]}``, the names to load from the file (all of them when
absent). Init info ``{"repack": true}`` turns on :data:`REPACKS` after each update (off by default:
the gate judges vLLM's own path). Standard library only at import; vLLM and torch are imported by
:func:`register`, which the RL worker calls when imported (the engine-core process is spawned and
imports the worker again, so the factory entry is there too).
"""

from __future__ import annotations

from typing import Any

BACKEND = "harness_files"
"""The name this backend is registered under (``weight_transfer_config={"backend": ...}``)."""

REPACKS = ("moe_experts", "tied_lm_head")
"""What vLLM 0.32.0's layerwise reload leaves undone on a CPU, which ``repack`` redoes after
``finalize_layerwise_reload`` (a repair beside vLLM's path, never on it unless asked):

* ``moe_experts``: ``UnquantizedFusedMoEMethod._setup_kernel`` calls the experts'
  ``process_weights_after_loading`` (the CPU kernel's ``cpu_prepack_moe_weight``) on the first load
  only (``if not is_weight_update``), so an update leaves checkpoint-layout values in storage the CPU
  kernel reads as prepacked;
* ``tied_lm_head``: a tied ``ParallelLMHead`` receives no tensor of its own, so the reload puts its
  old kernel tensors back ("Failed to load weights") without re-running
  ``dispatch_cpu_unquantized_gemm``, and its GEMM keeps the packed copy of the old embedding."""


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
        repack: bool = False

    @dataclass
    class FilesUpdateInfo(WeightTransferUpdateInfo):
        path: str = ""
        names: list[str] | None = field(default=None)

    class FilesWeightTransferEngine(WeightTransferEngine[FilesInitInfo, FilesUpdateInfo]):
        init_info_cls = FilesInitInfo
        update_info_cls = FilesUpdateInfo

        def init_transfer_engine(self, init_info: FilesInitInfo) -> None:
            self.folder = init_info.folder
            self.repack = bool(init_info.repack)
            self.received: list[dict[str, Any]] = []
            self.repacked: list[str] = []

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            self.received = []
            self.repacked = []
            self.before = packed_experts(self.model) if self.repack else {}
            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)
            if self.repack:
                self.repacked = repack_cpu(self.model, self.before)

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


def _experts(module: Any) -> Any:
    method = getattr(module, "quant_method", None)
    experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
    return experts if experts is not None and hasattr(module, "w13_weight") else None


def packed_experts(model: Any) -> dict[str, tuple[Any, Any]]:
    """Each MoE layer's expert stacks as they are before an update (their prepacked layout)."""
    return {
        name: (m.w13_weight.detach().clone(), m.w2_weight.detach().clone())
        for name, m in model.named_modules()
        if _experts(m) is not None
    }


def repack_cpu(model: Any, before: dict[str, tuple[Any, Any]], on_cpu: bool | None = None) -> list[str]:
    """Redo what the reload skipped on a CPU (:data:`REPACKS`) from the values now in each layer's
    parameters; returns ``"<kind>:<module>"`` per layer redone (none off a CPU). A MoE layer is
    repacked only where the update changed its stacks (one the update left alone still holds its
    prepacked values, ``before``: packing them again would scramble them)."""
    import torch

    if on_cpu is None:
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
    if not on_cpu:
        return []
    done = []
    with torch.no_grad():
        for name, module in model.named_modules():
            experts = _experts(module)
            method = getattr(module, "quant_method", None)
            if experts is not None:
                w13, w2 = before.get(name, (None, None))
                same = w13 is not None and torch.equal(w13, module.w13_weight)
                if same and torch.equal(w2, module.w2_weight):
                    continue  # the update left this layer alone: already packed
                experts.process_weights_after_loading(module)
                done.append(f"moe_experts:{name}")
            elif type(module).__name__ == "ParallelLMHead" and method is not None and _tied(model, module):
                method.process_weights_after_loading(module)
                done.append(f"tied_lm_head:{name}")
    return done


def _tied(model: Any, head: Any) -> bool:
    ptr = head.weight.data_ptr()
    return any(m is not head and getattr(m, "weight", None) is not None and m.weight.data_ptr() == ptr
               for m in model.modules() if type(m).__name__ == "VocabParallelEmbedding")


def repacked(worker: Any) -> list[str]:
    """What the last update's repair redid (see :func:`repack_cpu`), run in the worker by
    ``collective_rpc``."""
    return list(getattr(getattr(worker, "weight_transfer_engine", None), "repacked", []))


def received(worker: Any) -> list[dict[str, Any]]:
    """What the worker's backend loaded during the last update (run in the engine's worker process by
    ``collective_rpc``): one entry per ``update_weights`` call."""
    engine = getattr(worker, "weight_transfer_engine", None)
    return list(getattr(engine, "received", []))
