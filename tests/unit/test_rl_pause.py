"""The RL gate's pause phase over HTTP without an engine: what each ``/pause`` mode promises, judged
on evidence shaped as the pinned server returns it (the engine path: tests/integration/test_rl_http.py,
opt-in), the planted copies that must fail, the plan, and the server's command line."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from harness.kinds.rl.pause import in_flight, judge_pause, pause_controls, pause_plan

MAX = 200


def _req(
    rid: str, n: int, finish: str, spans: list[tuple[str, int, int]], end_t: float, at_pause: int = 12
) -> dict:
    return {
        "id": rid,
        "token_ids": list(range(n)),
        "chosen_logprobs": [-0.5] * n,
        "finish_reason": finish,
        "weight_versions": [{"version": v, "start": a, "end": b} for v, a, b in spans],
        "first_token_t": 0.03,
        "end_t": end_t,
        "error": None,
        "tokens_at_pause": at_pause,
    }


def _ev(mode: str) -> dict[str, Any]:
    """What the pinned server did for each mode on tiny-llama (two requests of 200 tokens)."""
    base = {
        "mode": mode,
        "max_tokens": MAX,
        "from_step": 4,
        "to_step": 3,
        "pause_t": 0.1,
        "paused_t": 0.15,
        "update_start_t": 0.16,
        "update_end_t": 0.28,
    }
    if mode == "abort":
        reqs = [_req("a0", 19, "abort", [("4", 0, 19)], 0.31), _req("a1", 18, "abort", [("4", 0, 18)], 0.31)]
        return {**base, "version_before": "4", "version": "5", "version_after": "5", "requests": reqs}
    if mode == "wait":
        reqs = [
            _req("w0", MAX, "length", [("5", 0, MAX)], 2.77),
            _req("w1", MAX, "length", [("5", 0, MAX)], 2.79),
        ]
        return {
            **base,
            "version_before": "5",
            "version": "6",
            "version_after": "6",
            "update_start_t": 2.81,
            "update_end_t": 3.02,
            "requests": reqs,
        }
    reqs = [
        _req("k0", MAX, "length", [("6", 0, 12), ("7", 12, MAX)], 2.56),
        _req("k1", MAX, "length", [("6", 0, 11), ("7", 11, MAX)], 2.56, at_pause=11),
    ]
    return {**base, "version_before": "6", "version": "7", "version_after": "7", "requests": reqs}


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_what_the_server_did_keeps_each_modes_promise(mode: str) -> None:
    v = judge_pause(_ev(mode))
    assert v.status == "pass", v.summary
    assert v.case_id == f"pause-{mode}" and v.evidence["in_flight"] == 2


def _broken(mode: str, change: Any) -> str:
    ev = _ev(mode)
    change(ev["requests"][0], ev)
    v = judge_pause(ev)
    assert v.status == "fail"
    return v.summary


def test_abort_fails_on_a_request_returned_as_finished_or_finished_otherwise() -> None:
    def finished(r: dict, ev: dict) -> None:
        r["finish_reason"], r["token_ids"] = "length", list(range(MAX))

    assert "request a0 returned as finished ('length', 200/200 tokens)" in _broken("abort", finished)
    assert "not 'abort'" in _broken("abort", lambda r, ev: r.update(finish_reason=None))
    said = _broken("abort", lambda r, ev: r.update(weight_versions=[{"version": "5", "start": 0, "end": 19}]))
    assert "19 of its tokens credited to the new version '5'" in said


def test_wait_fails_on_a_token_of_the_new_version_or_a_request_not_drained() -> None:
    def new(r: dict, ev: dict) -> None:
        r["weight_versions"] = [
            {"version": "5", "start": 0, "end": 150},
            {"version": "6", "start": 150, "end": MAX},
        ]

    assert "tokens by version(s) ['6'], not all by the old version '5'" in _broken("wait", new)
    assert "did not finish ('abort', 40/200 tokens)" in _broken(
        "wait", lambda r, ev: r.update(finish_reason="abort", token_ids=list(range(40)))
    )
    assert "spans cover 150 of 200" in _broken(
        "wait", lambda r, ev: r.update(weight_versions=[{"version": "5", "start": 0, "end": 150}])
    )
    assert "did not say which version" in _broken("wait", lambda r, ev: r.update(weight_versions=None))


def test_keep_fails_on_tokens_credited_to_the_wrong_version() -> None:
    def all_old(r: dict, ev: dict) -> None:
        r["weight_versions"] = [{"version": "6", "start": 0, "end": MAX}]

    def reversed_(r: dict, ev: dict) -> None:
        r["weight_versions"] = [
            {"version": "7", "start": 0, "end": 12},
            {"version": "6", "start": 12, "end": MAX},
        ]

    def late_switch(r: dict, ev: dict) -> None:
        r["tokens_at_pause"] = 30

    def gap(r: dict, ev: dict) -> None:
        r["weight_versions"] = [
            {"version": "6", "start": 0, "end": 12},
            {"version": "7", "start": 13, "end": MAX},
        ]

    assert "no token credited to the new version '7': not resumed on it" in _broken("keep", all_old)
    assert "versions in the order ['7', '6']" in _broken("keep", reversed_)
    assert "30 tokens streamed before the pause, only 12 credited to '6'" in _broken("keep", late_switch)
    assert "cover 199 of 200 tokens, not contiguously" in _broken("keep", gap)
    assert "did not finish ('abort', 12/200 tokens)" in _broken(
        "keep", lambda r, ev: r.update(finish_reason="abort", token_ids=list(range(12)))
    )


def test_a_mode_with_nothing_in_flight_shows_nothing_and_fails() -> None:
    ev = _ev("keep")
    ev["pause_t"] = 5.0  # both streams had ended
    assert in_flight(ev) == []
    v = judge_pause(ev)
    assert v.status == "fail" and "no request was still in flight" in v.summary


def test_the_version_after_must_be_the_one_the_update_set() -> None:
    ev = _ev("abort")
    ev["version_after"] = "4"
    v = judge_pause(ev)
    assert v.status == "fail" and "reports version '4' after the update to '5'" in v.summary


def test_a_failed_stream_is_named() -> None:
    assert "its stream failed: reset by peer" in _broken(
        "keep", lambda r, ev: r.update(error="reset by peer")
    )


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_every_planted_copy_fails_and_the_evidence_judges_as_it_did(mode: str) -> None:
    ev = _ev(mode)
    before = copy.deepcopy(ev)
    cs = pause_controls([ev])
    assert ev == before  # the controls plant on copies
    assert len(cs) == 3 and all(c.ok for c in cs), [(c.mutation, c.got) for c in cs]
    assert cs[0].expect == "pass" and all(c.expect == "fail" for c in cs[1:])


def test_pause_plan_moves_the_weights_at_every_update() -> None:
    steps = [
        {"rollouts": [{"id": f"s{k}-c{i}", "prompt_ids": [1, 2, k], "seed": 10 * k + i} for i in range(2)]}
        for k in range(5)
    ]
    files = [f"step-{k}/model.safetensors" for k in range(5)]
    plan = pause_plan(steps, ("abort", "wait", "keep"), 64, files)
    assert [p["version"] for p in plan] == ["5", "6", "7"]
    assert [(p["from_step"], p["to_step"]) for p in plan] == [(4, 3), (3, 4), (4, 3)]
    assert [p["update"]["path"] for p in plan] == [files[3], files[4], files[3]]
    ids = [r["id"] for p in plan for r in p["rollouts"]]
    assert len(set(ids)) == 6 and all(r["prompt_ids"] == [1, 2, 4] for p in plan for r in p["rollouts"])
    assert len({r["seed"] for p in plan for r in p["rollouts"]}) == 6


def test_the_server_runs_with_the_rl_routes_backend_and_worker_extension(tmp_path: Any) -> None:
    from harness.engines.vllm.rl_http import EXTENSION, LAUNCHER, RLServer
    from harness.models import ModelRef

    model = ModelRef(name="m", path=str(tmp_path), digest="d")
    srv = RLServer(
        model, {"enforce_eager": True, "logprobs_mode": "processed_logprobs"}, python="python3", port=1
    )
    cmd = srv.command()
    assert cmd[1] == str(LAUNCHER) and LAUNCHER.exists()
    assert cmd[cmd.index("--weight-transfer-config") + 1] == '{"backend": "harness_files"}'
    assert cmd[cmd.index("--worker-extension-cls") + 1] == EXTENSION
    assert "--enable-scale-out" in cmd and "--enforce-eager" in cmd
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert srv.env()["VLLM_SERVER_DEV_MODE"] == "1"


def _scores(ev: dict[str, Any], gap: float = 0.3, noise: float = 1e-6) -> dict[str, dict[str, list[float]]]:
    """The trainer's logprobs as the weights that sampled each token would give them (``noise`` off the
    rollout's), and ``gap`` off under the other version's weights."""
    out = {}
    old = ev["version_before"]
    for r in ev["requests"]:
        lp = np.asarray(r["chosen_logprobs"], np.float64)
        by_old = np.zeros(len(lp), bool)
        for s in r["weight_versions"]:
            by_old[s["start"] : s["end"]] = s["version"] == old
        out[r["id"]] = {"old": lp + np.where(by_old, noise, gap), "new": lp + np.where(by_old, gap, noise)}
    return out


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_the_logprobs_must_agree_with_the_version_labels(mode: str) -> None:
    ev = _ev(mode)
    v = judge_pause(ev, _scores(ev), 1e-4)
    assert v.status == "pass", v.summary
    fig = v.evidence["figures"]
    assert fig["old_version"]["mean_abs_delta"] == pytest.approx(1e-6)
    if mode == "keep":
        assert fig["new_version"]["mean_abs_delta"] == pytest.approx(1e-6)
        assert fig["new_version_vs_old_weights"]["mean_abs_delta"] == pytest.approx(0.3)
    # the same labels over tokens another version sampled: the scores say so
    other = _scores(ev, gap=1e-6, noise=0.3)
    v = judge_pause(ev, other, 1e-4)
    assert v.status == "fail" and "credited to the old version sit 3.00e-01 nats" in v.summary


def test_kept_tokens_no_closer_to_the_new_weights_fail() -> None:
    ev = _ev("keep")
    sc = _scores(ev)
    for x in sc.values():  # the new span as far from the new weights as from the old
        x["new"] = x["old"].copy()
    v = judge_pause(ev, sc, 1e-4)
    assert v.status == "fail" and "sit no closer to the new weights" in v.summary


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_with_scores_the_swapped_weights_control_bites(mode: str) -> None:
    ev = _ev(mode)
    cs = pause_controls([ev], {mode: _scores(ev)}, 1e-4)
    assert len(cs) == 4 and all(c.ok for c in cs), [(c.mutation, c.got, c.note) for c in cs]
    assert cs[-1].mutation.endswith("the tokens credited to the other version's weights")
