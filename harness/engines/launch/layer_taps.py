"""Taps on a decoder's residual stream: after each layer's attention and MLP (or MoE) sub-block, the
final norm. One implementation for every engine that runs a PyTorch module tree: transformers in the
harness process, vLLM inside its worker process (any release: standard library only at import,
torch is imported when a tap is installed).

Names are the same in every engine::

    layer.<i>.attn    the residual stream after layer i's attention sub-block (its residual added)
    layer.<i>.mlp     ... after its MLP sub-block (``layer.<i>.moe`` where that block is a mixture of
                      experts): the layer's output
    final_norm        the final norm's output (what the LM head reads)
    logits            (added by the engine: transformers' own logits, vLLM's ``compute_logits``)

each ``[positions, hidden]`` float32, one row per token of the sequence fed.

How the stream is read, the same rule for both engines:

* after attention: the input of the norm in front of the MLP, or, where that norm fuses the
  residual add (vLLM's ``RMSNorm(x, residual)`` returns ``(normed, x + residual)``), its residual
  output: the sum the engine itself made;
* after the MLP: the layer's output, or, where a layer returns ``(hidden, residual)`` (vLLM's
  decoders leave the last add to the next layer's fused norm), ``hidden + residual``;
* the final norm: its output (the first of a fused norm's pair).

:data:`FAMILIES` maps a config's ``model_type`` to where these modules are; a model type it does
not hold cannot be localized, and :func:`family_of` says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

TAPS_VERSION = 1
"""Bumped whenever what a tap reads changes: cached oracle tensors are keyed by it."""


@dataclass(frozen=True, slots=True)
class Family:
    """Where one architecture family keeps its sub-blocks, relative to the causal-LM module (the
    same names in transformers and vLLM)."""

    layers: str
    """Dotted path of the decoder layer list."""
    pre_mlp_norm: str
    """The norm in front of the MLP inside a layer: its input (or fused residual output) is the
    stream after attention."""
    final_norm: str
    mlp: str = "mlp"
    """The MLP / MoE sub-block inside a layer; a class name containing ``moe`` names it ``moe``."""


_LLAMA = Family("model.layers", "post_attention_layernorm", "model.norm")

FAMILIES: dict[str, Family] = {
    "llama": _LLAMA,
    "qwen3": _LLAMA,
    "qwen3_moe": _LLAMA,
    # Gemma 3 norms the attention output (post_attention_layernorm) before the residual add and
    # the MLP input after it (pre_feedforward_layernorm)
    "gemma3_text": Family("model.layers", "pre_feedforward_layernorm", "model.norm"),
    "gpt2": Family("transformer.h", "ln_2", "transformer.ln_f"),
}
"""``model_type`` -> sub-block paths, for the families whose definitions were checked against both
transformers' and vLLM's model code (an unperturbed model gives NMSE ~1e-12 on every tensor)."""


def family_of(model_type: str | None) -> Family | str:
    """The family of a ``config.json``'s ``model_type``, or why it cannot be tapped."""
    fam = FAMILIES.get(model_type or "")
    if fam is None:
        return (f"model_type {model_type!r} is not in the sub-block table "
                f"(harness/engines/launch/layer_taps.py FAMILIES: {', '.join(sorted(FAMILIES))})")
    return fam


def family_at(folder: str) -> Family | str:
    """The family of the checkpoint in ``folder`` (its ``config.json``), or why it cannot be tapped."""
    try:
        with open(os.path.join(folder, "config.json")) as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as e:
        return f"cannot read {folder}/config.json: {e}"
    inner = cfg.get("text_config")
    return family_of((inner if isinstance(inner, dict) else cfg).get("model_type"))


def tensor_names(num_layers: int, moe_layers: set[int] | frozenset[int] = frozenset()) -> list[str]:
    """Every tensor name in model order, ``logits`` last."""
    names = []
    for i in range(num_layers):
        names += [f"layer.{i}.attn", f"layer.{i}.{'moe' if i in moe_layers else 'mlp'}"]
    return [*names, "final_norm", "logits"]


def _resolve(root: Any, path: str) -> Any:
    obj = root
    for part in path.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{type(root).__name__} has no {path!r} (stopped at {part!r} of "
                                 f"{type(obj).__name__})")
        obj = getattr(obj, part)
    return obj


def _rows(t: Any) -> Any:
    """``[..., hidden]`` -> float32 ``[tokens, hidden]`` on the CPU, a copy."""
    return t.detach().reshape(-1, t.shape[-1]).float().cpu().clone()


