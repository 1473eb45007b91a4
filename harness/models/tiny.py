"""Build the tiny, hub-free models bit-identically.

``tiny-llama`` is a LlamaForCausalLM (2 layers, hidden 128, 2 heads of head_dim 64, 1 KV head,
vocab 512, fp32) with random weights drawn from numpy's PCG64 (stable across numpy versions) and a
byte-level BPE tokenizer trained here on :mod:`harness.models.corpus`. The weights are scaled so the
model is decisive: the median top-1/top-2 logprob gap of its greedy tokens is well above 1 nat, so
its greedy outputs are not all near-ties (``python -m harness.models.tiny --gap`` measures it).

The files are committed under ``models/tiny-llama``; ``check`` rebuilds them in a temporary folder
and compares digests, so the committed copy can never silently drift from this script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.models.corpus import CORPUS


@dataclass(frozen=True, slots=True)
class TinySpec:
    name: str
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
    """Scales the logits: larger means a more decisive model (bigger top-1/top-2 gaps)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


SPECS: dict[str, TinySpec] = {"tiny-llama": TinySpec("tiny-llama")}

SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
BUILD_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "generation_config.json")


def _train_tokenizer(spec: TinySpec, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    if tok.get_vocab_size() != spec.vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, spec wants {spec.vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": spec.max_position_embeddings,
        "add_bos_token": False, "add_eos_token": False,
    }, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2, sort_keys=True) + "\n")


def _weights(spec: TinySpec) -> dict[str, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    h, i, v, d = spec.hidden_size, spec.intermediate_size, spec.vocab_size, spec.head_dim

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal((v, h), spec.embed_std)}
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "self_attn.q_proj.weight"] = normal((spec.num_heads * d, h), spec.init_std)
        w[p + "self_attn.k_proj.weight"] = normal((spec.num_kv_heads * d, h), spec.init_std)
        w[p + "self_attn.v_proj.weight"] = normal((spec.num_kv_heads * d, h), spec.init_std)
        w[p + "self_attn.o_proj.weight"] = normal((h, spec.num_heads * d), spec.init_std)
        w[p + "mlp.gate_proj.weight"] = normal((i, h), spec.init_std)
        w[p + "mlp.up_proj.weight"] = normal((i, h), spec.init_std)
        w[p + "mlp.down_proj.weight"] = normal((h, i), spec.init_std)
    w["model.norm.weight"] = np.ones(h, np.float32)
    lm_head = normal((v, h), spec.lm_head_std)
    lm_head[: len(SPECIAL_TOKENS)] = 0.0  # special tokens never win: generations run to max_tokens
    w["lm_head.weight"] = lm_head
    return w


def build(name: str, out: Path) -> Path:
    """Write the model ``name`` into ``out`` (created) and return it."""
    from safetensors.numpy import save_file

    spec = SPECS[name]
    out.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(spec, out)
    save_file(_weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=2, sort_keys=True) + "\n")
    return out


def file_digests(folder: Path) -> dict[str, str]:
    return {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in BUILD_FILES}


def check(name: str, committed: Path) -> list[str]:
    """Rebuild ``name`` and list the committed files whose bytes differ (empty: identical)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = file_digests(build(name, Path(tmp)))
    have = {f: (hashlib.sha256((committed / f).read_bytes()).hexdigest()
                if (committed / f).exists() else "missing") for f in BUILD_FILES}
    return [f"{f}: committed {have[f][:12]} rebuilt {fresh[f][:12]}" for f in BUILD_FILES
            if have[f] != fresh[f]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(SPECS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--check", action="store_true", help="rebuild and compare with --out")
    args = ap.parse_args(argv)
    if args.check:
        diffs = check(args.name, args.out)
        for d in diffs:
            print(d)
        print("identical" if not diffs else f"{len(diffs)} file(s) differ")
        return 1 if diffs else 0
    build(args.name, args.out)
    print(json.dumps(file_digests(args.out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
