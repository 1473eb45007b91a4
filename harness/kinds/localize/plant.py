"""Copies of a checkpoint with one weight perturbed: the planted proof that a localization names the
layer and sub-block where the change acts.

    harness plant --model tiny-llama --layer 1 --sub mlp --relative 1e-2 --out .cache/planted/l1-mlp

copies every file of the model and adds Gaussian noise to one weight tensor, scaled so that
``||noise|| / ||weight|| = relative`` (seeded: the same copy every time; ``--relative 0`` makes an
unperturbed copy, the control that must localize nothing). The copy has the model's
config and tokenizer, so ``CANDIDATE=hf:weights=PATH`` (or ``vllm:weights=PATH``) gates it against
the model's goldens, and the diagnosis must name ``layer.<k>.<sub>``. ``PLANTED.json`` beside the
weights says what was planted (it is not part of the checkpoint's digest).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engines.launch.layer_taps import FAMILIES
from harness.models import ModelRef, content_digest

_LLAMA = {"mlp": "model.layers.{k}.mlp.down_proj.weight", "attn": "model.layers.{k}.self_attn.o_proj.weight"}
WEIGHTS: dict[str, dict[str, str]] = {
    "llama": _LLAMA,
    "qwen3": _LLAMA,
    "gemma3_text": _LLAMA,
    "qwen3_moe": {"moe": "model.layers.{k}.mlp.experts.0.down_proj.weight",
                  "attn": "model.layers.{k}.self_attn.o_proj.weight"},
    "gpt2": {"mlp": "transformer.h.{k}.mlp.c_proj.weight", "attn": "transformer.h.{k}.attn.c_proj.weight"},
}
"""``model_type`` -> sub-block -> the weight :func:`plant` perturbs by default: the output projection
of the sub-block (one expert's, in a mixture of experts)."""
assert set(WEIGHTS) <= set(FAMILIES)


class PlantError(ValueError):
    """Bad input to the planting tool; the message names the field."""


@dataclass(frozen=True, slots=True)
class Planted:
    path: Path
    weight: str
    relative: float
    seed: int
    digest: str
    source_digest: str

    def to_json(self) -> dict[str, Any]:
        return {"weight": self.weight, "relative": self.relative, "seed": self.seed, "digest": self.digest,
                "source_digest": self.source_digest}


def default_weight(model_type: str, layer: int, sub: str) -> str:
    subs = WEIGHTS.get(model_type)
    if subs is None:
        raise PlantError(f"no default weight for model_type {model_type!r} (known: {', '.join(WEIGHTS)}); "
                         "name one with --weight")
    if sub not in subs:
        raise PlantError(f"--sub {sub!r}: {model_type} has {', '.join(subs)}")
    return subs[sub].format(k=layer)


def plant(model: ModelRef, out: Path, *, weight: str | None = None, layer: int | None = None,
          sub: str = "mlp", relative: float = 1e-2, seed: int = 0) -> Planted:
    """Copy ``model`` into ``out`` (which must not exist) with one weight perturbed."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(model.path)
    if out.exists():
        raise PlantError(f"--out {out}: exists (a planted copy is written once; remove it first)")
    if not relative >= 0:
        raise PlantError(f"--relative {relative}: must be >= 0 (0: an unperturbed copy, the control)")
    cfg = json.loads((src / "config.json").read_text())
    if weight is None:
        if layer is None:
            raise PlantError("give --weight NAME, or --layer K (and --sub)")
        n = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0)
        if not 0 <= layer < n:
            raise PlantError(f"--layer {layer}: {model.name} has layers 0..{n - 1}")
        weight = default_weight(str(cfg.get("model_type")), layer, sub)
    shard = next((f for f in sorted(src.glob("*.safetensors"))
                  if weight in safe_open(str(f), "pt").keys()), None)
    if shard is None:
        raise PlantError(f"--weight {weight!r}: no such tensor in {model.name}'s *.safetensors")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".planting-", dir=out.parent))
    try:
        for f in src.iterdir():
            if f.is_file() and (f != shard or relative == 0):  # 0: the unperturbed copy, byte for byte
                shutil.copy2(f, tmp / f.name)
        if relative > 0:
            with safe_open(str(shard), "pt") as fh:
                meta = fh.metadata()
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - no iterator
            w = tensors[weight]
            noise = torch.randn(w.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            tensors[weight] = (w.double() + noise * (relative * w.double().norm() / noise.norm())).to(w.dtype)
            save_file(tensors, str(tmp / shard.name), metadata=meta)
        planted = Planted(out, weight, relative, seed, content_digest(tmp), model.digest)
        (tmp / "PLANTED.json").write_text(json.dumps({"model": model.name, **planted.to_json()}, indent=1,
                                                     sort_keys=True) + "\n")
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return planted
