"""What a checkpoint's config.json says about its attention: records carry it so the supported-models
page is written from records alone."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def attention_of(cfg: Mapping[str, Any]) -> str:
    """A one-line description, e.g. ``full attention, GQA 8q/2kv`` or ``MLA + sliding window 4096``."""
    parts = []
    layer_types = [str(t) for t in cfg.get("layer_types") or ()]
    if cfg.get("kv_lora_rank"):
        parts.append("MLA")
    elif any("linear" in t or "mamba" in t or "delta" in t for t in layer_types):
        parts.append("hybrid " + " + ".join(sorted(set(layer_types))))
    elif any("sliding" in t for t in layer_types):
        parts.append("full + sliding-window attention")
    else:
        parts.append("full attention")
    if cfg.get("sliding_window") and not any("sliding" in t for t in layer_types):
        parts.append(f"sliding window {cfg['sliding_window']}")
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and not cfg.get("kv_lora_rank"):
        parts.append("MHA" if kv == heads else "MQA" if kv == 1 else f"GQA {heads}q/{kv}kv")
        if kv == 1 and heads > 1:
            parts[-1] = f"MQA {heads}q/1kv"
    return ", ".join(parts)


def model_facts(path: str | Path) -> dict[str, str]:
    """``architecture`` and ``attention`` of a local checkpoint; empty when it has no config.json."""
    p = Path(path) / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    arch = cfg.get("architectures") or [cfg.get("model_type", "")]
    return {"architecture": str(arch[0]), "attention": attention_of(cfg)}
