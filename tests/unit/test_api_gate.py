"""The API gate without an engine: the pinned vLLM server's recorded answers replayed by a real HTTP
double on 127.0.0.1 (tests/unit/api_replay.py), judged against themselves, and every planted control
through the real fault proxy in front of that double — each must fail its own facet and no other."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from harness.abilities import Endpoint, ServesOpenAI
from harness.engines.openai.options import parse_openai_spec
from harness.engines.openai.transport import Exchange
from harness.kinds.api.facets import FACETS, comparator
from harness.kinds.api.facets.robustness import Robustness
from harness.kinds.api.observe import observe
from harness.kinds.api.proxy import FAULTS, Fault, proxy
from harness.kinds.api.settings import api_settings
from harness.kinds.api.surface import base_probes, control, judge, ordinary_text, plan, with_base
from harness.kinds.api.views import view
from harness.models.digest import TEMPLATE_FILE, content_digest
from harness.suites import SuiteError, load_suite
from harness.workspace import REPO_ROOT
from tests.unit.api_kit import context
from tests.unit.api_replay import load, serve

MODEL = "tiny-qwen3"


@pytest.fixture(scope="module")
def replay():  # type: ignore[no-untyped-def]
    """(context with the oracle's base generations, probes, the oracle's exchanges, endpoint)."""
    with serve(load(MODEL)) as url:
        ep = Endpoint(url, MODEL, managed=True)
        ctx = context(MODEL)
        ctx = with_base(ctx, observe(ep, base_probes(ctx.texts, ctx.settings.max_tokens), ordinary_text(ctx)))
        probes = plan(ctx)
        oracle = observe(ep, probes, ordinary_text(ctx))
        yield ctx, probes, oracle, ep


def test_every_facet_passes_on_the_oracle_against_itself(replay) -> None:  # type: ignore[no-untyped-def]
    ctx, probes, oracle, ep = replay
    again = observe(ep, probes, ordinary_text(ctx))
    verdicts = judge(ctx, probes, oracle, again)
    assert {v.comparator for v in verdicts} == {comparator(f) for f in ctx.settings.facets}
    bad = [f"{v.case_id}: {v.status} {v.summary}" for v in verdicts if v.status != "pass"]
    assert not bad, bad


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_each_control_fails_its_own_facet_and_no_other(replay, fault: Fault) -> None:  # type: ignore[no-untyped-def]
    ctx, probes, oracle, ep = replay
    c = control(ctx, probes, oracle, ep, fault)
    assert c.ok, c
    assert c.comparator == comparator(fault.facet)
    assert "also failed" not in c.got, c.got


def test_a_candidate_that_changes_a_tool_argument_fails_naming_both_values(replay) -> None:  # type: ignore[no-untyped-def]
    ctx, probes, oracle, ep = replay
    fault = next(f for f in FAULTS if f.name == "a tool call with an argument changed")
    with proxy(ep.base_url, fault) as url:
        got = observe(replace(ep, base_url=url), probes, ordinary_text(ctx))
    fails = [v for v in judge(ctx, probes, oracle, got) if v.status == "fail"]
    assert fails and all(v.comparator == "api.tools" for v in fails)
    assert "!= oracle" in fails[0].summary and "x" in fails[0].summary


def test_a_request_the_double_never_saw_is_refused_not_answered(replay) -> None:  # type: ignore[no-untyped-def]
    _ctx, _probes, _oracle, ep = replay
    from harness.kinds.api.observe import transport

    ex = transport(ep).exchange("/completions", {"prompt": "never recorded", "max_tokens": 3})
    assert ex.status == 404 and "not recorded" in view(ex).error


def test_robustness_is_not_sent_to_a_server_the_user_runs() -> None:
    ctx = replace(context(MODEL), managed=False)
    assert Robustness().probes(ctx) == []
    (v,) = Robustness().judge(ctx, [], {}, {})
    assert v.status == "skip" and "probe=yes" in v.summary


def test_openai_spec_probe_option_and_endpoint() -> None:
    assert parse_openai_spec(
        "openai:http://127.0.0.1:9/v1,probe=yes", "http://127.0.0.1:9/v1,probe=yes"
    ).probe
    assert not parse_openai_spec("openai:http://h:9", "http://h:9").probe
    with pytest.raises(Exception, match="probe"):
        parse_openai_spec("openai:http://h:9,probe=maybe", "http://h:9,probe=maybe")
    from harness.engines.openai import OpenAIRunner

    runner = OpenAIRunner(parse_openai_spec("openai:http://h:9,probe=yes", "http://h:9,probe=yes"))
    assert isinstance(runner, ServesOpenAI) and runner.endpoint().managed


def test_servers_the_harness_starts_declare_the_ability() -> None:
    from harness.engines.llamacpp.runner import LlamaCppRunner
    from harness.engines.vllm.server import VLLMServerRunner

    assert issubclass(VLLMServerRunner, ServesOpenAI) and issubclass(LlamaCppRunner, ServesOpenAI)


def test_stream_view_joins_deltas_and_flags_a_missing_done() -> None:
    ev = [
        {"choices": [{"index": 0, "text": "ab", "token_ids": [1]}]},
        {"choices": [{"index": 0, "text": "c", "token_ids": [2], "finish_reason": "stop"}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    v = view(Exchange(200, events=tuple(ev), done=True))
    assert (v.text, v.token_ids, v.finish, v.deltas, v.usage["completion_tokens"]) == (
        "abc",
        (1, 2),
        "stop",
        ("ab", "c"),
        2,
    )
    assert "[DONE]" in view(Exchange(200, events=tuple(ev))).error


def test_api_suite_table_errors_name_the_file_and_key(tmp_path: Path) -> None:
    src = (REPO_ROOT / "suites" / "api_smoke.toml").read_text()
    bad = tmp_path / "api_smoke.toml"
    bad.write_text(src.replace('"robustness"]', '"robustness", "templates"]'))
    with pytest.raises(SuiteError, match=r"api_smoke.toml.*facets.*templates"):
        api_settings(load_suite(bad), FACETS.names())
    bad.write_text(
        src.replace('facets = ["template", ', 'facets = ["robustness", "template", ').replace(
            '"robustness"]', '"stop"]'
        )
    )
    with pytest.raises(SuiteError, match="robustness.*last"):
        api_settings(load_suite(bad), FACETS.names())


def test_every_facet_has_a_control_that_must_fail() -> None:
    assert {f.facet for f in FAULTS if f.expect == "fail"} == set(FACETS.names())
    assert any(f.expect == "pass" for f in FAULTS)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-gemma3", "tiny-gpt2"])
def test_the_chat_template_file_is_read_and_stays_out_of_the_digest(model: str, tmp_path: Path) -> None:
    folder = REPO_ROOT / "models" / model
    ctx = context(model)
    assert ctx.reference.template.source == TEMPLATE_FILE
    ids = ctx.reference.render([{"role": "user", "content": "Hi"}])
    assert ctx.reference.decode(ids, skip_special_tokens=False).endswith(
        ctx.reference.decode(
            ctx.reference.render([{"role": "user", "content": "Hi"}], generation_prompt=True)[
                len(ctx.reference.render([{"role": "user", "content": "Hi"}], generation_prompt=False)) :
            ],
            skip_special_tokens=False,
        )
    )
    assert len(ids) > len(ctx.reference.render([{"role": "user", "content": "Hi"}], generation_prompt=False))
    copy = tmp_path / model
    shutil.copytree(folder, copy)
    before = content_digest(copy)
    (copy / TEMPLATE_FILE).write_text("{{ 'changed' }}")
    assert content_digest(copy) == before
    (copy / TEMPLATE_FILE).unlink()
    assert content_digest(copy) == before


def test_the_committed_goldens_name_the_digest_the_template_left_alone() -> None:
    for model in ("tiny-llama", "tiny-qwen3"):
        manifest = json.loads((REPO_ROOT / "goldens" / model / "smoke" / "manifest.json").read_text())
        assert manifest["model"]["digest"] == content_digest(REPO_ROOT / "models" / model)


def test_the_committed_record_of_the_pinned_server_passes_with_every_control_biting() -> None:
    records = sorted((REPO_ROOT / "reports" / "records" / MODEL / "api").glob("*_vllm-server_*.json"))
    assert records, "no committed record of make api MODEL=tiny-qwen3"
    rec = json.loads(records[-1].read_text())
    assert rec["kind"] == "api" and rec["outcome"] == "pass" and not rec["harness"]["dirty"]
    assert rec["candidate"]["name"] == "vllm-server", (
        "the pinned server judged against itself is the candidate"
    )
    assert len(rec["controls"]) == len(FAULTS) and all(c["ok"] for c in rec["controls"])
    judged = {v["comparator"] for v in rec["verdicts"] if v["status"] == "pass"}
    assert judged == {comparator(f) for f in FACETS.names()}
    assert rec["extra"]["api"]["template"]["source"] == TEMPLATE_FILE


def test_the_grammar_control_bites_on_the_grammar_check_and_names_step_and_token(replay) -> None:  # type: ignore[no-untyped-def]
    ctx, probes, oracle, ep = replay
    fault = next(f for f in FAULTS if f.says == "grammar broken at step 0")
    c = control(ctx, probes, oracle, ep, fault)
    assert c.ok and c.got == "fail 1/4", c
    assert c.note.startswith("structured/json_schema: json_schema: grammar broken at step 0: token 1 ")
    # the same row failing for another reason (the text one character short) does not count
    other = replace(
        next(f for f in FAULTS if f.name == "a constrained output one character short"), says=fault.says
    )
    assert not control(ctx, probes, oracle, ep, other).ok


SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2's template in shape: it concatenates ``message['content']``, so a tool-call turn's null
content raises in transformers."""


