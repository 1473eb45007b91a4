"""What each tiny architecture family writes: its config.json and its weights.

Every family draws its weights from one numpy PCG64 stream in a fixed order, so a spec always
builds the same bytes. The shapes and names are the ones the family's Hugging Face checkpoints use,
so transformers and vLLM load them as they would a real model of that family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class TinySpec:
    name: str
    family: str = "llama"
    """A key of :data:`harness.models.families.FAMILIES`."""
    summary: str = ""
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    max_position_embeddings: int = 4096
    seed: int = 20261130
    init_std: float = 0.08
    """Std of the hidden projections' weights."""
    embed_std: float = 1.0
    lm_head_std: float = 0.6
    """Scales the logits: larger means a more decisive model (bigger top-1/top-2 gaps). Tied
    families draw their embeddings with it."""
    layer_types: tuple[str, ...] = ()
    """Per layer: ``full_attention`` or ``sliding_attention`` (families with both)."""
    sliding_window: int | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    router_std: float = 0.5
    position_std: float = 0.1
    post_norm_scale: float = 1.0
    """Gemma: the scale ``1 + w`` of the norms after the attention and MLP blocks."""
    """Std of learned absolute position embeddings (GPT-2)."""
    chat_template: str = "chatml"
    """The family's chat-template style, ``harness/models/templates/<style>.jinja``: written beside the
    tokenizer as ``chat_template.jinja`` (outside the content digest: the token gates never read it)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


Normal = Callable[[tuple[int, ...], float], np.ndarray]
Weights = dict[str, np.ndarray]
NUM_SPECIAL = 3
"""Ids 0..2 are the tokenizer's special tokens: their logits are zeroed so generations never stop."""


@dataclass(frozen=True, slots=True)
class Family:
    architecture: str
    config: Callable[[TinySpec], dict[str, Any]]
    weights: Callable[[TinySpec, Normal], Weights]


def _ones(n: int) -> np.ndarray:
    return np.ones(n, np.float32)


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def _head(w: Weights, spec: TinySpec, normal: Normal, tied: bool, key: str = "lm_head.weight") -> None:
    """The output projection: its scale sets how decisive the model is; special tokens never win."""
    if tied:
        return
    lm_head = normal((spec.vocab_size, spec.hidden_size), spec.lm_head_std)
    lm_head[:NUM_SPECIAL] = 0.0
    w[key] = lm_head


def _attention(w: Weights, p: str, spec: TinySpec, normal: Normal) -> None:
    h, d = spec.hidden_size, spec.head_dim
    w[p + "self_attn.q_proj.weight"] = normal((spec.num_heads * d, h), spec.init_std)
    w[p + "self_attn.k_proj.weight"] = normal((spec.num_kv_heads * d, h), spec.init_std)
    w[p + "self_attn.v_proj.weight"] = normal((spec.num_kv_heads * d, h), spec.init_std)
    w[p + "self_attn.o_proj.weight"] = normal((h, spec.num_heads * d), spec.init_std)


def _gated_mlp(w: Weights, p: str, h: int, i: int, std: float, normal: Normal) -> None:
    w[p + "gate_proj.weight"] = normal((i, h), std)
    w[p + "up_proj.weight"] = normal((i, h), std)
    w[p + "down_proj.weight"] = normal((h, i), std)


