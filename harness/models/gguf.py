"""A Llama-architecture GGUF file -> a float32 Hugging Face checkpoint folder, byte for byte the same
on every machine.

Weights are dequantized by the ``gguf`` package (numpy), the query/key rows llama.cpp permutes for
its rotary layout are put back, and everything is written by this module with sorted keys:
``model.safetensors``, ``config.json``, ``generation_config.json``, ``tokenizer.json`` (the BPE
vocabulary and merges the GGUF carries, with the pre-tokenizer its ``tokenizer.ggml.pre`` names),
``tokenizer_config.json`` and ``special_tokens_map.json``. No file is serialized by transformers or
tokenizers, so their versions cannot change the bytes (and with them the model's content digest).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness.excerpt import clip
from harness.models.built import ModelBuildError

# tokenizer.ggml.pre -> the Hugging Face pre-tokenizer that splits text the same way (llama.cpp
# splits "smollm" text with \p{N} first, then the GPT-2 pattern: digits one by one).
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                     _BYTE_LEVEL]},
    "gpt-2": _BYTE_LEVEL,
}
_CONTROL = 3
"""llama.cpp's token type of control (special) tokens."""

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _hf_name(name: str) -> str:
    base, _, kind = name.rpartition(".")
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)", base):
        if m.group(2) in _LAYER_NAMES:
            return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{kind}"
    elif base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{kind}"
    raise ModelBuildError(f"GGUF tensor {name!r} has no Llama counterpart")


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row order of a q or k projection (rows interleaved per head)."""
    half = w.shape[0] // n_head // 2
    return np.ascontiguousarray(w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _f32(v: Any) -> float:
    """A float32 metadata value as the shortest decimal that reads back to it (1e-05, not 9.99e-06)."""
    return float(str(np.float32(v)))


def read(path: Path) -> tuple[dict[str, Any], Any]:
    """(metadata, reader) of a GGUF file; a file that is not one is a :class:`ModelBuildError`."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        meta = {k: f.contents() for k, f in reader.fields.items()}
    except Exception as e:  # noqa: BLE001 - any parse failure means the same thing to the user
        raise ModelBuildError(f"{path}: not a readable GGUF file ({type(e).__name__}: {clip(str(e))})"
                              ) from None
    return meta, reader


def llama_config(meta: Mapping[str, Any], tied: bool) -> dict[str, Any]:
    if meta.get("general.architecture") != "llama":
        raise ModelBuildError(f"GGUF architecture {meta.get('general.architecture')!r}: only 'llama' "
                              "is converted")
    a = "llama."
    hidden, heads = int(meta[a + "embedding_length"]), int(meta[a + "attention.head_count"])
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": hidden, "intermediate_size": int(meta[a + "feed_forward_length"]),
        "num_hidden_layers": int(meta[a + "block_count"]), "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(a + "attention.head_count_kv", heads)),
        "head_dim": hidden // heads, "hidden_act": "silu",
        "max_position_embeddings": int(meta[a + "context_length"]),
        "rms_norm_eps": _f32(meta[a + "attention.layer_norm_rms_epsilon"]),
        "rope_theta": _f32(meta.get(a + "rope.freq_base", 10000.0)),
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    for key in ("bos", "eos", "padding"):
        if (v := meta.get(f"tokenizer.ggml.{key}_token_id")) is not None:
            cfg[f"{'pad' if key == 'padding' else key}_token_id"] = int(v)
    return cfg


def llama_weights(reader: Any, cfg: Mapping[str, Any]) -> dict[str, np.ndarray]:
    from gguf import quants

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        want = tuple(int(x) for x in reversed(t.shape))
        if w.shape != want:
            w = w.reshape(want)
        if name.endswith("self_attn.q_proj.weight"):
            w = _unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("self_attn.k_proj.weight"):
            w = _unpermute(w, cfg["num_key_value_heads"])
        out[name] = np.ascontiguousarray(w)
    expect = 9 * cfg["num_hidden_layers"] + 2 + (0 if cfg["tie_word_embeddings"] else 1)
    if len(out) != expect:
        raise ModelBuildError(f"GGUF holds {len(out)} tensors, a Llama of {cfg['num_hidden_layers']} "
                              f"layers has {expect}")
    return out


def tokenizer_files(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json from the GGUF's vocabulary."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelBuildError(f"GGUF tokenizer {meta.get('tokenizer.ggml.model')!r}: only byte-level "
                              "BPE ('gpt2') is converted")
    pre = str(meta.get("tokenizer.ggml.pre", "gpt-2"))
    if pre not in PRE_TOKENIZERS:
        raise ModelBuildError(f"GGUF pre-tokenizer {pre!r} is not known here ({', '.join(PRE_TOKENIZERS)})")
    tokens = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
               for i, (t, k) in enumerate(zip(tokens, types, strict=True)) if k == _CONTROL]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[pre], "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [str(m) for m in meta["tokenizer.ggml.merges"]]},
    }
    named = {}
    for key, field in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                       ("pad_token", "padding")):
        if (v := meta.get(f"tokenizer.ggml.{field}_token_id")) is not None:
            named[key] = tokens[int(v)]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **named,
              "model_max_length": int(meta.get("llama.context_length", 2048)),
              "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
              "add_eos_token": False, "clean_up_tokenization_spaces": False}
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = str(meta["tokenizer.chat_template"])
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config, "special_tokens_map.json": named}


def convert_llama(gguf_path: Path, out: Path) -> dict[str, Any]:
    """Write the float32 checkpoint of a Llama GGUF into ``out``; returns its config."""
    from safetensors.numpy import save_file

    meta, reader = read(gguf_path)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    cfg = llama_config(meta, tied)
    weights = llama_weights(reader, cfg)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: weights[k] for k in sorted(weights)}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    dump = lambda obj: json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"  # noqa: E731
    files = {"config.json": dump(cfg),
             "generation_config.json": dump({k: cfg[k] for k in ("bos_token_id", "eos_token_id",
                                                                 "pad_token_id") if k in cfg})}
    for name, obj in tokenizer_files(meta).items():  # tokenizer.json on one line: 49k vocabulary entries
        files[name] = dump(obj) if name != "tokenizer.json" else (
            json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n")
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return cfg
