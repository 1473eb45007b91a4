"""The named-model registry: what ``--model NAME`` accepts, what ``harness list`` shows, and what the
architecture facts say about each family."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.models import MODELS, ModelBuildError, builtin_models, known_digest, resolve_model
from harness.models.arch import ModelLimits, attention_of, experts_of, model_facts
from harness.models.digest import content_digest
from harness.models.tiny import SPECS
from harness.registry import UnknownName
from harness.workspace import REPO_ROOT, Workspace


def test_every_tiny_family_and_smollm2_are_registered() -> None:
    assert set(SPECS) | {"smollm2-135m"} == set(MODELS.names())
    for name in SPECS:
        assert MODELS.entry(name).meta.source == "committed"
        assert (REPO_ROOT / "models" / name / "config.json").exists()
    archs = {e.meta.architecture for e in MODELS.entries()}
    assert archs == {"LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "GPT2LMHeadModel",
                     "Qwen3MoeForCausalLM"}


def test_an_unknown_model_is_answered_with_the_closest_names(workspace: Workspace) -> None:
    with pytest.raises(UnknownName) as e:
        resolve_model("smolm2-135m", workspace)
    assert "Did you mean 'smollm2-135m'" in str(e.value)
    with pytest.raises(UnknownName, match="Did you mean 'tiny-qwen3'"):
        resolve_model("tiny-qwen", workspace)


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="model 'tiny-llama' is registered twice"):
        MODELS.register("tiny-llama")(lambda ws: Path())


def test_a_committed_model_resolves_to_its_folder_and_content_digest(workspace: Workspace) -> None:
    m = resolve_model("tiny-gemma3", workspace)
    assert Path(m.path) == workspace.models / "tiny-gemma3"
    assert m.digest == content_digest(workspace.models / "tiny-gemma3") == known_digest("tiny-gemma3", workspace)


def test_a_missing_committed_model_says_how_to_restore_it(workspace: Workspace) -> None:
    shutil.rmtree(workspace.models / "tiny-qwen3")
    with pytest.raises(ModelBuildError, match=r"python -m harness.models.tiny tiny-qwen3 --out models/tiny-qwen3"):
        resolve_model("tiny-qwen3", workspace)


def test_a_built_models_digest_is_known_without_building_it(workspace: Workspace,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARNESS_MODEL_CACHE", raising=False)
    assert known_digest("smollm2-135m", workspace) == MODELS.entry("smollm2-135m").meta.digest
    assert not workspace.model_cache.exists(), "knowing the digest must not build anything"


def test_an_unregistered_checkpoint_under_models_still_resolves(workspace: Workspace) -> None:
    shutil.copytree(workspace.models / "tiny-llama", workspace.models / "my-model")
    assert "my-model" in builtin_models(workspace)
    assert resolve_model("my-model", workspace).digest == content_digest(workspace.models / "tiny-llama")


def test_harness_list_shows_every_named_model(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for e in MODELS.entries():
        assert e.name in out and e.meta.architecture in out


@pytest.mark.parametrize("name, attention, extra", [
    ("tiny-llama", "full attention, MQA 2q/1kv", {}),
    ("tiny-qwen3", "full attention, MQA 2q/1kv", {"block": "RMSNorm, q/k norm, gated MLP (silu), rotary"}),
    ("tiny-gemma3", "full + sliding-window attention (window 64; 2 sliding, 1 full), MQA 2q/1kv", {}),
    ("tiny-gpt2", "full attention, MHA", {"block": "LayerNorm, MLP (gelu_new), learned positions"}),
    ("tiny-qwen3-moe", "full attention, MQA 2q/1kv", {"experts": "MoE 4 experts, top-2"}),
])
def test_model_facts_of_each_family(name: str, attention: str, extra: dict[str, str]) -> None:
    facts = model_facts(REPO_ROOT / "models" / name)
    assert facts["architecture"] == MODELS.entry(name).meta.architecture
    assert facts["attention"] == attention
    assert ("experts" in facts) == ("experts" in extra)
    for k, v in extra.items():
        assert facts[k] == v


def test_attention_of_real_configs() -> None:
    smollm2 = {"num_attention_heads": 9, "num_key_value_heads": 3}
    assert attention_of(smollm2) == "full attention, GQA 9q/3kv"
    mistral = {"num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096}
    assert attention_of(mistral) == "sliding-window attention (window 4096), GQA 32q/8kv"
    qwen3 = {"num_attention_heads": 16, "num_key_value_heads": 8, "sliding_window": 4096,
             "use_sliding_window": False, "layer_types": ["full_attention"] * 4}
    assert attention_of(qwen3) == "full attention, GQA 16q/8kv"
    gemma3 = {"num_attention_heads": 8, "num_key_value_heads": 4, "sliding_window": 1024,
              "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    assert attention_of({"text_config": gemma3}).startswith(
        "full + sliding-window attention (window 1024; 5 sliding, 1 full)")
    assert experts_of({"num_local_experts": 8, "num_experts_per_tok": 2}) == "MoE 8 experts, top-2"
    assert experts_of({"num_experts": 1}) == ""


def test_limits_follow_each_familys_own_keys(tmp_path: Path) -> None:
    assert ModelLimits.of(REPO_ROOT / "models" / "tiny-gpt2") == ModelLimits(512, 2048)  # n_positions
    assert ModelLimits.of(REPO_ROOT / "models" / "tiny-llama") == ModelLimits(512, 4096)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 49152, "max_position_embeddings": 8192}))
    assert ModelLimits.of(tmp_path) == ModelLimits(49152, 4096)  # the harness runs vLLM at <= 4096
    assert ModelLimits.of(tmp_path / "nowhere") == ModelLimits(None, 2048)
