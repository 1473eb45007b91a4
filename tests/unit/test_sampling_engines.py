"""Each engine's sampler as an ability of its runner, made through the one engine registry (the draws
themselves: the records and the integration test), and the openai sampler through the runner's own
HTTP transport against the planted-fault double."""

from __future__ import annotations

import numpy as np
import pytest

from harness.abilities import SamplePass, Sampler, SampleRequest
from harness.api import SAMPLER_PARAMETERS, EngineFailed, EngineRefused, Runner, Sampling
from harness.engines import RunnerContext, make_runner
from harness.engines.launch.draws import PARAMS, samples
from harness.goldens import golden_dir, read_golden
from harness.kinds.sampling.kind import SAMPLING_ENGINES
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.records import load_record
from harness.registry import UnknownName
from harness.sampling.transforms import CHAINS
from harness.workspace import Workspace
from tests.unit import sampling_kit as kit
from tests.unit.openai_double import Double, serve


def test_every_sampling_engine_is_a_runner_with_the_ability_and_a_known_chain(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    ctx = RunnerContext(run_dir=workspace.runs)
    named = [s.replace("<url>", "http://127.0.0.1:9") for s in SAMPLING_ENGINES]
    for spec in (
        *named,
        "vllm:logprobs_mode=processed_logprobs",
        "hf:logprobs=raw",
        "openai:http://127.0.0.1:9,chain=llama.cpp",
        "vllm-server:logprobs_mode=processed_logprobs",
    ):
        r = make_runner(spec, model, ctx)
        assert isinstance(r, Runner) and isinstance(r, Sampler), spec
        assert r.sampler_traits().chain in CHAINS, spec
    assert make_runner("vllm:logprobs_mode=processed_logprobs", model).sampler_traits().logprobs_mode == (
        "processed_logprobs"
    )
    assert make_runner("hf:logprobs=raw", model).sampler_traits().logprobs_mode == "raw_logprobs"
    assert make_runner("hf", model).sampler_traits().unsupported  # no presence/frequency penalty
    assert (
        make_runner("openai:http://127.0.0.1:9,chain=llama.cpp", model).sampler_traits().chain == "llama.cpp"
    )
    # another vLLM release is not driven offline: it has no sampler (serve it: vllm-server@<version>)
    assert not isinstance(make_runner("vllm@0.31.0", model, ctx), Sampler)


def test_bad_sampler_options_are_refused_naming_them(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    with pytest.raises(EngineRefused, match="chain 'vlm' is not one of"):
        make_runner("openai:http://127.0.0.1:9,chain=vlm", model)
    with pytest.raises(EngineRefused, match="logprobs_mode 'cooked' is not one of"):
        make_runner("openai:http://127.0.0.1:9,logprobs_mode=cooked", model)
    with pytest.raises(EngineRefused, match="logprobs must be processed or raw"):
        make_runner("hf:logprobs=maybe", model)
    with pytest.raises(EngineRefused, match="logprobs_mode 'odd' is not one of"):
        make_runner("vllm:logprobs_mode=odd", model).sampler_traits()  # type: ignore[attr-defined]


def _gate(ws: Workspace, spec: str):  # noqa: ANN202
    rows = kit.oracle(2, vocab=512, spread=0.7)
    return run_gate_by_name(ws, "tiny-llama", "sampling_small", spec, options={"oracle": (rows, {"spec": "vllm"})})


def test_an_engine_without_a_sampler_is_refused_naming_those_with_one(workspace: Workspace) -> None:
    rec = load_record(_gate(workspace, "vllm@0.31.0").path)
    assert rec.outcome == "refused" or {v.status for v in rec.verdicts} == {"refused"}, rec.summary
    reason = rec.verdicts[0].detail
    assert "no Sampler ability" in reason and all(e in reason for e in SAMPLING_ENGINES), reason


def test_an_unknown_engine_is_answered_with_the_closest_names(workspace: Workspace) -> None:
    with pytest.raises(UnknownName, match="Did you mean 'vllm'"):
        _gate(workspace, "vlm")


def _openai_double(ws: Workspace, **kw: object) -> tuple[Double, tuple[int, ...], tuple[int, ...]]:
    model = resolve_model("tiny-llama", ws)
    g = read_golden(golden_dir(ws.goldens, model, "smoke"), model_name="tiny-llama", suite_name="smoke")
    case = g.cases[0]
    d = Double({c.prompt_ids: (c.id, g.outputs[c.id]) for c in g.cases}, **kw)  # type: ignore[arg-type]
    return d, case.prompt_ids, g.outputs[case.id].token_ids


def test_the_openai_sampler_sends_the_key_retries_and_passes_every_parameter(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = resolve_model("tiny-llama", workspace)
    monkeypatch.setenv("SAMPLER_KEY", "sk-planted-secret")
    d, prompt, golden = _openai_double(workspace, api_key="sk-planted-secret")
    cid = d.answers[prompt][0]
    d.faults[cid] = "5xx-once"
    s = Sampling(max_tokens=3, temperature=0.7, seed=11, top_k=5, top_p=0.9)
    with serve(d) as url:
        r = make_runner(f"openai:{url},key_env=SAMPLER_KEY,retries=2,timeout=5,c=2", model)
        assert isinstance(r, Sampler)
        got = r.sample([SamplePass("main", (SampleRequest("t", prompt, s, 3),))])["main"]["t"]
    assert got.error is None and got.tokens.tolist() == [list(golden[:3])] * 3
    assert got.logprobs is not None and np.isfinite(got.logprobs).all()
    assert d.attempts[cid] == 4  # the 503 was retried through the runner's transport
    assert set(d.auth_seen) == {"Bearer sk-planted-secret"}
    draws = [b for b in d.bodies if b.get("max_tokens") == 3]
    seeds = [b["seed"] for b in draws]  # the one answered 503 is sent again: whichever came first
    assert len(seeds) == 4 and sorted(set(seeds)) == [11, 12, 13]
    assert all(
        b["top_k"] == 5
        and b["top_p"] == 0.9
        and b["temperature"] == 0.7
        and b["n"] == 1
        and set(PARAMS) <= set(b)
        and not b.get("stream")
        for b in draws
    )
    assert r.info().engine == "double"


def test_a_server_that_keeps_failing_fails_the_draws_with_its_redacted_answer(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = resolve_model("tiny-llama", workspace)
    d, prompt, _ = _openai_double(workspace)
    d.faults[d.answers[prompt][0]] = "5xx"
    monkeypatch.setenv("SAMPLER_KEY", "try")  # the double's answer says "try later": redacted
    with serve(d) as url:
        r = make_runner(f"openai:{url},key_env=SAMPLER_KEY,retries=1,timeout=5", model)
        assert isinstance(r, Sampler)
        with pytest.raises(EngineFailed, match=r"HTTP 503.*\*\*\* later") as e:
            r.sample(
                [
                    SamplePass(
                        "main", (SampleRequest("t", prompt, Sampling(max_tokens=3, temperature=1.0), 1),)
                    )
                ]
            )
    assert "try" not in str(e.value).split("HTTP 503")[1]


def test_every_sampler_passes_every_parameter() -> None:
    assert set(PARAMS) == set(SAMPLER_PARAMETERS)  # no engine default (a server's top_k 40) can sneak in


def test_draws_are_padded_where_they_stopped() -> None:
    s = samples("k", [[5, 6], [7], []], [[-0.1, -0.2], [-0.3], []], 2)
    assert s.tokens.tolist() == [[5, 6], [7, -1], [-1, -1]]
    assert s.logprobs is not None and np.isnan(s.logprobs[1, 1]) and s.logprobs[0, 1] == np.float32(-0.2)
    assert samples("k", [[1]], None, 1).logprobs is None


def test_llamacpps_prefix_cache_option_names_itself_in_the_seed_verdict(workspace: Workspace) -> None:
    """``llamacpp:prefix_cache=off`` evaluates every replayed prompt whole; with the cache on (the
    server's way), a failing seed verdict says what in the engine can move a seeded draw and how to
    rule it out. The gate (a server) refuses ``off``; a misspelt value is refused naming it."""
    from harness.kinds.sampling import judge
    from harness.kinds.sampling.doubles import Double as Drawer
    from harness.kinds.sampling.plan import make_plan

    model = resolve_model("tiny-llama", workspace)
    ctx = RunnerContext(run_dir=workspace.runs)
    on, off = make_runner("llamacpp", model, ctx), make_runner("llamacpp:prefix_cache=off", model, ctx)
    assert "prefix_cache=off" in on.sampler_traits().seed_hint  # type: ignore[attr-defined]
    assert off.sampler_traits().seed_hint == ""  # type: ignore[attr-defined]
    assert off.info().settings["prefix_cache"] is False
    with pytest.raises(EngineRefused, match="prefix_cache=off is the sampler's"):
        off.start()
    with pytest.raises(EngineRefused, match="prefix_cache must be on or off, not 'maybe'"):
        make_runner("llamacpp:prefix_cache=maybe", model, ctx)
    traits = on.sampler_traits()  # type: ignore[attr-defined]
    plan = make_plan(kit.oracle(1), kit.settings(["t07"], control_repetitions=0), "llama.cpp")
    broken = Drawer(plan, traits, ignore_seed=True)  # a fresh generator each call: the seed lane fails
    got = broken.sample(plan.passes(("repeat",)))
    (repeat,) = [v for v in judge.determinism(plan, got, traits) if v.case_id == "repeat"]
    assert repeat.status == "fail" and repeat.detail.endswith(f"why it may: {traits.seed_hint}")
    fine = Drawer(plan, traits).sample(plan.passes(("repeat",)))
    (ok,) = [v for v in judge.determinism(plan, fine, traits) if v.case_id == "repeat"]
    assert ok.status == "pass" and "why it may" not in ok.detail


def test_the_repeat_lane_replays_after_other_requests_so_a_history_dependent_seed_fails() -> None:
    """A sampler whose seeded draw depends on the request before it (llama.cpp's prefix cache: the
    prompt's logits depend on what the cache held) passes a repeat lane replayed in the same order;
    the lane runs in the reverse order, so it fails, while a history-free sampler still passes."""
    from harness.kinds.sampling import judge
    from harness.kinds.sampling.doubles import Double as Drawer
    from harness.kinds.sampling.plan import make_plan

    class AfterPrevious(Drawer):
        def sample(self, passes):  # noqa: ANN001, ANN202
            out = {}
            for p in passes:
                got, before = {}, ""
                for r in p.requests:
                    s = self.draw(self._tests[r.key], r.n, r.sampling.seed + len(before))
                    # a chain draw resets the cache (llama.cpp's worker): only a replayed one is history
                    got[r.key], before = s, (r.key if r.key.endswith("#det") else "")
                out[p.name] = got
            return out

    traits = kit.traits("llama.cpp", scope="serial")
    plan = make_plan(kit.oracle(1), kit.settings(["t07", "k5", "p08"], control_repetitions=0), "llama.cpp")
    main, repeat = plan.passes(("repeat",))
    assert [r.key for r in repeat.requests] == [r.key for r in main.requests if r.key.endswith("#det")][::-1]
    (bad,) = [v for v in judge.determinism(plan, AfterPrevious(plan, traits).sample(plan.passes(("repeat",))),
                                           traits) if v.case_id == "repeat"]
    assert bad.status == "fail", bad.summary
    same_order = (main, SamplePass("repeat", tuple(r for r in main.requests if r.key.endswith("#det"))))
    (missed,) = [v for v in judge.determinism(plan, AfterPrevious(plan, traits).sample(same_order), traits)
                 if v.case_id == "repeat"]
    assert missed.status == "pass"  # replayed in the same order, the history is the same: it hides
    (good,) = [v for v in judge.determinism(plan, Drawer(plan, traits).sample(plan.passes(("repeat",))), traits)
               if v.case_id == "repeat"]
    assert good.status == "pass", good.summary
