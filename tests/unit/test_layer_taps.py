"""Per-layer tensors from engines, without vLLM: transformers' taps against a planted copy in every
tiny family, the cmd protocol's tensors request, and the weights= option's refusals."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from harness.abilities import TensorSource
from harness.api import EngineFailed, EngineRefused
from harness.engines import make_runner
from harness.engines.launch.layer_taps import FAMILIES, family_at, tensor_names
from harness.kinds.localize.plant import PlantError, plant
from harness.kinds.localize.profile import profile
from harness.models import resolve_model
from harness.workspace import Workspace

SEQ = list(range(5, 45))


def layers_of(spec: str, model_name: str, ws: Workspace, seq: list[int] = SEQ) -> dict[str, np.ndarray]:
    runner = make_runner(spec, resolve_model(model_name, ws))
    assert isinstance(runner, TensorSource) and runner.tensor_ability().layers
    runner.start()
    try:
        return runner.capture_layers({"s": seq})["s"]
    finally:
        runner.close()


@pytest.fixture(scope="module")
def ws() -> Workspace:
    return Workspace.default()


@pytest.fixture(scope="module")
def hf_taps(ws: Workspace) -> Callable[[str], dict[str, np.ndarray]]:
    """transformers' taps of an unperturbed tiny model on SEQ, taken once per model for the module
    (every test reads them; none writes them)."""
    seen: dict[str, dict[str, np.ndarray]] = {}

    def taps(model_name: str) -> dict[str, np.ndarray]:
        if model_name not in seen:
            seen[model_name] = layers_of("hf", model_name, ws)
            for v in seen[model_name].values():
                v.setflags(write=False)
        return seen[model_name]

    return taps


def test_every_family_in_the_table_names_its_tensors_in_model_order(ws: Workspace, tmp_path: Path,
                                                                    hf_taps: Callable[[str], dict]) -> None:
    for name, moe in (("tiny-llama", ""), ("tiny-gpt2", ""), ("tiny-gemma3", ""), ("tiny-qwen3-moe", "moe")):
        t = hf_taps(name)
        n = json.loads((ws.models / name / "config.json").read_text())
        layers = n.get("num_hidden_layers") or n.get("n_layer")
        want = tensor_names(layers, set(range(layers)) if moe else set())
        assert list(t) == want, name
        assert all(v.shape[0] == len(SEQ) and v.dtype == np.float32 for v in t.values())
    assert family_at(str(ws.models / "tiny-llama")) is FAMILIES["llama"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    why = family_at(str(tmp_path))
    assert isinstance(why, str) and "model_type 'mamba' is not in the sub-block table" in why


@pytest.mark.parametrize("model_name,sub,layer", [
    ("tiny-llama", "mlp", 0), ("tiny-llama", "mlp", 1), ("tiny-llama", "attn", 0), ("tiny-llama", "attn", 1),
    ("tiny-qwen3", "mlp", 1), ("tiny-gemma3", "attn", 2), ("tiny-gpt2", "mlp", 1), ("tiny-gpt2", "attn", 0),
    ("tiny-qwen3-moe", "moe", 1)])
def test_a_planted_weight_is_localized_to_its_layer_and_sub_block(model_name: str, sub: str, layer: int,
                                                                  ws: Workspace, tmp_path: Path,
                                                                  hf_taps: Callable[[str], dict]) -> None:
    """transformers on both sides (the oracle's role played by the unperturbed model): a relative
    1e-2 change of one weight parts the engines exactly at that layer's sub-block, under the bar."""
    got = plant(resolve_model(model_name, ws), tmp_path / "copy", layer=layer, sub=sub, relative=1e-2)
    assert json.loads((tmp_path / "copy" / "PLANTED.json").read_text())["weight"] == got.weight
    ref = hf_taps(model_name)
    cand = layers_of(f"hf:weights={tmp_path / 'copy'}", model_name, ws)
    p = profile("s", ref, cand, len(SEQ), len(SEQ) - 1)
    assert p.parts_at is not None and p.parts_at.name == f"layer.{layer}.{sub}", p.line()
    assert p.before(p.parts_at) == 0.0  # the same engine and weights before it: bit for bit


@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-gpt2", "tiny-qwen3-moe"])
def test_a_second_load_of_the_same_weights_parts_nowhere(model_name: str, ws: Workspace,
                                                         hf_taps: Callable[[str], dict]) -> None:
    """The control of the test above: a fresh load of the unperturbed weights gives the same taps."""
    same = profile("s", hf_taps(model_name), layers_of("hf", model_name, ws), len(SEQ), len(SEQ) - 1)
    assert same.parts_at is None and "no sub-block parts" in same.line()


def test_planting_refuses_what_it_cannot_do(ws: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", ws)
    with pytest.raises(PlantError, match="layers 0..1"):
        plant(model, tmp_path / "a", layer=2)
    with pytest.raises(PlantError, match="no such tensor"):
        plant(model, tmp_path / "b", weight="model.layers.0.mlp.nothing.weight")
    with pytest.raises(PlantError, match="has mlp, attn"):
        plant(model, tmp_path / "c", layer=0, sub="moe")
    plant(model, tmp_path / "d", layer=0)
    with pytest.raises(PlantError, match="exists"):
        plant(model, tmp_path / "d", layer=0)
    with pytest.raises(PlantError, match="must be >= 0"):
        plant(model, tmp_path / "e", layer=0, relative=-1)
    assert plant(model, tmp_path / "f", layer=0, relative=0).digest == model.digest  # the control copy


def _copy(ws: Workspace, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(ws.models / "tiny-llama", dst)
    return dst


def test_weights_of_another_architecture_or_tokenizer_are_refused_naming_the_field(
        ws: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", ws)
    ckpt = _copy(ws, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 256, "torch_dtype": "bfloat16"}))
    for spec in (f"hf:weights={ckpt}", f"vllm:weights={ckpt}"):
        with pytest.raises(EngineRefused, match="config.json field intermediate_size is 256 in the weights, "
                                                "384 in the model"):
            make_runner(spec, model)
    (ckpt / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16"}))  # free to differ
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    first = next(iter(tok["model"]["vocab"]))
    tok["model"]["vocab"][first] += 1000
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(EngineRefused, match=r"not the tokenizer of tiny-llama: tokenizer.json field model\.vocab"):
        make_runner(f"hf:weights={ckpt}", model)
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(EngineRefused, match="no tokenizer.json beside the weights"):
        make_runner(f"hf:weights={ckpt}", model)


def test_the_weights_digest_is_in_the_candidates_settings(ws: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", ws)
    got = plant(model, tmp_path / "copy", layer=1, relative=1e-2)
    for spec in (f"hf:weights={got.path}", f"vllm:weights={got.path}"):
        info = make_runner(spec, model).info()
        assert info.settings["weights"] == {"path": str(got.path), "digest": got.digest}
        assert got.digest != model.digest


def test_the_cmd_protocol_answers_tensors_or_is_refused_with_its_answer(ws: Workspace, tmp_path: Path,
                                                                        hf_taps: Callable[[str], dict]) -> None:
    model = resolve_model("tiny-llama", ws)
    here = Path(__file__).resolve().parents[2]
    ref = hf_taps("tiny-llama")
    t = layers_of(f"cmd:{sys.executable} {here / 'examples' / 'cmd_engine.py'} {{model}}", "tiny-llama", ws)
    p = profile("s", ref, t, len(SEQ), len(SEQ) - 1)
    assert [s.name for s in p.steps] == list(ref) and p.parts_at is None and not p.missing
    # an .npz file in the folder the request names
    npz = tmp_path / "npz.py"
    npz.write_text("import sys, json, os, numpy as np\n"
                   "for line in sys.stdin:\n"
                   "    q = json.loads(line); n = len(q['tensors']['ids'])\n"
                   "    np.savez(os.path.join(q['tensors']['dir'], q['id'] + '.npz'), logits=np.zeros((n, 4)))\n"
                   "    print(json.dumps({'id': q['id'], 'tensors': q['id'] + '.npz'}))\n")
    got = make_runner(f"cmd:{sys.executable} {npz}", model).capture_layers({"s": [1, 2, 3]})  # type: ignore[attr-defined]
    assert got["s"]["logits"].shape == (3, 4)
    plain = tmp_path / "plain.py"
    plain.write_text("import sys, json\nfor line in sys.stdin:\n"
                     "    print(json.dumps({'id': json.loads(line)['id'], 'error': 'no tensors here'}))\n")
    with pytest.raises(EngineRefused, match="does not answer tensors requests .* no tensors here"):
        make_runner(f"cmd:{sys.executable} {plain}", model).capture_layers({"s": [1, 2]})  # type: ignore[attr-defined]
    short = tmp_path / "short.py"
    short.write_text("import sys, json\nfor line in sys.stdin:\n"
                     "    print(json.dumps({'id': json.loads(line)['id'], 'tensors': {'logits': [[0.0]]}}))\n")
    with pytest.raises(EngineFailed, match=r"tensor 'logits' has shape \[1, 1\], expected \[2, width\]"):
        make_runner(f"cmd:{sys.executable} {short}", model).capture_layers({"s": [1, 2]})  # type: ignore[attr-defined]


def test_servers_declare_why_they_expose_no_tensors(ws: Workspace) -> None:
    model = resolve_model("tiny-llama", ws)
    for spec, said in (("openai:http://127.0.0.1:9", "OpenAI-compatible server"),
                       ("vllm-server", "vLLM server"), ("llamacpp", "llama.cpp")):
        runner = make_runner(spec, model)
        assert isinstance(runner, TensorSource)
        ability = runner.tensor_ability()
        assert not ability.layers and said in ability.reason("layers")
        with pytest.raises(EngineRefused, match="never its hidden states"):
            runner.capture_layers({"s": [1]})
    ability = make_runner("hf:kv=quanto-int4", model).tensor_ability()  # type: ignore[attr-defined]
    assert ability.continuation and not ability.layers and "one token per step" in ability.reason("layers")
