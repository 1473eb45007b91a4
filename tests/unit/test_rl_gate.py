"""The RL weight-sync gate without an engine: its figures, judges, controls, name mapping, steps,
settings and routing (the engine path: tests/integration/test_rl_sync.py, opt-in)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from harness.kinds.rl import controls as ctl
from harness.kinds.rl import judge as jd
from harness.kinds.rl.routing import agreement, replay_sets
from harness.kinds.rl.run import Rollout, TrainerSide, engine_steps, plan_rollouts
from harness.kinds.rl.settings import RLSettings, parse
from harness.kinds.rl.trainer import load_trainer
from harness.kinds.rl.updates import Arrival, Place, apply_step, arrivals, easy_tensors, engine_view
from harness.suites import SuiteError, load_suite

BARS = {"token_mult_prob_error": 1.001, "gen_kl_error": 1e-5, "mean_abs_delta": 1e-4, "probs_pearson": 0.9999,
        "frac_over_ln2": 0.0}
S = RLSettings(steps=("checkpoint", "identity", "ordinary", "easy", "ordinary"), bars=BARS)


def _lp(n: int = 40, seed: int = 0) -> np.ndarray:
    return np.log(np.random.default_rng(seed).uniform(0.05, 0.95, n))


def test_metrics_of_equal_logprobs_are_the_ideal_values() -> None:
    r = _lp()
    m = jd.metrics([r], [r.copy()])
    assert m["token_mult_prob_error"] == 1.0 and m["gen_kl_error"] == 0.0 and m["k3_kl"] == 0.0
    assert m["rollout_probs_diff_max"] == 0.0 and m["frac_over_ln2"] == 0.0
    assert m["probs_pearson"] == pytest.approx(1.0)


def test_metrics_of_a_shift_follow_their_definitions() -> None:
    r = _lp()
    d = 0.1
    m = jd.metrics([r], [r - d])
    assert m["token_mult_prob_error"] == pytest.approx(math.exp(d))
    assert m["gen_kl_error"] == pytest.approx(math.exp(-d) - 1 + d)
    assert m["k3_kl"] == pytest.approx(math.exp(d) - 1 - d)
    assert m["mean_abs_delta"] == pytest.approx(d)
    assert m["rollout_probs_diff_mean"] == pytest.approx(float(np.mean(np.exp(r) * (1 - math.exp(-d)))))
    big = jd.metrics([r], [r - 1.0])
    assert big["frac_over_ln2"] == 1.0


def test_non_finite_tokens_are_counted_apart() -> None:
    r = _lp(5)
    t = r.copy()
    t[2] = -np.inf
    m = jd.metrics([r], [t])
    assert m["support_mismatch"] == 1 and m["tokens"] == 4
    v = jd.judge_step(1, "ordinary", m, S)
    assert v.status == "fail" and "-inf" in v.detail


def test_step_over_its_bar_fails_naming_the_figure() -> None:
    r = _lp()
    v = jd.judge_step(2, "ordinary", jd.metrics([r], [r - 0.01]), S)
    assert v.status == "fail" and "step 2 (ordinary)" in v.summary
    assert "token_mult_prob_error" in v.detail and "bar 1.001" in v.detail
    assert jd.judge_step(2, "ordinary", jd.metrics([r], [r + 1e-7]), S).status == "pass"


def test_growth_fails_under_every_step_bar() -> None:
    steps = [{jd.MAIN: 1e-6 * (1 + 2 * k)} for k in range(5)]  # 9x at step 4, each under the 1e-4 bar
    v = jd.judge_growth(steps, S)
    assert v.status == "fail" and "step 4" in v.summary and "9x" in v.summary
    assert jd.judge_growth([{jd.MAIN: 1e-6}] * 5, S).status == "pass"


def test_identity_needs_the_same_tokens_and_figures() -> None:
    m = jd.metrics([_lp()], [_lp() + 1e-7])
    assert jd.judge_identity(1, 0, m, dict(m), True, S).status == "pass"
    assert jd.judge_identity(1, 0, m, dict(m), False, S).status == "fail"
    moved = {**m, "gen_kl_error": m["gen_kl_error"] + 1e-6}
    v = jd.judge_identity(1, 0, moved, m, True, S)
    assert v.status == "fail" and "gen_kl_error" in v.summary


def _arrival(name: str, diff: float, same: bool | None = None, ck: str = "vacuous") -> Arrival:
    return Arrival(name, Place("model.layers.0.self_attn.qkv_proj.weight", 64, 128), diff, 0.5, "kernel", ck, same)


def test_weights_verdict_names_the_tensor_that_did_not_arrive() -> None:
    ok = [_arrival("model.layers.0.self_attn.q_proj.weight", 0.0)]
    assert jd.judge_weights(1, ok, S).status == "pass"
    bad = [*ok, _arrival("model.layers.0.self_attn.k_proj.weight", 0.02, same=True)]
    v = jd.judge_weights(3, bad, S)
    assert v.status == "fail" and "k_proj" in v.summary and "previous step's values" in v.summary
    assert v.evidence["vllm_checksums"]["vacuous"] == ["model.layers.0.self_attn.qkv_proj.weight"]


def test_version_must_be_the_one_set_and_advance() -> None:
    assert jd.judge_version(2, "2", "2", "1").status == "pass"
    assert jd.judge_version(2, "2", "1", "1").status == "fail"
    assert jd.judge_version(2, "2", "2", "2").status == "fail"


def test_every_in_memory_control_bites() -> None:
    r = [_lp(30, i) for i in range(3)]
    t = [x + 1e-7 for x in r]
    per = [jd.metrics(r, t)] * 5
    cs = (ctl.sync_controls(r, S) + ctl.identity_controls(per[0], S) + ctl.growth_controls(per, S)
          + ctl.version_controls() + ctl.weights_controls([_arrival("a.weight", 0.0)], S))
    assert cs and all(c.ok for c in cs), [c for c in cs if not c.ok]
    assert {c.expect for c in cs} == {"fail", "pass"}


SHAPES = {"model.layers.0.self_attn.q_proj.weight": (128, 128), "model.layers.0.self_attn.k_proj.weight": (64, 128),
          "model.layers.0.self_attn.v_proj.weight": (64, 128), "model.layers.0.mlp.gate_proj.weight": (384, 128),
          "model.layers.0.mlp.up_proj.weight": (384, 128), "model.norm.weight": (128,), "lm_head.weight": (512, 128),
          "model.layers.1.mlp.experts.2.gate_proj.weight": (96, 128),
          "model.layers.1.mlp.experts.2.up_proj.weight": (96, 128),
          "model.layers.1.mlp.experts.2.down_proj.weight": (128, 96)}


def test_engine_view_finds_fused_slices_and_experts() -> None:
    v = engine_view(SHAPES)
    assert v["model.layers.0.self_attn.k_proj.weight"] == Place("model.layers.0.self_attn.qkv_proj.weight", 128, 192)
    assert v["model.layers.0.self_attn.v_proj.weight"] == Place("model.layers.0.self_attn.qkv_proj.weight", 192, 256)
    assert v["model.layers.0.mlp.up_proj.weight"] == Place("model.layers.0.mlp.gate_up_proj.weight", 384, 768)
    assert v["model.layers.1.mlp.experts.2.up_proj.weight"] == Place("model.layers.1.mlp.experts.w13_weight", 96, 192, 2)
    assert v["model.layers.1.mlp.experts.2.down_proj.weight"] == Place("model.layers.1.mlp.experts.w2_weight", expert=2)
    assert v["lm_head.weight"] == Place("lm_head.weight")


def test_easy_tensors_tied_untied_and_moe() -> None:
    assert easy_tensors(SHAPES, tied=False)[:2] == ["lm_head.weight", "model.norm.weight"]
    names = {**SHAPES, "model.embed_tokens.weight": (512, 128)}
    easy = easy_tensors(names, tied=True)
    assert easy[0] == "model.embed_tokens.weight" and "model.layers.0.self_attn.k_proj.weight" in easy
    assert "model.layers.1.mlp.experts.2.up_proj.weight" in easy


def test_steps_are_seeded_and_identity_moves_nothing() -> None:
    import torch

    def fresh() -> dict:
        g = torch.Generator().manual_seed(0)
        return {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}

    a, b = fresh(), fresh()
    assert apply_step(a, "identity", 1, 7, 0.02, 0.05, False) == []
    assert all(torch.equal(a[k], b[k]) for k in a)
    moved = apply_step(a, "ordinary", 2, 7, 0.02, 0.05, False)
    apply_step(b, "ordinary", 2, 7, 0.02, 0.05, False)
    assert set(moved) == set(SHAPES) and all(torch.equal(a[k], b[k]) for k in a)
    c = fresh()
    easy = apply_step(c, "easy", 3, 7, 0.02, 0.05, False)
    assert set(easy) == set(easy_tensors(SHAPES, False))
    assert torch.equal(c["model.layers.0.self_attn.q_proj.weight"], fresh()["model.layers.0.self_attn.q_proj.weight"])


def test_rollouts_share_80_percent_and_identity_repeats_the_step_before() -> None:
    heads = [list(range(10, 80)), list(range(100, 170))]
    plans = plan_rollouts(S, heads, 512)
    for p in plans[1:]:
        for r, q in zip(p.rollouts, plans[p.index - 1].rollouts, strict=True):
            shared = sum(1 for x, y in zip(r.prompt_ids, q.prompt_ids, strict=True) if x == y)
            assert shared / len(r.prompt_ids) >= 0.8
    assert [r.prompt_ids for r in plans[1].rollouts] == [r.prompt_ids for r in plans[0].rollouts]
    assert [r.seed for r in plans[1].rollouts] == [r.seed for r in plans[0].rollouts]
    assert plans[1].reference == 0
    assert plans[2].rollouts[0].prompt_ids != plans[0].rollouts[0].prompt_ids


def test_planted_faults_change_only_what_they_say(tmp_path: Path) -> None:
    plans = plan_rollouts(S, [list(range(10, 80))], 512)
    side = TrainerSide([tmp_path / f"step-{k}" for k in range(5)])
    names = ["a.weight", "lm_head.weight"]
    clean = engine_steps(plans, side, names, None, "lm_head.weight")
    assert all(d["reset_prefix_cache"] for d in clean) and clean[0]["update"] is None
    assert all(d["update"]["names"] == names and d["update"]["apply"] for d in clean[1:])
    assert [d["reset_prefix_cache"] for d in engine_steps(plans, side, names, "no_reset", None)] == [True] + [False] * 4
    dropped = engine_steps(plans, side, names, "drop_tensor", "lm_head.weight")
    assert all(d["update"]["names"] == ["a.weight"] for d in dropped[1:])
    assert not any(d["update"]["apply"] for d in engine_steps(plans, side, names, "not_applied", None)[1:])


def test_arrivals_read_the_engine_layout_and_spot_a_stale_tensor(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from harness.engines.vllm.rl_taps import EMPTY_SHA256

    g = torch.Generator().manual_seed(1)
    old = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    new = {k: v * 1.01 for k, v in old.items()}
    save_file(old, str(tmp_path / "old.safetensors"))
    save_file(new, str(tmp_path / "new.safetensors"))
    view = engine_view(SHAPES)
    engine: dict[str, torch.Tensor] = {}
    for name, place in view.items():  # the engine's fused layout, lm_head left at the old values
        src = (old if name == "lm_head.weight" else new)[name]
        if place.start is None and place.expert is None:
            engine[place.param] = src
    engine["model.layers.0.self_attn.qkv_proj.weight"] = torch.cat([new[f"model.layers.0.self_attn.{p}_proj.weight"]
                                                                    for p in "qkv"])
    engine["model.layers.0.mlp.gate_up_proj.weight"] = torch.cat([new["model.layers.0.mlp.gate_proj.weight"],
                                                                  new["model.layers.0.mlp.up_proj.weight"]])
    w13 = torch.zeros(3, 192, 128)
    w13[2] = torch.cat([new["model.layers.1.mlp.experts.2.gate_proj.weight"],
                        new["model.layers.1.mlp.experts.2.up_proj.weight"]])
    w2 = torch.zeros(3, 128, 96)
    w2[2] = new["model.layers.1.mlp.experts.2.down_proj.weight"]
    engine.update({"model.layers.1.mlp.experts.w13_weight": w13, "model.layers.1.mlp.experts.w2_weight": w2})
    save_file(engine, str(tmp_path / "tap.safetensors"))
    sums = {"dp0:pp0:pcp0:tp0:model.layers.0.self_attn.qkv_proj.weight": EMPTY_SHA256,
            "dp0:pp0:pcp0:tp0:model.norm.weight": "not-the-hash"}
    arr = {a.name: a for a in arrivals(tmp_path / "new.safetensors", tmp_path / "old.safetensors",
                                       tmp_path / "tap.safetensors", {}, sums)}
    missed = [n for n, a in arr.items() if not a.arrived(1e-6)]
    assert missed == ["lm_head.weight"] and arr["lm_head.weight"].same_as_before is True
    assert arr["model.layers.0.self_attn.k_proj.weight"].checksum == "vacuous"
    assert arr["model.norm.weight"].checksum == "differs"


def test_routing_agreement_and_replays() -> None:
    engine = {"a": {"offset": 2, "layers": {"0": [[0, 1], [1, 2], [0, 3]], "1": [[2, 3], [2, 3], [2, 3]]}},
              "b": {"offset": 0, "layers": {"0": [[0, 2]] * 5, "1": [[1, 3]] * 5}}}
    trainer = {"a": {0: np.array([[9, 9], [9, 9], [1, 0], [1, 2], [3, 0], [5, 5]]), 1: np.array([[2, 3]] * 6)},
               "b": {0: np.array([[0, 2]] * 6), 1: np.array([[1, 3]] * 4 + [[0, 1]] * 2)}}
    got = agreement(engine, trainer)
    assert got["per_layer"] == {"0": 1.0, "1": 0.875}
    assert got["first_difference"] == {"layer": 1, "rollout": "b", "position": 4, "engine": [1, 3], "trainer": [0, 1]}
    rolls = [Rollout("a", (1, 2, 3), 1), Rollout("b", (1, 2), 2)]
    sets = replay_sets(rolls, [([1, 2, 3], [4, 5, 6]), ([1, 2], [3, 4, 5, 6])], engine)
    assert sets["r3"][0][0][:2].tolist() == [[-1, -1], [-1, -1]] and sets["r3"][0][0][2].tolist() == [0, 1]
    assert (sets["r3_zero"][1][1][:5] == 0).all() and (sets["r3_zero"][1][1][5] == -1).all()
    assert sets["r3_other"][0][1][2].tolist() == [1, 3]


SUITE = """name = "{name}"
version = 1
kind = "rl"
[sampling]
max_tokens = 8
logprobs = 0
[rl_sync]
steps = {steps}
shared_tokens = {shared}
tail_tokens = 16
[rl_sync.bars]
{bar} = 1e-3
[[cases]]
id = "a"
ids = {ids}
"""


def _suite(tmp_path: Path, **kw: object) -> Path:
    args = {"name": "rlx", "steps": '["checkpoint", "ordinary"]', "shared": 64, "bar": "gen_kl_error",
            "ids": str(list(range(4, 70)))} | kw
    p = tmp_path / f"{args['name']}.toml"
    p.write_text(SUITE.format(**args))
    return p


@pytest.mark.parametrize(("kw", "says"), [
    ({"steps": '["checkpoint", "sideways"]'}, "[rl_sync].steps: step 1 is 'sideways'"),
    ({"steps": '["ordinary"]'}, "must start with 'checkpoint'"),
    ({"shared": 32}, "shares 67% of each prompt"),
    ({"bar": "gen_kl"}, "gen_kl"),
    ({"ids": "[4, 5, 6]"}, "case 'a' holds 3 ids"),
])
def test_a_bad_table_is_refused_naming_file_and_key(tmp_path: Path, kw: dict, says: str) -> None:
    path = _suite(tmp_path, **kw)
    with pytest.raises(SuiteError) as e:
        parse(load_suite(path))
    assert str(path) in str(e.value) and says in str(e.value)


def test_the_committed_suites_parse() -> None:
    from harness.pipeline import kind_of
    from harness.workspace import Workspace

    for name in ("rl", "rl_small", "rl_bf16", "rl_bf16_calibrate"):
        suite = load_suite(Workspace.default().suites / f"{name}.toml")
        assert kind_of(suite).name == "rl"
        assert parse(suite).shared_share >= 0.8


def test_a_trainer_spec_is_checked_before_any_engine() -> None:
    assert load_trainer(None)[0] == "hf"
    assert load_trainer("harness.kinds.rl.trainer:hf_trainer")[0] == "harness.kinds.rl.trainer:hf_trainer"
    for bad, says in (("nocolon", "give 'hf'"), ("no_such_module_x:f", "cannot import"),
                      ("harness.kinds.rl.trainer:nothing", "no callable 'nothing'")):
        with pytest.raises(ValueError, match=says):
            load_trainer(bad)


def test_separation() -> None:
    from harness.commands.rl import separation

    assert separation(1e-6, 1e-4) == pytest.approx(100.0)
    assert separation(0.0, 1e-4) == math.inf


def test_a_planted_fault_counts_only_when_the_gate_fails_for_its_reason() -> None:
    from harness.api import Verdict

    sync1 = Verdict("step2", jd.SYNC, "fail", "step 2 (ordinary) FAIL: gen_kl_error 0.3 > bar 1e-05")
    sync0 = Verdict("step0", jd.SYNC, "fail", "step 0 (checkpoint) FAIL: gen_kl_error 0.01 > bar 1e-05")
    weights = Verdict("step2", jd.WEIGHTS, "fail", "rl_weights FAIL: 1/21 tensors did not arrive: lm_head.weight")
    version = Verdict("step2", jd.VERSION, "pass", "weight version 2")
    assert ctl.detection("no_reset", [sync0, sync1], None).status == "pass"
    assert ctl.detection("no_reset", [sync0], None).status == "fail"  # step 0 precedes every update
    assert ctl.detection("trainer_dtype", [sync0], None).status == "pass"
    assert ctl.detection("drop_tensor", [weights], "lm_head.weight").status == "pass"
    assert ctl.detection("drop_tensor", [weights], "model.norm.weight").status == "fail"
    assert ctl.detection("not_applied", [weights, version], None).status == "pass"
    cs = ctl.detection_controls("no_reset", [sync0, sync1], None)
    assert cs and all(c.ok for c in cs)


def test_routing_replay_in_the_trainer_is_exact_for_its_own_routes(tmp_path: Path) -> None:
    """R3 in the trainer: replaying the routes it chose itself changes no logit beyond float
    reassociation (an expert's tokens are gathered in another order); all-zero routes do."""
    from harness.kinds.rl.trainer import hf_score
    from harness.workspace import Workspace

    folder = Workspace.default().models / "tiny-qwen3-moe"
    seqs = [(list(range(4, 40)), [5, 6, 7, 8])]
    logits, routes = hf_score(folder, seqs, "float32")
    assert sorted(routes[0]) == [0, 1] and routes[0][0].shape == (40, 2)
    again, _ = hf_score(folder, seqs, "float32", [routes[0]])
    assert np.allclose(again[0], logits[0], atol=1e-4, rtol=0)
    zero, _ = hf_score(folder, seqs, "float32", [{k: np.zeros_like(v) for k, v in routes[0].items()}])
    assert not np.allclose(zero[0], logits[0])
    partial = {k: np.where(np.arange(len(v))[:, None] < 20, -1, v) for k, v in routes[0].items()}
    kept, _ = hf_score(folder, seqs, "float32", [partial])  # -1: the trainer's own choice
    assert np.allclose(kept[0], logits[0], atol=1e-4, rtol=0)


def test_the_cpu_repack_redoes_only_what_an_update_reloaded() -> None:
    """vllm:repack=cpu: a MoE layer whose stacks the update rewrote is packed again; one the update
    left alone still holds its packed values and is not packed twice; a tied LM head is re-dispatched
    from the embedding it shares, an untied one is not."""
    import torch

    from harness.engines.vllm.rl_backend import packed_experts, repack_cpu

    class Experts:
        def __init__(self) -> None:
            self.packed: list[torch.nn.Module] = []

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            self.packed.append(layer)

    class Method:
        def __init__(self) -> None:
            self.moe_kernel = type("Kernel", (), {"fused_experts": Experts()})()
            self.redone: list[torch.nn.Module] = []

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            self.redone.append(layer)

    class MoE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w13_weight = torch.nn.Parameter(torch.randn(2, 4, 3), requires_grad=False)
            self.w2_weight = torch.nn.Parameter(torch.randn(2, 3, 2), requires_grad=False)
            self.quant_method = Method()

    VocabParallelEmbedding = type("VocabParallelEmbedding", (torch.nn.Module,), {})
    ParallelLMHead = type("ParallelLMHead", (torch.nn.Module,), {})
    model = torch.nn.Module()
    model.moved, model.kept = MoE(), MoE()
    model.embed = VocabParallelEmbedding()
    model.embed.weight = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    model.tied, model.untied = ParallelLMHead(), ParallelLMHead()
    model.tied.weight = model.embed.weight
    model.untied.weight = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    for head in (model.tied, model.untied):
        head.quant_method = Method()
    before = packed_experts(model)
    assert set(before) == {"moved", "kept"}
    with torch.no_grad():
        model.moved.w13_weight.add_(1.0)  # the update wrote checkpoint-layout values here only
    assert repack_cpu(model, before, on_cpu=False) == []
    done = repack_cpu(model, before, on_cpu=True)
    assert done == ["moe_experts:moved", "tied_lm_head:tied"]
    assert model.moved.quant_method.moe_kernel.fused_experts.packed == [model.moved]
    assert model.kept.quant_method.moe_kernel.fused_experts.packed == []
    assert model.tied.quant_method.redone == [model.tied] and model.untied.quant_method.redone == []


def test_version_spans_name_the_tokens_another_version_sampled() -> None:
    ok = jd.judge_version(2, "2", "2", "1", {"s2-c0": (3, [{"version": "2", "start": 0, "end": 3}])})
    assert ok.status == "pass" and "every token of 1 rollouts" in ok.summary
    stale = jd.judge_version(2, "2", "2", "1", {"s2-c0": (3, [{"version": "1", "start": 0, "end": 3}])})
    assert stale.status == "fail" and "rollout s2-c0: tokens 0-3 by version '1'" in stale.summary
    short = jd.judge_version(2, "2", "2", "1", {"s2-c0": (3, [{"version": "2", "start": 0, "end": 2}])})
    assert short.status == "fail" and "cover 2 of its 3 tokens" in short.summary
    assert jd.judge_version(2, "2", "2", "1", {"s2-c0": (3, None)}).status == "pass"


def test_without_vllm_checksums_the_tap_is_the_evidence_and_still_bites() -> None:
    from harness.engines.vllm.rl_taps import vllm_checksums

    class Old:  # a release without compute_weight_checksums (0.31.0)
        pass

    class New:
        def compute_weight_checksums(self) -> dict[str, str]:
            return {"w": "ab"}

    assert vllm_checksums(Old()) is None and vllm_checksums(New()) == {"w": "ab"}
    ok = [_arrival("model.layers.0.self_attn.q_proj.weight", 0.0, ck="absent")]
    v = jd.judge_weights(1, ok, S)
    assert v.status == "pass" and "no per-tensor checksums" in v.summary
    assert v.evidence["vllm_checksums"]["absent"] == 1
    bad = [*ok, _arrival("model.layers.0.self_attn.k_proj.weight", 0.02, same=True, ck="absent")]
    assert jd.judge_weights(2, bad, S).status == "fail"


def test_a_release_candidate_is_named_before_any_engine() -> None:
    from harness.kinds.rl.kind import release_venv
    from harness.pin import oracle_pin

    assert release_venv("vllm") is None
    assert release_venv(f"vllm@{oracle_pin().version}") is None  # the pin: the project's own venv
    with pytest.raises(SuiteError, match="CANDIDATE=vllm@latest"):
        release_venv("vllm@latest")
