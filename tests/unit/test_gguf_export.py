"""The GGUF the harness writes holds the checkpoint's weights exactly (F32), in llama.cpp's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from harness.engines.launch.gguf_export import GGUFExportError, export_gguf, interleave_heads
from harness.models import resolve_model
from harness.workspace import Workspace

gguf = pytest.importorskip("gguf")


def uninterleave(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of interleave_heads, written independently: llama.cpp pair order -> HF halves."""
    d = w.shape[0] // n_head
    return np.concatenate([np.concatenate([w[h * d:(h + 1) * d][0::2], w[h * d:(h + 1) * d][1::2]])
                           for h in range(n_head)])


def test_interleave_heads_pairs_the_two_halves_of_each_head() -> None:
    w = np.arange(8)[:, None].astype(np.float32)  # 2 heads of 4 rows: halves (0,1|2,3), (4,5|6,7)
    assert interleave_heads(w, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 5)).astype(np.float32)
    assert np.array_equal(uninterleave(interleave_heads(x, 3), 3), x)


def test_the_f32_gguf_holds_the_checkpoints_weights_bit_for_bit(workspace: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", workspace)
    g = export_gguf(Path(model.path), "f32", tmp_path, model.name, model.digest)
    assert g.facts["tensors"] == 21 and "'gpt-2'" in g.facts["tokenizer_from"]
    again = export_gguf(Path(model.path), "f32", tmp_path, model.name, model.digest)
    assert again.facts["sha256"] == g.facts["sha256"]  # reused, not rewritten
    r = gguf.GGUFReader(str(g.path))
    got = {t.name: np.asarray(t.data) for t in r.tensors}
    hf = load_file(str(Path(model.path) / "model.safetensors"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert len(got) == len(hf)
    for hf_name, want in hf.items():
        have = got[names.get_name(hf_name, try_suffixes=(".weight",))].reshape(want.shape)
        if "q_proj" in hf_name:
            have = uninterleave(have, 2)
        elif "k_proj" in hf_name:
            have = uninterleave(have, 1)
        assert have.dtype == np.float32 and np.array_equal(have, want), hf_name
    fields = r.fields
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert len(fields["tokenizer.ggml.tokens"].contents()) == 512


def test_f16_keeps_norms_in_f32(workspace: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", workspace)
    g = export_gguf(Path(model.path), "f16", tmp_path, model.name, model.digest)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(g.path)).tensors}
    assert types["blk.0.attn_q.weight"] == "F16" and types["blk.0.attn_norm.weight"] == "F32"


def test_what_cannot_be_written_is_refused_by_name(workspace: Workspace, tmp_path: Path) -> None:
    import json
    import shutil

    model = resolve_model("tiny-llama", workspace)
    other = tmp_path / "m"
    shutil.copytree(model.path, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "yarn"}}))
    with pytest.raises(GGUFExportError, match="rope scaling 'yarn'"):
        export_gguf(other, "f32", tmp_path / "out", "m", "0" * 12)
    (other / "config.json").write_text(json.dumps({**cfg, "architectures": ["GemmaForCausalLM"]}))
    with pytest.raises(GGUFExportError, match="LlamaForCausalLM only"):
        export_gguf(other, "f32", tmp_path / "out", "m", "1" * 12)
    with pytest.raises(GGUFExportError, match="writes f32, f16"):
        export_gguf(other, "q8", tmp_path / "out", "m", "2" * 12)
    assert not list((tmp_path / "out").glob("*.gguf")), "nothing half-written"
