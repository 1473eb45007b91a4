"""Build the tiny, hub-free models bit-identically.

One small model per architecture family (:mod:`harness.models.families`), all fp32 with head_dim 64,
vocab 512, random weights drawn from numpy's PCG64 (stable across numpy versions) and one byte-level
BPE tokenizer trained here on :mod:`harness.models.corpus`:

* ``tiny-llama``   LlamaForCausalLM, 2 layers, hidden 128, 2 query heads / 1 KV head;
* ``tiny-qwen3``   Qwen3ForCausalLM: the same shape plus q/k norm;
* ``tiny-gemma3``  Gemma3ForCausalLM: 2 sliding-window (64 tokens) + 1 full-attention layer, so vLLM
  keeps several KV-cache groups;
* ``tiny-gpt2``    GPT2LMHeadModel: LayerNorm, GELU MLP, learned positions (2048), MHA;
* ``tiny-qwen3-moe`` Qwen3MoeForCausalLM: 4 experts, 2 routed per token;
* ``tiny-llama-draft`` tiny-llama's draft model for speculative decoding: the same family, seed and
  tokenizer, one layer (its embedding and first layer are tiny-llama's; its output projection is not).

The output projection is scaled so each model is decisive: the median top-1/top-2 logprob gap of
its greedy tokens on the smoke suite is well above 1 nat, so its greedy outputs are not all near-ties
(``python -m harness.models.tiny NAME --out models/NAME --gap`` measures it with transformers).

The files are committed under ``models/<name>``; ``check`` rebuilds them in a temporary folder
and compares digests, so the committed copy can never silently drift from this script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness.models.corpus import CORPUS
from harness.models.families import FAMILIES, TinySpec

SPECS: dict[str, TinySpec] = {s.name: s for s in (
    TinySpec("tiny-llama", summary="Llama: RMSNorm, SwiGLU, rotary, GQA 2q/1kv", chat_template="llama3"),
    TinySpec("tiny-qwen3", "qwen3", "Qwen3: Llama + per-head q/k RMSNorm", seed=20261201,
             chat_template="qwen3"),
    TinySpec("tiny-gemma3", "gemma3", "Gemma-3: 2 sliding-window (64) + 1 full-attention layer, "
             "q/k norm, GeGLU, tied", num_layers=3, seed=20261202,
             layer_types=("sliding_attention", "sliding_attention", "full_attention"), sliding_window=64,
             lm_head_std=0.3, post_norm_scale=8.0, chat_template="gemma"),
    TinySpec("tiny-gpt2", "gpt2", "GPT-2: LayerNorm, GELU MLP, learned positions, MHA, tied",
             num_kv_heads=2, intermediate_size=512, max_position_embeddings=2048, seed=20261203,
             init_std=0.2),
    TinySpec("tiny-llama-draft", summary="a draft for tiny-llama's speculative decoding: Llama, 1 layer, "
             "the same tokenizer", num_layers=1, chat_template="llama3"),
    TinySpec("tiny-qwen3-moe", "qwen3_moe", "Qwen3-MoE: 4 experts, top-2 routing, q/k norm",
             num_experts=4, experts_per_token=2, moe_intermediate_size=128, seed=20261204,
             chat_template="qwen3"),
)}

SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
BUILD_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "generation_config.json", "chat_template.jinja")
TEMPLATES = Path(__file__).parent / "templates"


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

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    return FAMILIES[spec.family].weights(spec, normal)


def build(name: str, out: Path) -> Path:
    """Write the model ``name`` into ``out`` (created) and return it."""
    from safetensors.numpy import save_file


    spec = SPECS[name]
    out.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(spec, out)
    save_file(_weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = FAMILIES[spec.family].config(spec)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").write_bytes((TEMPLATES / f"{spec.chat_template}.jinja").read_bytes())
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


def greedy_gaps(folder: Path, prompts: list[list[int]], max_tokens: int = 32) -> np.ndarray:
    """Top-1 minus top-2 logprob of every greedy token transformers generates from ``prompts``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    gaps = []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.inference_mode():
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                               do_sample=False, output_logits=True, return_dict_in_generate=True)
        lp = torch.log_softmax(torch.stack(g.logits, 1)[0].float(), -1)
        top2 = lp.topk(2, -1).values
        gaps.append((top2[:, 0] - top2[:, 1]).numpy())
    return np.concatenate(gaps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(SPECS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--check", action="store_true", help="rebuild and compare with --out")
    ap.add_argument("--gap", action="store_true",
                    help="measure the top-1/top-2 logprob gaps of --out's greedy tokens on the smoke "
                         "suite (transformers)")
    args = ap.parse_args(argv)
    if args.gap:
        from tokenizers import Tokenizer

        from harness.suites import find_suite
        from harness.workspace import Workspace

        tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
        suite = find_suite(Workspace.default().suites, "smoke")
        cases = suite.build_cases(lambda t: tok.encode(t, add_special_tokens=False).ids)
        gaps = greedy_gaps(args.out, [list(c.prompt_ids) for c in cases], suite.sampling.max_tokens)
        print(f"{args.name}: {gaps.size} greedy tokens, median top-1/top-2 gap {np.median(gaps):.3f} "
              f"nats, {(gaps < 0.5).sum()} below 0.5")
        return 0
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