class LayerTaps:
    """Forward hooks on one model's sub-blocks. Rows accumulate over every forward call while armed
    (a whole-sequence prefill: one call; stepwise decoding: one call per token), in call order."""

    def __init__(self, model: Any, family: Family) -> None:
        self.family = family
        self.rows: dict[str, list[Any]] = {}
        self.final: list[Any] = []
        self.armed = False
        self.calls = 0
        self.handles: list[Any] = []
        layers = list(_resolve(model, family.layers))
        self.moe_layers = set()
        for i, layer in enumerate(layers):
            norm, block = _resolve(layer, family.pre_mlp_norm), _resolve(layer, family.mlp)
            sub = "moe" if "moe" in type(block).__name__.lower() else "mlp"
            if sub == "moe":
                self.moe_layers.add(i)
            self.handles.append(norm.register_forward_hook(self._after_attention(f"layer.{i}.attn")))
            self.handles.append(layer.register_forward_hook(self._after_mlp(f"layer.{i}.{sub}")))
        final = _resolve(model, family.final_norm)
        self.handles.append(final.register_forward_hook(self._final))
        self.num_layers = len(layers)

    def names(self) -> list[str]:
        return tensor_names(self.num_layers, self.moe_layers)

    def _keep(self, name: str, t: Any) -> None:
        if self.armed:
            self.rows.setdefault(name, []).append(_rows(t))

    def _after_attention(self, name: str) -> Any:
        def hook(module: Any, args: tuple, output: Any) -> None:
            fused = isinstance(output, tuple) and len(output) == 2
            self._keep(name, output[1] if fused else args[0])
        return hook

    def _after_mlp(self, name: str) -> Any:
        def hook(module: Any, args: tuple, output: Any) -> None:
            if isinstance(output, tuple):
                first, second = output[0], output[1] if len(output) > 1 else None
                fused = second is not None and hasattr(second, "shape") and second.shape == first.shape
                self._keep(name, first + second if fused else first)
            else:
                self._keep(name, output)
        return hook

    def _final(self, module: Any, args: tuple, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        if self.armed:
            self.calls += 1
            self.final.append(out.detach().reshape(-1, out.shape[-1]).clone())
        self._keep("final_norm", out)

    def arm(self) -> None:
        self.rows, self.final, self.calls, self.armed = {}, [], 0, True

    def final_hidden(self) -> Any:
        """The final norm's rows as the engine computed them (its dtype and device): what an engine
        that computes logits only where it samples turns into logits for every row."""
        import torch

        return torch.cat(self.final)

    def take(self) -> dict[str, Any]:
        """Disarm; every tapped tensor as one ``[tokens, hidden]`` float32 tensor (calls joined)."""
        import torch

        self.armed = False
        out = {name: torch.cat(parts) for name, parts in self.rows.items()}
        self.rows = {}
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


# ---------------------------------------------------------------------------------------------
# vLLM: the model runs in the engine's worker process; these run there, sent by ``collective_rpc``
# from :mod:`harness.engines.vllm.worker` (pickled by reference: the worker process inherits the
# folder of this file on its path).


def _vllm_model(worker: Any) -> Any:
    return worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model


def vllm_install(worker: Any, model_type: str) -> list[str]:
    """Tap the worker's model; the tensor names it will give (raises when the family is unknown or
    its modules are not where :data:`FAMILIES` says)."""
    fam = family_of(model_type)
    if isinstance(fam, str):
        raise LookupError(fam)
    worker.harness_layer_taps = LayerTaps(_vllm_model(worker), fam)
    return worker.harness_layer_taps.names()


def vllm_arm(worker: Any) -> None:
    worker.harness_layer_taps.arm()


def vllm_take(worker: Any, path: str) -> dict[str, Any]:
    """Disarm, add vLLM's own logits of every row (``compute_logits`` on the final norm's rows),
    write every tensor into ``path`` (``.npz``, float32, written aside and renamed); returns the
    rows and forward calls seen."""
    import inspect

    import numpy as np
    import torch

    taps = worker.harness_layer_taps
    model = _vllm_model(worker)
    final, calls = taps.final_hidden(), taps.calls
    tensors = taps.take()
    with torch.inference_mode():
        if len(inspect.signature(model.compute_logits).parameters) > 1:  # older: (hidden, metadata)
            logits = model.compute_logits(final, None)
        else:
            logits = model.compute_logits(final)
    tensors["logits"] = _rows(logits)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **{k: v.numpy() for k, v in tensors.items()})
    os.replace(tmp, path)
    return {"rows": int(final.shape[0]), "calls": calls, "names": list(tensors)}
