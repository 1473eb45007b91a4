"""What a checkpoint's config.json says about the model: records carry these facts so the
supported-models page is written from records alone, and suites are checked against the limits
before any engine starts.

The KV-cache groups are not here: they are vLLM's own decision (which layers share a block table,
with which block size) and are read from the engine at run time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_MODEL_LEN = 4096
"""The longest context the harness runs vLLM with (its KV cache must fit a small CPU box); a model
that holds fewer positions runs with its own."""
DEFAULT_MODEL_LEN = 2048
"""The context assumed for a checkpoint whose config names none."""

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's own config (multimodal checkpoints nest it under ``text_config``)."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, Mapping) else cfg


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def context_length(cfg: Mapping[str, Any]) -> int | None:
    """How many positions the model holds, whatever its family calls it (GPT-2: ``n_positions``)."""
    return _int(_text_config(cfg), *_CONTEXT_KEYS)


def attention_of(cfg: Mapping[str, Any]) -> str:
    """A one-line description, e.g. ``full attention, GQA 8q/2kv`` or
    ``full + sliding-window attention (window 64; 2 sliding, 1 full), GQA 2q/1kv``."""
    cfg = _text_config(cfg)
    parts = []
    layer_types = [str(t) for t in cfg.get("layer_types") or ()]
    window = None if cfg.get("use_sliding_window") is False else cfg.get("sliding_window")
    if cfg.get("kv_lora_rank"):
        parts.append("MLA")
    elif any("linear" in t or "mamba" in t or "delta" in t for t in layer_types):
        parts.append("hybrid " + " + ".join(sorted(set(layer_types))))
    elif any("sliding" in t for t in layer_types) and len(set(layer_types)) > 1:
        n_slide = sum("sliding" in t for t in layer_types)
        parts.append(f"full + sliding-window attention (window {window}; {n_slide} sliding, "
                     f"{len(layer_types) - n_slide} full)")
    elif layer_types and all("sliding" in t for t in layer_types) and window:
        parts.append(f"sliding-window attention (window {window})")
    elif window and not layer_types:
        parts.append(f"sliding-window attention (window {window})")
    else:
        parts.append("full attention")
    heads = _int(cfg, "num_attention_heads", "n_head")
    kv = _int(cfg, "num_key_value_heads") or heads
    if heads and kv and not cfg.get("kv_lora_rank"):
        parts.append("MHA" if kv == heads else f"MQA {heads}q/1kv" if kv == 1 else f"GQA {heads}q/{kv}kv")
    return ", ".join(parts)


def experts_of(cfg: Mapping[str, Any]) -> str:
    """``MoE 4 experts, top-2`` or empty for a dense model."""
    cfg = _text_config(cfg)
    n = _int(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    k = _int(cfg, "num_experts_per_tok", "num_experts_per_token", "moe_top_k")
    if not n or n <= 1:
        return ""
    return f"MoE {n} experts, top-{k}" if k else f"MoE {n} experts"


def block_of(cfg: Mapping[str, Any]) -> str:
    """Norm, MLP and position scheme, e.g. ``RMSNorm, gated MLP (silu), rotary`` (best effort)."""
    cfg = _text_config(cfg)
    mt = str(cfg.get("model_type", ""))
    if mt == "gpt2" or "n_embd" in cfg:
        return f"LayerNorm, MLP ({cfg.get('activation_function', 'gelu')}), learned positions"
    act = cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu"
    norm = "RMSNorm (1 + w), pre + post" if mt.startswith("gemma") else "RMSNorm"
    if mt.startswith(("qwen3", "gemma3")):
        norm += ", q/k norm"
    partial = cfg.get("partial_rotary_factor")
    rotary = f"rotary ({partial:g} of head_dim)" if isinstance(partial, float) and partial < 1 else "rotary"
    return f"{norm}, gated MLP ({act}), {rotary}"


def model_facts(path: str | Path) -> dict[str, str]:
    """``architecture``, ``attention`` (+ ``experts``, ``block``) of a local checkpoint; empty when it
    has no config.json."""
    p = Path(path) / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    arch = cfg.get("architectures") or [cfg.get("model_type", "")]
    facts = {"architecture": str(arch[0]), "attention": attention_of(cfg), "block": block_of(cfg)}
    if moe := experts_of(cfg):
        facts["experts"] = moe
    return facts


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a suite must fit in to mean the same thing on a model."""

    vocab_size: int | None
    """Token ids must be below it; None when the config does not say."""
    max_len: int
    """Prompt + generated tokens the engines run with (the oracle's ``max_model_len``)."""

    @classmethod
    def of(cls, path: str | Path) -> ModelLimits:
        try:
            cfg = json.loads((Path(path) / "config.json").read_text())
        except (OSError, ValueError):
            cfg = {}
        context = context_length(cfg) or DEFAULT_MODEL_LEN
        return cls(_int(_text_config(cfg), "vocab_size"), min(context, MAX_MODEL_LEN))
