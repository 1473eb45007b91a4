"""The harness's own taps on a running vLLM engine for the RL gate: its weights as its kernels use
them, and the experts its routers choose. Run in the engine's worker process by ``collective_rpc``
(standard library only at import; torch is imported when a tap runs).

**Weights.** vLLM's per-tensor checksums (``compute_weight_checksums``, what the server's
``/weight_checker`` returns) hash each parameter's bytes. On a CPU, every unquantized linear layer
hands its weight to a packed GEMM (oneDNN, or the small-GEMM kernel for a router) and replaces the
parameter with an empty tensor (``dispatch_cpu_unquantized_gemm(remove_weight=True)``), so the
checksum of q/k/v, o, gate/up, down and a MoE router is the SHA-256 of zero bytes whatever the
weights are. :func:`weights` reads such a layer through the kernel itself: the layer applied to the
identity matrix gives ``W^T`` exactly (one product with 1.0, the rest with 0.0), so what is read is
what the engine computes with. Parameters that keep their bytes (embeddings, norms, the LM head, MoE
expert stacks) are read as they are.

**Routes.** :func:`install_routes` hooks each MoE block's router (``mlp.gate``); while armed, each
forward call's router logits are kept, and :func:`take_routes` writes the top-k expert ids per
token and layer (the same rule as the model's own ``topk`` on softmax of the logits).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""What vLLM's checksum of an emptied parameter is: ``e3b0c442...b855``."""


def vllm_checksums(worker: Any) -> dict[str, str] | None:
    """vLLM's own per-tensor checksums (what the server's ``/weight_checker`` returns), or None where
    the release has none (``compute_weight_checksums`` came with 0.32.0)."""
    compute = getattr(worker, "compute_weight_checksums", None)
    return None if compute is None else compute()


def _model(worker: Any) -> Any:
    return worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model


def weights(worker: Any, path: str) -> dict[str, str]:
    """Every parameter of the engine's model into ``path`` (safetensors, float32, vLLM's names):
    the kernel's weight for a linear layer whose parameter was emptied, the parameter otherwise.
    Returns name -> how it was read (``kernel`` or ``param``)."""
    import torch
    from safetensors.torch import save_file

    model = _model(worker)
    out: dict[str, Any] = {}
    how: dict[str, str] = {}
    with torch.inference_mode():
        for name, p in model.named_parameters():
            owner, _, leaf = name.rpartition(".")
            mod = model.get_submodule(owner) if owner else model
            if leaf == "weight" and p.numel() == 0 and hasattr(mod, "cpu_linear"):
                k = int(getattr(mod, "input_size_per_partition", 0) or getattr(mod, "input_size", 0))
                dtype = getattr(mod, "params_dtype", p.dtype)
                eye = torch.eye(k, dtype=dtype)
                w = mod.cpu_linear(eye, p, None).t()
                how[name] = "kernel"
            else:
                w = p
                how[name] = "param"
            out[name] = w.detach().float().contiguous().clone()
    tmp = path + ".tmp"
    save_file(out, tmp)
    os.replace(tmp, path)
    return how


def install_routes(worker: Any, top_k: int) -> list[int]:
    """Hook every MoE block's router (``top_k``: experts per token, the config's
    ``num_experts_per_tok``); the layer indices hooked (empty: no MoE block)."""
    model = _model(worker)
    state: dict[str, Any] = {"armed": False, "rows": {}}
    worker.harness_routes = state
    layers = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if gate is None or experts is None:
            continue

        def hook(module: Any, args: tuple, output: Any, i: int = i, k: int = top_k) -> None:
            if state["armed"]:
                logits = output[0] if isinstance(output, tuple) else output
                state["rows"].setdefault(i, []).append((logits.detach().float().clone(), k))

        gate.register_forward_hook(hook)
        layers.append(i)
    return layers


def arm_routes(worker: Any) -> None:
    worker.harness_routes["armed"] = True
    worker.harness_routes["rows"] = {}


def take_routes(worker: Any) -> dict[str, Any]:
    """Disarm; per hooked layer, the top-k expert ids of every token fed since arming (forward calls
    joined in order) and the router's logits."""
    import torch

    st = worker.harness_routes
    st["armed"] = False
    out: dict[str, Any] = {}
    for i, parts in sorted(st["rows"].items()):
        logits = torch.cat([p for p, _ in parts])
        k = parts[0][1]
        top = torch.topk(logits.softmax(dim=-1), k, dim=-1).indices
        out[str(i)] = {"experts": top.sort(dim=-1).values.tolist(), "logits": logits.tolist()}
    st["rows"] = {}
    return out
