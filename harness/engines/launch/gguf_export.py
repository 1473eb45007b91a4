"""A GGUF file written from the checkpoint the oracle runs, so llama.cpp and vLLM load the same weights.

``llamacpp:gguf=f32`` (or ``f16``, ``q8_0``) serves a GGUF the harness writes itself from the model folder's
safetensors with the ``gguf`` package: the weights are the oracle's, bit for bit in F32, and only
the engines differ. Llama-architecture checkpoints (``LlamaForCausalLM``) only:

* tensor names: the ``gguf`` package's own HF -> GGUF name map for ``MODEL_ARCH.LLAMA``;
* q and k projections: llama.cpp's rotary embedding pairs neighbouring dimensions where the HF
  checkpoint pairs the two halves of each head, so their rows are reordered head by head
  (:func:`interleave_heads`); transformers undoes exactly this when it loads a GGUF;
* hyperparameters from ``config.json`` (no rope scaling: refused);
* tokenizer: copied key by key from the GGUF the model was built from, when there is one (the
  tokenizer then matches the original conversion exactly), else written from ``tokenizer.json``
  (byte-level BPE only). Either way the gate verifies it: prompts are tokenized by the server and
  compared with the oracle's ids (the ``tokenizer`` verdict);
* chat template: ``chat_template.jinja`` beside the tokenizer, as ``tokenizer.chat_template`` (what
  a conversion writes, and what llama.cpp's server renders chats with); the file name carries its
  digest, since the model's content digest leaves the template out.

The file is written to a temporary name and renamed, under a lock, and reused while the model's
digest is the same: ``reports/runs/gguf/<model>-<digest>-<kind>.gguf`` beside a JSON of its facts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.files import locked, sha256_file
from harness.models.digest import TEMPLATE_FILE

KINDS = ("f32", "f16", "q8_0")


Q8_0_BLOCK = 32
"""Weights per Q8_0 block (one float16 scale and 32 int8): rows must be a multiple of it."""


class GGUFExportError(ValueError):
    """The checkpoint cannot be written as a GGUF (architecture, rope scaling, tokenizer)."""


@dataclass(frozen=True, slots=True)
class GGUFFile:
    """A GGUF the harness serves, and where it came from (for the record)."""

    path: Path
    kind: str
    """``f32``/``f16``/``q8_0`` (written by the harness) or ``source`` (the file the model was built from)."""
    facts: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"file": self.path.name, "kind": self.kind, **dict(self.facts)}


def interleave_heads(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q/k projection, per head, from HF's rotate-half order (first half, second half) to
    llama.cpp's pairwise order (0, d/2, 1, d/2 + 1, ...)."""
    rows = w.shape[0]
    head_dim = rows // n_head
    return (w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise GGUFExportError(f"rope scaling {kind!r} is not written by the harness's GGUF export; serve the "
                              f"model's own GGUF (llamacpp:gguf=source or gguf=<path>)")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def exportable(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's config when the harness can write its GGUF; else :class:`GGUFExportError`
    saying why (read from ``config.json`` alone: seconds, nothing written)."""
    cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    archs = cfg.get("architectures") or []
    if archs != ["LlamaForCausalLM"]:
        raise GGUFExportError(f"{model_dir}: the harness writes GGUFs of LlamaForCausalLM only, not {archs}; "
                              f"serve the model's own GGUF (llamacpp:gguf=<path>)")
    _rope_theta(cfg)
    return cfg


def export_gguf(model_dir: Path, kind: str, out_dir: Path, name: str, digest: str,
                source: Path | None = None) -> GGUFFile:
    """The ``kind`` GGUF of the checkpoint in ``model_dir`` (written first if missing)."""
    if kind not in KINDS:
        raise GGUFExportError(f"gguf={kind!r}: the harness writes {', '.join(KINDS)}")
    slug = name.strip("/").replace("/", "--").lstrip(".") or "model"
    template = model_dir / TEMPLATE_FILE
    # the content digest leaves the chat template out (the token gates never read it): name it here
    tpl = f"-t{sha256_file(template)[:8]}" if template.is_file() and source is None else ""
    path = out_dir / f"{slug}-{digest[:12]}{tpl}-{kind}.gguf"
    meta = path.with_suffix(".json")
    with locked(path.with_suffix(".lock")):
        if path.exists() and meta.exists():
            return GGUFFile(path, kind, json.loads(meta.read_text()))
        t0 = time.perf_counter()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            facts = _write(model_dir, kind, tmp, source)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        facts.update({"written_s": round(time.perf_counter() - t0, 2), "bytes": path.stat().st_size,
                      "sha256": sha256_file(path), "model_digest": digest})
        tmp_meta = meta.with_name(meta.name + ".tmp")
        tmp_meta.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
        os.replace(tmp_meta, meta)
        return GGUFFile(path, kind, facts)


def _write(model_dir: Path, kind: str, out: Path, source: Path | None) -> dict[str, Any]:
    import gguf
    from safetensors.numpy import load_file

    cfg = exportable(model_dir)
    n_layer, n_head = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // n_head)
    theta = _rope_theta(cfg)

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(str(cfg.get("_name_or_path") or model_dir.name))
    w.add_block_count(n_layer)
    w.add_context_length(int(cfg.get("max_position_embeddings", 2048)))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_rope_dimension_count(head_dim)
    if head_dim != hidden // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(int(cfg["vocab_size"]))
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind])
    tokenizer_from = _tokenizer(w, model_dir, cfg, source)
    template = model_dir / TEMPLATE_FILE
    if source is None and template.is_file():  # as a conversion writes tokenizer.chat_template
        w.add_chat_template(template.read_text())

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layer)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    if not tensors:
        raise GGUFExportError(f"{model_dir}: no *.safetensors weights")
    written = 0
    for hf_name in sorted(tensors):
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        gg_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg_name is None:
            raise GGUFExportError(f"{model_dir}: tensor {hf_name!r} has no llama GGUF name")
        data = tensors[hf_name].astype(np.float32)
        if hf_name.endswith("self_attn.q_proj.weight"):
            data = interleave_heads(data, n_head)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            data = interleave_heads(data, n_kv)
        if kind == "q8_0" and data.ndim > 1 and data.shape[-1] % Q8_0_BLOCK == 0:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(gg_name, gguf.quants.quantize(np.ascontiguousarray(data), q8), raw_dtype=q8)
            written += 1
            continue
        if kind in ("f16", "q8_0") and data.ndim > 1:  # a matrix Q8_0 cannot block stays F16
            data = data.astype(np.float16)
        w.add_tensor(gg_name, np.ascontiguousarray(data))
        written += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"tensors": written, "tokenizer_from": tokenizer_from, "gguf_package": gguf_version()}


def gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def _tokenizer(w: Any, model_dir: Path, cfg: Mapping[str, Any], source: Path | None) -> str:
    if source is not None:
        return _copy_tokenizer(w, source)
    return _tokenizer_json(w, model_dir, cfg)


def _copy_tokenizer(w: Any, source: Path) -> str:
    """Every ``tokenizer.*`` key of ``source``, with its type, as the original conversion wrote it."""
    import gguf

    r = gguf.GGUFReader(str(source))
    n = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub)
        n += 1
    if not n:
        raise GGUFExportError(f"{source}: no tokenizer.* keys to copy")
    return f"copied from {source.name} ({n} keys)"


def _tokenizer_json(w: Any, model_dir: Path, cfg: Mapping[str, Any]) -> str:
    """A byte-level BPE ``tokenizer.json`` as GGUF tokenizer keys (``gpt2`` model)."""
    import gguf

    tj = model_dir / "tokenizer.json"
    if not tj.exists():
        raise GGUFExportError(f"{model_dir}: no tokenizer.json and no source GGUF to copy a tokenizer from")
    t = json.loads(tj.read_text())
    from harness.models.gguf import PRE_TOKENIZERS

    model = t.get("model") or {}
    pre = t.get("pre_tokenizer") or {}
    # the HF pre-tokenizers llama.cpp has a name for (harness.models.gguf maps them the other way)
    pre_name = next((name for name, hf in PRE_TOKENIZERS.items() if hf == pre), None)
    if pre_name is None and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) \
            and not pre.get("add_prefix_space"):
        pre_name = "gpt-2"
    if model.get("type") != "BPE" or pre_name is None:
        raise GGUFExportError(f"{tj}: only byte-level BPE tokenizers whose pre-tokenizer llama.cpp names "
                              f"are written (this one: {model.get('type')}, {pre.get('type')}); serve "
                              f"the model's own GGUF (llamacpp:gguf=<path>)")
    vocab: dict[str, int] = dict(model["vocab"])
    added = {int(a["id"]): a for a in t.get("added_tokens", [])}
    for i, a in added.items():
        vocab[a["content"]] = i
    size = int(cfg["vocab_size"])
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        if i < size:
            tokens[i] = text
            types[i] = gguf.TokenType.NORMAL
    for i, a in added.items():
        if i < size:
            types[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_name)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if isinstance(cfg.get(key), int):
            add(int(cfg[key]))
    # The oracle's prompt ids never carry a BOS the HF tokenizer would not add: neither do these.
    w.add_add_bos_token(False)
    return f"written from tokenizer.json (gpt2 BPE, pre-tokenizer {pre_name!r})"
