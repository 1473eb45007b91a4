"""The trainer side of the RL gate: the policy's weights step by step, and its scores of the rollouts.

The weights are held in checkpoint names (float32 masters), moved by :mod:`harness.kinds.rl.updates`
and written per step as a checkpoint folder (``config.json`` + ``model.safetensors`` in the lane's
dtype): the same file is what the engine loads through vLLM's RL path and what the trainer scores
with, so the two sides start from the same bytes.

A trainer is any callable ``trainer(folder, sequences, dtype) -> list[logits]``: ``folder`` a checkpoint
folder, ``sequences`` a list of (prompt ids, sampled ids), ``dtype`` the declared one (``float32`` or
``bfloat16``); it returns, per sequence, the float32 logits ``[len(sampled), vocab]`` that predicted
each sampled token. The gate turns them into the rollout's logprob mode (temperature and top-p, as
vLLM's sampler does: :func:`harness.kinds.invariance.trainer.mode_logprobs`). The built-in one is
:func:`hf_trainer` (transformers); ``trainer=<module:callable>`` names another.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

Sequences = Sequence[tuple[Sequence[int], Sequence[int]]]
Trainer = Callable[[Path, Sequences, str], list[np.ndarray]]
BUILTIN = "hf"


def checkpoint_tensors(model_dir: str | Path) -> dict[str, Any]:
    """Every tensor of the checkpoint, by its checkpoint name, as float32 masters."""
    import torch
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        out.update({k: v.to(torch.float32).clone() for k, v in load_file(str(f)).items()})
    if not out:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors checkpoint to train from")
    return out


def write_step(folder: Path, model_dir: str | Path, tensors: Mapping[str, Any], dtype: str) -> Path:
    """A checkpoint folder of ``tensors`` in ``dtype``: what the step sends and what it scores with."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        if (Path(model_dir) / name).exists():
            shutil.copyfile(Path(model_dir) / name, folder / name)
    dt = getattr(torch, dtype)
    save_file({k: v.to(dt).contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def _model(folder: Path, dtype: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype)).eval()


def hf_trainer(folder: Path, sequences: Sequences, dtype: str) -> list[np.ndarray]:
    """transformers in ``dtype``: one teacher-forced forward pass per sequence."""
    logits, _ = hf_score(folder, sequences, dtype)
    return logits


def hf_score(
    folder: Path, sequences: Sequences, dtype: str, replay: Sequence[Mapping[int, np.ndarray]] | None = None
) -> tuple[list[np.ndarray], list[dict[int, np.ndarray]]]:
    """:func:`hf_trainer`, plus each MoE layer's top-k experts at every position (the trainer's own
    router); with ``replay`` (per sequence, layer -> ``[positions, k]`` expert ids, -1 where the engine
    gave none) the routers choose those experts instead (routing replay, R3): the weights are the
    trainer's softmax renormalised over the replayed experts."""
    import torch

    model = _model(folder, dtype)
    gates = [
        (i, layer.mlp.gate)
        for i, layer in enumerate(model.model.layers)
        if hasattr(getattr(layer, "mlp", None), "gate")
    ]
    current: dict[str, Any] = {"routes": {}, "replay": None}

    def hook_for(i: int) -> Callable[..., Any]:
        def hook(module: Any, args: tuple, out: tuple) -> tuple | None:
            logits, scores, idx = out
            forced = current["replay"].get(i) if current["replay"] is not None else None
            if forced is not None:
                f = torch.as_tensor(np.asarray(forced), dtype=torch.long)
                keep = (f >= 0).all(dim=-1)
                probs = torch.softmax(logits.float(), dim=-1)
                chosen = torch.gather(probs, 1, f.clamp(min=0))
                if module.norm_topk_prob:
                    chosen = chosen / chosen.sum(dim=-1, keepdim=True)
                idx = torch.where(keep[:, None], f, idx)
                scores = torch.where(keep[:, None], chosen.to(scores.dtype), scores)
            current["routes"][i] = idx.detach().sort(dim=-1).values.numpy().copy()
            return (logits, scores, idx) if forced is not None else None

        return hook

    handles = [g.register_forward_hook(hook_for(i)) for i, g in gates]
    out, routes = [], []
    try:
        with torch.no_grad():
            for n, (prompt, sampled) in enumerate(sequences):
                ids = [*prompt, *sampled]
                current["routes"], current["replay"] = {}, (replay[n] if replay is not None else None)
                logits = model(torch.tensor([ids])).logits[0].float()
                out.append(logits[len(prompt) - 1 : len(ids) - 1].numpy().copy())
                routes.append(dict(current["routes"]))
    finally:
        for h in handles:
            h.remove()
    return out, routes


def load_trainer(spec: str | None) -> tuple[str, Trainer]:
    """``None``/``hf``: the built-in trainer; ``module:callable``: the user's (imported now, so a
    wrong name fails before any engine starts, naming what is missing)."""
    if spec in (None, "", BUILTIN):
        return BUILTIN, hf_trainer
    mod_name, sep, attr = str(spec).partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"trainer={spec!r}: give 'hf' or '<module>:<callable>' (e.g. mypkg.score:logits)")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"trainer={spec!r}: cannot import {mod_name!r} ({e})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"trainer={spec!r}: {mod_name} has no callable {attr!r}")
    return str(spec), fn
