"""The RL gate's bars per model: the suite tables, and the rule that sets them from a model's own
step-0 draws (harness/kinds/rl/calibrate.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.kinds.rl import judge as jd
from harness.kinds.rl.calibrate import MARGIN, calibrated_bars, distance, draw_figures, figure, toml_table
from harness.kinds.rl.settings import BAR_KEYS, parse, verdict_names
from harness.suites import SuiteError, load_suite
from harness.tomlcheck import load_toml

HEAD = """name = "rlb"
version = 1
kind = "rl"
[sampling]
max_tokens = 8
logprobs = 0
[rl_sync]
steps = ["checkpoint", "ordinary"]
draws = {draws}
{tables}
"""
CASE = """[[cases]]
id = "{id}"
ids = {ids}
"""


def _suite(tmp_path: Path, tables: str, draws: int = 1, cases: int = 1) -> Path:
    text = HEAD.format(draws=draws, tables=tables) + "".join(
        CASE.format(id=f"c{i}", ids=list(range(4 + i, 70 + i))) for i in range(cases)
    )
    p = tmp_path / "rlb.toml"
    p.write_text(text)
    return p


def test_a_model_gets_its_own_bars_over_the_common_ones(tmp_path: Path) -> None:
    s = parse(load_suite(_suite(tmp_path, """[rl_sync.bars]
gen_kl_error = 1e-3
k3_kl = 1e-3
[rl_sync.model_bars."tiny-llama"]
gen_kl_error = 5e-3
""")))
    mine = s.for_model("tiny-llama")
    assert mine is not None and mine.bars == {"gen_kl_error": 5e-3, "k3_kl": 1e-3}
    assert mine.bars_from == "model_bars.tiny-llama" and not mine.model_bars
    other = s.for_model("smollm2-135m")
    assert other is not None and other.bars == {"gen_kl_error": 1e-3, "k3_kl": 1e-3} and other.bars_from == "bars"


def test_bars_only_per_model_refuse_a_model_without_its_own(tmp_path: Path) -> None:
    s = parse(load_suite(_suite(tmp_path, """[rl_sync.model_bars."tiny-llama"]