@pytest.mark.parametrize("answer", [400, 200])
def test_a_conversation_the_models_template_refuses_is_a_finding_for_its_rows(
    answer: int, tmp_path: Path
) -> None:
    from harness.kinds.api.facets.template import conversations

    folder = tmp_path / "smol"
    shutil.copytree(
        REPO_ROOT / "models" / "tiny-gpt2", folder, ignore=shutil.ignore_patterns("*.safetensors")
    )
    (folder / TEMPLATE_FILE).write_text(SMOLLM2_TEMPLATE)
    ctx = replace(context("tiny-gpt2"), reference=type(context().reference)(folder))
    msgs, tools = conversations(list(ctx.texts.values()))["tool_reply"]
    assert msgs[1]["content"] is None and msgs[1]["tool_calls"]
    for key, pid in (("template", "template/tool_reply"), ("tools", "tools/reply-render")):
        probes = FACETS.get(key).probes(ctx)  # planning does not raise
        (p,) = [p for p in probes if p.id == pid]
        assert "reference" not in p.meta and "NoneType" in p.meta["refused"]
        body = (
            {"error": {"message": "chat template failed", "type": "BadRequestError", "code": 400}}
            if answer == 400
            else {
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
                "usage": {"prompt_tokens": 31},
            }
        )
        seen = {q.id: Exchange(answer, body) for q in probes}
        verdicts = {v.case_id: v for v in FACETS.get(key).judge(ctx, probes, seen, seen)}
        v = verdicts[pid]
        assert v.status == "skip", v.summary
        assert "chat template refuses this conversation" in v.summary and "TypeError" in v.summary
        assert ("refused it too" if answer == 400 else "answered it anyway (31 prompt tokens)") in v.summary
        others = [w for w in verdicts.values() if w.case_id != pid and "refuses" in w.summary]
        assert not others, [w.summary for w in others]