def _common(spec: TinySpec) -> dict[str, Any]:
    return {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "attention_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


# --- Llama: RMSNorm, SwiGLU, rotary positions -------------------------------------------------------

def _llama_config(spec: TinySpec) -> dict[str, Any]:
    return {**_common(spec), "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "mlp_bias": False,
            "tie_word_embeddings": False}


def _llama_weights(spec: TinySpec, normal: Normal) -> Weights:
    h = spec.hidden_size
    w: Weights = {"model.embed_tokens.weight": normal((spec.vocab_size, h), spec.embed_std)}
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = _ones(h)
        w[p + "post_attention_layernorm.weight"] = _ones(h)
        _attention(w, p, spec, normal)
        _gated_mlp(w, p + "mlp.", h, spec.intermediate_size, spec.init_std, normal)
    w["model.norm.weight"] = _ones(h)
    _head(w, spec, normal, tied=False)
    return w


# --- Qwen3: Llama plus an RMSNorm on each head's queries and keys ---------------------------------

def _qwen3_config(spec: TinySpec) -> dict[str, Any]:
    return {**_common(spec), "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "use_sliding_window": False, "sliding_window": None, "tie_word_embeddings": False}


def _qwen3_layer(w: Weights, p: str, spec: TinySpec, normal: Normal) -> None:
    h = spec.hidden_size
    w[p + "input_layernorm.weight"] = _ones(h)
    w[p + "post_attention_layernorm.weight"] = _ones(h)
    _attention(w, p, spec, normal)
    w[p + "self_attn.q_norm.weight"] = _ones(spec.head_dim)
    w[p + "self_attn.k_norm.weight"] = _ones(spec.head_dim)


def _qwen3_weights(spec: TinySpec, normal: Normal) -> Weights:
    h = spec.hidden_size
    w: Weights = {"model.embed_tokens.weight": normal((spec.vocab_size, h), spec.embed_std)}
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        _qwen3_layer(w, p, spec, normal)
        _gated_mlp(w, p + "mlp.", h, spec.intermediate_size, spec.init_std, normal)
    w["model.norm.weight"] = _ones(h)
    _head(w, spec, normal, tied=False)
    return w


# --- Qwen3-MoE: Qwen3 attention, a routed mixture of SwiGLU experts in every layer ----------------

def _qwen3_moe_config(spec: TinySpec) -> dict[str, Any]:
    return {**_qwen3_config(spec), "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "num_experts": spec.num_experts, "num_experts_per_tok": spec.experts_per_token,
            "moe_intermediate_size": spec.moe_intermediate_size, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.0,
            "output_router_logits": False}


def _qwen3_moe_weights(spec: TinySpec, normal: Normal) -> Weights:
    h = spec.hidden_size
    w: Weights = {"model.embed_tokens.weight": normal((spec.vocab_size, h), spec.embed_std)}
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        _qwen3_layer(w, p, spec, normal)
        w[p + "mlp.gate.weight"] = normal((spec.num_experts, h), spec.router_std)
        for e in range(spec.num_experts):
            _gated_mlp(w, f"{p}mlp.experts.{e}.", h, spec.moe_intermediate_size, spec.init_std, normal)
    w["model.norm.weight"] = _ones(h)
    _head(w, spec, normal, tied=False)
    return w


# --- Gemma-3: sliding-window and full-attention layers, (1 + w) norms around both blocks, GeGLU,
# --- q/k norm, embeddings scaled by sqrt(hidden), tied output --------------------------------------

def _gemma3_config(spec: TinySpec) -> dict[str, Any]:
    return {**_common(spec), "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
            "layer_types": list(spec.layer_types), "sliding_window": spec.sliding_window,
            "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
            "query_pre_attn_scalar": spec.head_dim, "attn_logit_softcapping": None,
            "final_logit_softcapping": None, "pad_token_id": 2, "tie_word_embeddings": True}


def _gemma3_weights(spec: TinySpec, normal: Normal) -> Weights:
    h = spec.hidden_size
    embed = normal((spec.vocab_size, h), spec.lm_head_std)  # tied: also the output projection
    embed[:NUM_SPECIAL] = 0.0
    w: Weights = {"model.embed_tokens.weight": embed}
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        # Gemma norms scale by (1 + w). The post-norms set each block's share of the residual stream:
        # at 1 the sqrt(hidden)-scaled embedding dominates it and the tied head mostly repeats the input.
        w[p + "input_layernorm.weight"] = _zeros(h)
        w[p + "pre_feedforward_layernorm.weight"] = _zeros(h)
        w[p + "post_attention_layernorm.weight"] = np.full(h, spec.post_norm_scale - 1, np.float32)
        w[p + "post_feedforward_layernorm.weight"] = np.full(h, spec.post_norm_scale - 1, np.float32)
        _attention(w, p, spec, normal)
        w[p + "self_attn.q_norm.weight"] = _zeros(spec.head_dim)
        w[p + "self_attn.k_norm.weight"] = _zeros(spec.head_dim)
        _gated_mlp(w, p + "mlp.", h, spec.intermediate_size, spec.init_std, normal)
    w["model.norm.weight"] = _zeros(h)
    return w


# --- GPT-2: LayerNorm with bias, GELU MLP (no gate), learned absolute positions, fused QKV with
# --- bias, Conv1D weights stored (in, out), MHA, tied output ---------------------------------------

def _gpt2_config(spec: TinySpec) -> dict[str, Any]:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": spec.vocab_size,
            "n_embd": spec.hidden_size, "n_layer": spec.num_layers, "n_head": spec.num_heads,
            "n_inner": spec.intermediate_size, "n_positions": spec.max_position_embeddings,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "tie_word_embeddings": True,
            "torch_dtype": "float32", "bos_token_id": 0, "eos_token_id": 1}


def _gpt2_weights(spec: TinySpec, normal: Normal) -> Weights:
    h, i = spec.hidden_size, spec.intermediate_size
    if spec.num_kv_heads != spec.num_heads:
        raise ValueError(f"{spec.name}: GPT-2 attention is multi-head (num_kv_heads == num_heads)")
    wte = normal((spec.vocab_size, h), spec.lm_head_std)  # tied: also the output projection
    wte[:NUM_SPECIAL] = 0.0
    w: Weights = {"transformer.wte.weight": wte,
                  "transformer.wpe.weight": normal((spec.max_position_embeddings, h), spec.position_std)}
    for layer in range(spec.num_layers):
        p = f"transformer.h.{layer}."
        w[p + "ln_1.weight"], w[p + "ln_1.bias"] = _ones(h), _zeros(h)
        w[p + "attn.c_attn.weight"] = normal((h, 3 * h), spec.init_std)
        w[p + "attn.c_attn.bias"] = normal((3 * h,), spec.init_std)
        w[p + "attn.c_proj.weight"] = normal((h, h), spec.init_std)
        w[p + "attn.c_proj.bias"] = normal((h,), spec.init_std)
        w[p + "ln_2.weight"], w[p + "ln_2.bias"] = _ones(h), _zeros(h)
        w[p + "mlp.c_fc.weight"] = normal((h, i), spec.init_std)
        w[p + "mlp.c_fc.bias"] = normal((i,), spec.init_std)
        w[p + "mlp.c_proj.weight"] = normal((i, h), spec.init_std)
        w[p + "mlp.c_proj.bias"] = normal((h,), spec.init_std)
    w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = _ones(h), _zeros(h)
    return w


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", _llama_config, _llama_weights),
    "qwen3": Family("Qwen3ForCausalLM", _qwen3_config, _qwen3_weights),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", _qwen3_moe_config, _qwen3_moe_weights),
    "gemma3": Family("Gemma3ForCausalLM", _gemma3_config, _gemma3_weights),
    "gpt2": Family("GPT2LMHeadModel", _gpt2_config, _gpt2_weights),
}
"""Family name -> how a tiny model of it is written."""