gen_kl_error = 5e-3
""")))
    assert s.for_model("smollm2-135m") is None
    assert s.for_model("tiny-llama") is not None


@pytest.mark.parametrize(("tables", "draws", "cases", "says"), [
    ('[rl_sync.model_bars."m"]\ngen_kl = 1e-3\n', 1, 1, "gen_kl"),
    ('[rl_sync.model_bars."m"]\ngen_kl_error = -1\n', 1, 1, "[rl_sync.model_bars.m].gen_kl_error"),
    ('[rl_sync.model_bars."m"]\n', 1, 1, "names no bar"),
    ("[rl_sync.bars]\ngen_kl_error = 1e-3\n", 3, 4, "4 cases do not split into 3 draws"),
])
def test_a_bad_bar_table_or_draws_is_named(tmp_path: Path, tables: str, draws: int, cases: int, says: str) -> None:
    path = _suite(tmp_path, tables, draws, cases)
    with pytest.raises(SuiteError) as e:
        parse(load_suite(path))
    assert str(path) in str(e.value) and says in str(e.value)


def test_the_rule_is_the_margin_over_the_worst_draw_rounded_up() -> None:
    draws = [
        {"token_mult_prob_error": 1.031, "gen_kl_error": 1.24e-3, "rollout_probs_diff_mean": 1.2e-2,
         "rollout_probs_diff_max": 0.05, "probs_pearson": 0.9976, "k3_kl": 1.2e-3, "frac_over_ln2": 0.0,
         "mean_abs_delta": 2.9e-2},
        {"token_mult_prob_error": 1.020, "gen_kl_error": 1.31e-3, "rollout_probs_diff_mean": 1.0e-2,
         "rollout_probs_diff_max": 0.06, "probs_pearson": 0.9981, "k3_kl": 1.3e-3, "frac_over_ln2": 0.01,
         "mean_abs_delta": 2.5e-2, "tokens": 95, "support_mismatch": 1},
        {"token_mult_prob_error": 1.025, "gen_kl_error": 1.0e-3, "rollout_probs_diff_mean": 1.1e-2,
         "rollout_probs_diff_max": 0.04, "probs_pearson": 0.9990, "k3_kl": 1.0e-3, "frac_over_ln2": 0.0,
         "mean_abs_delta": 2.7e-2},
    ]
    bars = calibrated_bars(draws)
    assert set(bars) == set(BAR_KEYS)
    assert bars["token_mult_prob_error"] == pytest.approx(1.093)  # 1 + 3 x 0.031
    assert bars["gen_kl_error"] == pytest.approx(4.0e-3)  # 3 x 1.31e-3 = 3.93e-3, rounded up
    assert bars["probs_pearson"] == pytest.approx(1 - 7.2e-3)  # 3 x (1 - 0.9976)
    assert bars["frac_over_ln2"] == pytest.approx(0.03)
    assert bars["frac_masked"] == pytest.approx(0.032)  # 3 x 1/96, from a draw's counts
    for key in BAR_KEYS:  # every draw is under its bar, by at least the margin less the rounding
        worst = max(distance(key, figure(d, key)) for d in draws)
        assert distance(key, bars[key]) >= MARGIN * worst * (1 - 1e-12)
        assert distance(key, bars[key]) <= MARGIN * worst * 1.1 + 1e-15
    with pytest.raises(ValueError, match="at least 3"):
        calibrated_bars(draws[:2])
    text = toml_table("tiny-llama", bars, draws, "record x")
    assert text.startswith('[rl_sync.model_bars."tiny-llama"]') and "1.031, 1.02, 1.025" in text


def test_draws_are_the_cases_cut_in_order() -> None:
    rng = np.random.default_rng(0)
    r = [np.log(rng.uniform(0.1, 0.9, 6)) for _ in range(6)]
    t = [x + (0.01 * (i // 2)) for i, x in enumerate(r)]  # draw j moved by 0.01 j nats
    figs = draw_figures(r, t, 3)
    assert [round(f["mean_abs_delta"], 9) for f in figs] == [0.0, 0.01, 0.02]
    assert figs[1] == jd.metrics(r[2:4], t[2:4])
    with pytest.raises(ValueError, match="do not split"):
        draw_figures(r, t, 4)



def test_bars_from_a_record_need_its_draws_and_a_sane_step_0(tmp_path: Path) -> None:
    import json

    from harness.cli import main

    fig = {k: 0.001 for k in BAR_KEYS} | {"token_mult_prob_error": 1.01, "probs_pearson": 0.999}
    rec = {"model": {"name": "tiny-llama"}, "verdicts": [{"comparator": "rl_sync", "case_id": "step0",
           "status": "pass", "summary": "ok"}], "extra": {"rl": {"calibration": {"draws": [fig] * 3}}}}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(rec))
    assert main(["rl", "--bars-from", str(path)]) == 0
    rec["verdicts"][0] |= {"status": "fail", "summary": "rl_sync FAIL: token_mult_prob_error 3.2"}
    path.write_text(json.dumps(rec))
    assert main(["rl", "--bars-from", str(path)]) == 2
    del rec["extra"]["rl"]["calibration"]
    path.write_text(json.dumps(rec))
    assert main(["rl", "--bars-from", str(path)]) == 2


def test_the_committed_bf16_bars_follow_the_rule_from_their_calibration_records() -> None:
    """Each model's bars in suite rl_bf16 are what the rule gives from the draws its calibration
    record measured (the record named in the suite), and a bar is never set without one."""
    import json

    from harness.kinds.rl.calibrate import bars_from_record
    from harness.workspace import Workspace

    ws = Workspace.default()
    raw = load_toml(ws.suites / "rl_bf16.toml")
    s = parse(load_suite(ws.suites / "rl_bf16.toml"))
    assert s.model_bars and not s.bars
    assert set(verdict_names(raw)) >= {f"rl.{k}" for k in BAR_KEYS}
    for model, bars in s.model_bars.items():
        found = sorted((ws.records / model / "rl_bf16_calibrate").glob("*.json"))
        assert found, f"no calibration record for {model}"
        name, want, draws = bars_from_record(json.loads(found[-1].read_text()))
        assert name == model and len(draws) >= 3
        assert bars == pytest.approx(want), model


def test_a_token_at_the_top_p_edge_is_judged_by_frac_masked_where_the_suite_bars_it() -> None:
    """In bfloat16 the nucleus's edge can fall on either side of a sampled token: one side gives it
    -inf. Without a frac_masked bar (the float32 lane) one such token fails the step; with one, the
    share is judged against it."""
    from dataclasses import replace

    from harness.kinds.rl.settings import RLSettings

    r = [np.log(np.full(95, 0.5))]
    t = [np.log(np.full(95, 0.5))]
    r[0][3] = np.log(0.01)
    t[0][3] = -np.inf  # the trainer's top-p mask excludes it
    m = jd.metrics(r, t)
    assert m["support_mismatch"] == 1 and m["tokens"] == 94 and m["frac_masked"] == pytest.approx(1 / 95)
    base = RLSettings(steps=("checkpoint",))
    plain = replace(base, bars={"mean_abs_delta": 1e-4})
    v = jd.judge_step(0, "checkpoint", m, plain)
    assert v.status == "fail" and "1 tokens one side gives -inf" in v.summary
    v = jd.judge_step(0, "checkpoint", m, replace(base, bars={"mean_abs_delta": 1e-4, "frac_masked": 0.032}))
    assert v.status == "pass", v.summary
    v = jd.judge_step(0, "checkpoint", m, replace(base, bars={"mean_abs_delta": 1e-4, "frac_masked": 0.0}))
    assert v.status == "fail" and "frac_masked 0.01053 > bar 0" in v.summary


def test_the_planted_copy_moves_every_barred_figure_frac_masked_included() -> None:
    """The step controls' planted copy must fail every figure the suite bars: a ±1 nat shift alone
    leaves frac_masked at 0, so the copy also masks tokens."""
    from dataclasses import replace

    from harness.kinds.rl.controls import sync_controls
    from harness.kinds.rl.settings import RLSettings

    rng = np.random.default_rng(1)
    rollout = [np.log(rng.uniform(0.05, 0.95, 24)) for _ in range(4)]
    bars = {"mean_abs_delta": 0.2, "token_mult_prob_error": 1.21, "frac_masked": 0.032}
    cs = sync_controls(rollout, replace(RLSettings(steps=("checkpoint",)), bars=bars))
    assert all(c.ok for c in cs), [(c.comparator, c.mutation, c.got) for c in cs if not c.ok]
    assert {c.comparator for c in cs} >= {"rl.frac_masked", "rl_sync"}
