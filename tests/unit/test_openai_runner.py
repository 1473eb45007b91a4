"""The openai: runner against a planted-fault double on loopback (the real vLLM server is in
tests/integration/test_openai_vllm_server.py).

Every fault must come back as a named ``error`` verdict for its case only, the other cases still
judged, the record still written, and the whole run bounded in time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from harness.api import EngineRefused, Sampling
from harness.engines.openai import OpenAIRunner, parse_openai_spec
from harness.goldens import golden_dir, read_golden
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.records import load_record
from harness.workspace import Workspace
from tests.unit.openai_double import Double, serve

FAST = "timeout=0.5,retries=1,wait=2"


def double_for(ws: Workspace, **kw: object) -> Double:
    model = resolve_model("tiny-llama", ws)
    g = read_golden(golden_dir(ws.goldens, model, "smoke"), model_name="tiny-llama", suite_name="smoke")
    return Double({c.prompt_ids: (c.id, g.outputs[c.id]) for c in g.cases}, **kw)  # type: ignore[arg-type]


@pytest.fixture
def healthy(workspace: Workspace) -> Iterator[tuple[Double, str]]:
    d = double_for(workspace)
    with serve(d) as url:
        yield d, url


def by_case(rec, comparator: str = "near_tie") -> dict[str, object]:  # noqa: ANN001
    return {v.case_id: v for v in rec.verdicts if v.comparator == comparator}


def test_a_healthy_server_passes_exactly_and_the_record_says_what_was_detected(
        workspace: Workspace, healthy: tuple[Double, str]) -> None:
    _, url = healthy
    res = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url},c=4", auto_record=False)
    rec = res.record
    assert rec.outcome == "pass", rec.summary
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "strict"), rec.summary
    assert rec.candidate.engine == "double" and rec.candidate.version == "9.9.9"
    assert rec.candidate.environment["protocol"]["ids_from"] == "token_ids"
    caps = rec.extra["capabilities"]
    assert caps["token_ids"] and caps["top_logprobs"] and caps["logprobs_served"] == 5
    assert rec.extra["impossible"] == {}
    speed = rec.extra["speed"]["candidate"]
    assert speed["concurrency"] == 4 and speed["requests"] == 8 and speed["method"] == "http-stream"
    assert speed["output_tokens"] == sum(len(o.token_ids) for o in res.golden.outputs.values())
    assert speed["ttft_ms"]["p50"] > 0
    assert "no speed ratio" in rec.extra["speed"]["statement"]
    assert load_record(res.path) == rec


def test_planted_faults_become_named_errors_and_the_rest_still_runs(workspace: Workspace) -> None:
    faults = {"c02": "5xx", "c03": "hang", "c04": "malformed", "c05": "wrong-logprobs", "c06": "die",
              "c07": "5xx-once"}
    d = double_for(workspace, faults=dict(faults))
    t0 = time.perf_counter()
    with serve(d) as url:
        res = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url},c=2,{FAST},breaker=10",
                       auto_record=False)
    assert time.perf_counter() - t0 < 30, "faults must be bounded by timeout x retries"
    rec = load_record(res.path)  # the record is written despite the faults
    v = by_case(rec)
    assert {c for c, x in v.items() if x.status == "pass"} == {"c01", "c07", "c08"}, rec.summary
    expect = {"c02": "HTTP 503", "c03": "no answer within 0.5 s", "c04": "malformed JSON",
              "c05": "wrong number of logprobs at position 3: got 2, asked 5",
              "c06": "the stream ended after 3 tokens without finishing"}
    for cid, needle in expect.items():
        assert v[cid].status == "error", (cid, v[cid].summary)
        assert needle in v[cid].detail and f"case {cid}" in v[cid].detail, v[cid].detail
    assert "overloaded: try later" in v["c02"].detail  # the response excerpt
    assert "oops" in v["c04"].detail
    assert d.attempts["c02"] == 2 and d.attempts["c07"] == 2  # retried once, then given up / healed
    assert d.attempts["c04"] == 1 and d.attempts["c05"] == 1  # protocol errors are not retried
    assert rec.outcome == "error"


def test_a_server_that_stops_answering_trips_the_breaker(workspace: Workspace) -> None:
    d = double_for(workspace, faults={f"c0{i}": "hang" for i in range(2, 9)})
    t0 = time.perf_counter()
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url},c=1,{FAST},breaker=2",
                       auto_record=False).record
    assert time.perf_counter() - t0 < 15
    v = by_case(rec)
    assert v["c01"].status == "pass"
    assert "no answer within" in v["c02"].detail and "no answer within" in v["c03"].detail
    for cid in ("c04", "c05", "c06", "c07", "c08"):
        assert v[cid].status == "error" and "not sent: the server stopped answering" in v[cid].detail
    assert sum(d.attempts[c] for c in ("c04", "c05", "c06", "c07", "c08")) == 0


def test_a_logprob_cap_is_detected_and_recorded(workspace: Workspace) -> None:
    d = double_for(workspace, max_logprobs=3)
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    caps = rec.extra["capabilities"]
    assert caps["logprobs_served"] == 3 and caps["logprobs_asked"] == 5
    assert any("caps logprobs at 3" in n for n in caps["notes"])
    assert rec.outcome == "pass"  # near-tie needs the oracle's top-k, not the candidate's


def test_a_text_only_server_gets_strict_on_text_and_the_rest_is_impossible(workspace: Workspace) -> None:
    d = double_for(workspace, text_only=True)
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    assert not rec.extra["capabilities"]["token_ids"]
    assert "text only" in rec.extra["impossible"]["near_tie"]
    strict = by_case(rec, "strict")
    assert all(x.status == "pass" and x.evidence["mode"] == "text" for x in strict.values())
    assert all(x.status == "skip" for x in by_case(rec).values())
    # near-tie could not judge: strict on text gates instead, and the summary says so
    assert rec.gates[:1] == ("strict",) and "gated by strict (near_tie is impossible" in rec.summary
    assert rec.outcome == "pass"


def test_text_only_strict_still_fails_on_different_text(workspace: Workspace) -> None:
    d = double_for(workspace, text_only=True)
    key = next(iter(d.answers))
    cid, out = d.answers[key]
    d.answers = {**d.answers, key: (cid, replace(out, text=out.text[:3] + "#" + out.text[4:]))}
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    v = by_case(rec, "strict")[cid]
    assert v.status == "fail" and "char 3" in v.summary
    assert rec.outcome == "fail"  # strict gates a text-only server


def test_api_key_is_sent_from_the_env_and_never_recorded(workspace: Workspace,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    d = double_for(workspace, api_key="s3cret-value")
    monkeypatch.setenv("MY_KEY", "s3cret-value")
    with serve(d) as url:
        res = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url},key_env=MY_KEY", auto_record=False)
    assert res.record.outcome == "pass"
    assert "Bearer s3cret-value" in d.auth_seen
    text = res.path.read_text()
    assert "s3cret" not in text
    assert json.loads(text)["candidate"]["environment"]["api_key_env"] == "MY_KEY"


def test_a_missing_key_variable_is_refused_by_name(workspace: Workspace,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_KEY", raising=False)
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "openai:http://127.0.0.1:9,key_env=NOPE_KEY",
                   auto_record=False).record
    assert rec.outcome == "refused"
    assert "NOPE_KEY" in rec.verdicts[0].summary


def test_a_wrong_key_is_an_error_with_the_servers_answer(workspace: Workspace,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    d = double_for(workspace, api_key="right")
    monkeypatch.setenv("MY_KEY", "wrong")
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url},key_env=MY_KEY,{FAST}",
                       auto_record=False).record
    assert rec.outcome == "error"
    assert "HTTP 401" in rec.verdicts[0].detail and "wrong" not in rec.verdicts[0].detail.split("HTTP")[0]


def test_nothing_listening_is_an_error_and_a_record(workspace: Workspace) -> None:
    res = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:http://127.0.0.1:9,{FAST}", auto_record=False)
    assert res.record.outcome == "error"
    assert "did not answer within 2 s" in res.record.verdicts[0].detail
    assert res.path.exists()


@pytest.mark.parametrize("c", [1, 4])
def test_concurrency_is_what_was_asked(workspace: Workspace, c: int) -> None:
    d = double_for(workspace, delay_s=0.15)
    with serve(d) as url:
        runner = OpenAIRunner(parse_openai_spec("openai", f"{url},c={c}"))
        runner.start()
        g = read_golden(golden_dir(workspace.goldens, resolve_model("tiny-llama", workspace), "smoke"),
                        model_name="tiny-llama", suite_name="smoke")
        outs = runner.run(g.cases, Sampling(max_tokens=32, logprobs=5))
    assert all(o.error is None for o in outs)
    assert d.max_in_flight == c
    assert runner.speed is not None and runner.speed.concurrency == c


@pytest.mark.parametrize("arg, needle", [
    (None, "give the server's base URL"),
    ("ftp://x", "is not an http(s) URL"),
    ("http://user:pw@127.0.0.1:8000", "not in the URL"),
    ("http://127.0.0.1:8000,speed=9", "option 'speed=9' is not one of"),
    ("http://127.0.0.1:8000,c=many", "option c='many' is not a valid value"),
    ("http://127.0.0.1:8000,c=0", "c and breaker must be >= 1"),
])
def test_bad_specs_are_refused_with_the_reason(arg: str | None, needle: str) -> None:
    with pytest.raises(EngineRefused, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_openai_spec("openai:x", arg)


def test_base_url_gets_v1_once() -> None:
    assert parse_openai_spec("o", "http://h:1").base_url == "http://h:1/v1"
    assert parse_openai_spec("o", "http://h:1/v1/").base_url == "http://h:1/v1"
