"""Servers unlike vLLM's, against a planted-fault double on loopback (tests/unit/openai_double.py):
one that refuses token-id prompts (text prompts, tokenization verified), one whose tokenizer differs
by one token, one that does not decode greedily, one that keys logprobs by token text (mapped to ids,
ambiguous texts flagged). The real llama.cpp server is in tests/integration/test_llamacpp.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from harness.api import Sampling
from harness.compare.greedy import Greedy
from harness.compare.kl import kl_topk_rest
from harness.engines.openai import OpenAIRunner, parse_openai_spec
from harness.engines.openai.token_text import UNMAPPED, TokenTexts, token_bytes
from harness.goldens import golden_dir, read_golden
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.workspace import Workspace
from tests.unit.openai_double import Double, serve
from tests.unit.test_openai_runner import by_case, double_for


def llama_render(ws: Workspace) -> Callable[[int], str]:
    """How llama-cpp-python names a token: its bytes, invalid UTF-8 dropped; control tokens as ''."""
    model = resolve_model("tiny-llama", ws)
    raw = token_bytes(model._tokenizer, 512)
    return lambda t: (raw[t] or b"").decode("utf-8", errors="ignore")


def text_double(ws: Workspace, **kw: object) -> Double:
    model = resolve_model("tiny-llama", ws)
    return double_for(ws, ids_refused=True, encode=model.encode, **kw)


def test_a_server_refusing_id_prompts_gets_text_and_its_tokenization_is_checked(workspace: Workspace) -> None:
    d = text_double(workspace, tokenize="extras")
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    caps = rec.extra["capabilities"]
    assert caps["prompts"] == "text" and caps["tokenized_by"] == "POST /extras/tokenize"
    assert any("refuses token-id prompts" in n for n in caps["notes"])
    tok = by_case(rec, "tokenizer")
    assert len(tok) == 8 and all(v.status == "pass" for v in tok.values())
    assert rec.verdicts[0].comparator == "tokenizer"  # shown before anything else
    assert "tokenizer" in rec.gates
    controls = {c.mutation: c for c in rec.controls if c.comparator == "tokenizer"}
    assert [c.got for c in controls.values()] == ["fail 8/8", "fail 8/8", "pass 8/8"], controls
    sent = [b["prompt"] for b in d.bodies]
    # the text canary, then the token-id attempt, then text only
    assert isinstance(sent[0], str) and isinstance(sent[1], list) and all(isinstance(p, str) for p in sent[2:])
    assert all(v.status == "pass" for v in by_case(rec, "strict").values())  # ids still come back


def test_a_server_killed_by_a_token_id_prompt_is_named_and_not_gated(workspace: Workspace) -> None:
    """vllm.cpp at d85906ae: a token-id prompt stops its engine and every later request answers
    HTTP 500. The probe's text canary answered before and fails after: the report says so, naming
    the request, instead of 'no usable answer'."""
    d = double_for(workspace, ids_refused=False, ids_error="kills", tokenize="extras",
                   encode=resolve_model("tiny-llama", workspace).encode)
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    assert rec.outcome == "error" and d.dead
    detail = rec.verdicts[0].detail
    assert "died on a token-id prompt" in detail and "c01 sent as token ids" in detail, detail
    assert "stopped AsyncLLM" in detail and "dead server" in detail
    kinds = ["ids" if isinstance(b["prompt"], list) else "text" for b in d.bodies]
    assert kinds[0] == "text" and kinds[-1] == "text" and "ids" in kinds, kinds  # canary, ids, canary
    assert len(d.bodies) <= 6  # the probe stopped there: no case was gated against the dead server


def test_a_server_that_errs_on_token_ids_but_stays_up_gets_text(workspace: Workspace) -> None:
    d = double_for(workspace, ids_refused=False, ids_error="500", tokenize="extras",
                   encode=resolve_model("tiny-llama", workspace).encode)
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    caps = rec.extra["capabilities"]
    assert caps["prompts"] == "text"
    assert any("answers token-id prompts with an error" in n and "stays up" in n for n in caps["notes"])


def test_prompts_ids_refuses_a_server_that_takes_only_text(workspace: Workspace) -> None:
    d = text_double(workspace, tokenize="extras")
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url},prompts=ids", auto_record=False).record
    assert rec.outcome == "refused"
    assert "as token ids" in rec.verdicts[0].detail and "prompts=auto" in rec.verdicts[0].detail


@pytest.mark.parametrize("tokenize", ["extras", "tokenize", None])
def test_a_tokenizer_mismatch_is_a_named_verdict_and_the_case_is_not_sent(workspace: Workspace,
                                                                          tokenize: str | None) -> None:
    model = resolve_model("tiny-llama", workspace)
    g = read_golden(golden_dir(workspace.goldens, model, "smoke"), model_name="tiny-llama", suite_name="smoke")
    c03 = next(c for c in g.cases if c.id == "c03")
    planted = (c03.prompt_ids[2] + 1) % 512
    # echo (tokenize None) reads token texts: the double must name tokens as a text-keyed server does
    d = text_double(workspace, tokenize=tokenize, tokenize_plant={"c03": (2, planted)},
                    render=llama_render(workspace) if tokenize is None else None)
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    tok = by_case(rec, "tokenizer")
    assert tok["c03"].status == "fail", tok["c03"].summary
    assert tok["c03"].summary == f"tokenizer FAIL at prompt token 2/{len(c03.prompt_ids)}"
    assert tok["c03"].evidence["served_id"] == planted and tok["c03"].evidence["oracle_id"] == c03.prompt_ids[2]
    assert f"server     : {planted} " in tok["c03"].detail
    assert all(v.status == "pass" for cid, v in tok.items() if cid != "c03")
    assert rec.outcome == "fail"
    sent = [b for b in d.bodies if b["prompt"] == c03.prompt_text and not b.get("echo")]
    assert not sent, "a mistokenized case must not be sent for completion"
    assert "not sent: the server tokenizes this prompt differently" in by_case(rec, "near_tie")["c03"].detail
    how = {"extras": "POST /extras/tokenize", "tokenize": "POST /tokenize", None: "echo (token texts)"}
    assert rec.extra["capabilities"]["tokenized_by"] == how[tokenize]


def test_a_non_greedy_answer_names_where_by_how_much_and_the_knobs_left_to_the_server(
        workspace: Workspace) -> None:
    d = double_for(workspace, non_greedy={"c02": 5}, defaults={"repeat_penalty": 1.1, "top_k": 40,
                                                               "temperature": 0.8, "seed": None})
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    g = by_case(rec, "greedy")
    assert g["c02"].status == "fail" and g["c02"].summary.startswith("greedy FAIL at token 5/32")
    assert all(v.status == "pass" for cid, v in g.items() if cid != "c02")
    assert g["c02"].evidence["gap_mnats"] > 0.1
    assert "repeat_penalty (server default 1.1)" in g["c02"].detail
    assert "top_k (server default 40)" in g["c02"].detail
    assert "temperature" not in g["c02"].evidence["left_to_server"]  # it was sent
    assert rec.outcome == "fail" and "greedy" in rec.gates
    assert rec.summary.endswith(" — greedy FAIL 1/8 (c02)"), rec.summary
    controls = {c.mutation: c for c in rec.controls if c.comparator == "greedy"}
    assert all(c.ok for c in controls.values()), controls
    assert controls["choose the runner-up where the top-1 is decisive"].got == "fail 8/8"
    assert controls["the oracle's own greedy outputs"].got == "pass 8/8"


def test_body_fields_are_sent_recorded_and_no_longer_left_to_the_server(workspace: Workspace) -> None:
    d = double_for(workspace, defaults={"repeat_penalty": 1.1, "top_k": 40})
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url},body.repeat_penalty=1.0,body.top_k=1",
                       auto_record=False).record
    assert rec.outcome == "pass", rec.summary
    assert all(b["repeat_penalty"] == 1.0 and b["top_k"] == 1 for b in d.bodies)
    assert rec.candidate.settings["body"] == {"repeat_penalty": 1.0, "top_k": 1}
    caps = rec.extra["capabilities"]
    assert caps["request"]["repeat_penalty"] == 1.0 and caps["left_to_server"] == {}


@pytest.mark.parametrize("arg, needle", [("body.prompt=x", "set by the harness"),
                                         ("prompts=maybe", "option prompts='maybe' is not a valid value")])
def test_bad_new_options_are_refused(arg: str, needle: str) -> None:
    from harness.api import EngineRefused

    with pytest.raises(EngineRefused, match=needle):
        parse_openai_spec("openai:x", f"http://127.0.0.1:9,{arg}")


def test_text_keyed_logprobs_are_mapped_to_ids_and_ambiguous_texts_are_flagged(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    render = llama_render(workspace)
    g = read_golden(golden_dir(workspace.goldens, model, "smoke"), model_name="tiny-llama", suite_name="smoke")
    d = text_double(workspace, tokenize="extras", render=render)
    texts = TokenTexts.for_tokenizer(model._tokenizer, model.decode, 512)
    with serve(d) as url:
        runner = OpenAIRunner(parse_openai_spec("openai", url), model=model)
        runner.start()
        outs = {o.case_id: o for o in runner.run(g.cases, Sampling(max_tokens=32, logprobs=5))}
    caps = runner.capabilities
    assert caps is not None and caps.ids_from_text and caps.token_ids and caps.top_logprobs
    want_unmapped = 0
    for c in g.cases:
        gold, got = g.outputs[c.id], outs[c.id]
        assert got.error is None, got.error
        for p, tid in enumerate(gold.token_ids):
            ambiguous = len(texts.by_text[render(tid)]) > 1
            want_unmapped += ambiguous
            # an ambiguous text stays unmapped unless retokenizing the completion resolved it rightly
            assert got.token_ids[p] in ((UNMAPPED, tid) if ambiguous else (tid,)), (c.id, p)
        # every mapped top-k id is the golden's, at the golden's logprob; the rest is flagged
        assert got.top_ids is not None and got.top_logprobs is not None and gold.top_ids is not None
        mapped = got.top_ids != UNMAPPED
        for p in range(len(gold.token_ids)):
            for tid, lp in zip(got.top_ids[p][mapped[p]], got.top_logprobs[p][mapped[p]], strict=True):
                j = list(gold.top_ids[p]).index(int(tid))
                assert lp == pytest.approx(float(gold.top_logprobs[p][j]), abs=1e-6)
    assert want_unmapped > 0, "tiny-llama's byte tokens must exercise the ambiguous path"
    assert caps.unmapped["generated"] + caps.unmapped["resolved"] == want_unmapped
    assert caps.unmapped["generated"] > 0
    assert caps.unmapped["top"] > 0
    assert any("matched no single id" in n for n in caps.notes)
    # top-k KL still works: unmapped entries fall into the "rest" cell, a lower bound that stays finite
    gold, got = g.outputs["c06"], outs["c06"]
    kl = kl_topk_rest(gold.top_ids.astype(np.int64), gold.top_logprobs.astype(np.float64),
                      got.top_ids.astype(np.int64), np.maximum(got.top_logprobs.astype(np.float64), -69.0))
    assert np.all(np.isfinite(kl)) and np.all(kl >= 0)
    assert np.all(kl[~(got.top_ids == UNMAPPED).any(axis=1)] < 1e-6)  # fully mapped rows agree exactly


def test_an_ambiguous_generated_token_is_named_in_the_failure(workspace: Workspace) -> None:
    d = text_double(workspace, tokenize="extras", render=llama_render(workspace))
    with serve(d) as url:
        rec = run_gate_by_name(workspace, "tiny-llama", "smoke", f"openai:{url}", auto_record=False).record
    for comparator in ("strict", "near_tie"):
        v = by_case(rec, comparator)["c06"]
        # c06's first ambiguous token: not a pass, not a fail, an error that says why
        assert v.status == "error" and v.evidence["first_divergence"] == 7, v.summary
        assert v.evidence["kind"] == "unmapped" and "id unknown" in v.detail
    assert rec.extra["capabilities"]["unmapped"]["generated"] > 0
    assert rec.outcome == "error"


def test_token_texts_map_only_unambiguous_texts() -> None:
    t = TokenTexts.from_pieces([["a"], ["b", "b\ufffd"], [""], [""], ["b"]])
    assert t.lookup("a") == 0 and t.lookup("b\ufffd") == 1
    assert t.lookup("b") == UNMAPPED and t.lookup("") == UNMAPPED and t.lookup("zz") == UNMAPPED
    assert t.examples == {"b": 2, "": 2, "zz": 0}
    row = t.map_row({"a": -0.1, "b": -1.0, "": -2.0}, k=5)
    assert row.ids.tolist() == [0, UNMAPPED, UNMAPPED, UNMAPPED, UNMAPPED]
    assert row.ambiguous == 2 and row.missing == 2 and np.isneginf(row.logprobs[3:]).all()


def test_a_shared_text_is_resolved_only_by_a_retokenization_that_agrees_everywhere(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    runner = OpenAIRunner(parse_openai_spec("openai", "http://127.0.0.1:9"), model=model)
    render = llama_render(workspace)
    text = "the the the"
    ids = list(model.encode(text))
    shown = [render(t) for t in ids]
    assert runner.decoder.retokenized([ids[0], UNMAPPED, *ids[2:]], shown, text) == (ids, 1)
    wrong = (ids[-1] + 1) % 512
    assert runner.decoder.retokenized([ids[0], UNMAPPED, *ids[2:-1], wrong], shown, text)[1] == 0  # disagrees
    assert runner.decoder.retokenized([ids[0], UNMAPPED, *ids[2:]], ["x", *shown[1:]], text)[1] == 0  # not shown so
    assert runner.decoder.retokenized([UNMAPPED, *ids], ["", *shown], text)[1] == 0  # a token more than the text


def test_an_ambiguous_top_entry_is_the_chosen_token_when_text_and_logprob_both_match() -> None:
    t = TokenTexts.from_pieces([["a"], [" "], [" "], ["c"]])
    row = {"a": -0.5, " ": -1.5, "c": -3.0}
    assert t.map_row(row, 3).ids.tolist() == [0, UNMAPPED, 3]
    assert t.map_row(row, 3, (" ", -1.5, 2)).ids.tolist() == [0, 2, 3]
    assert t.map_row(row, 3, (" ", -1.4, 2)).ids.tolist() == [0, UNMAPPED, 3]  # another logprob: not it


def test_a_non_greedy_choice_after_an_unmapped_token_is_still_explained(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    g = read_golden(golden_dir(workspace.goldens, model, "smoke"), model_name="tiny-llama", suite_name="smoke")
    case = g.cases[0]
    out = g.outputs[case.id]
    assert out.top_logprobs is not None and out.chosen_logprobs is not None
    chosen = out.chosen_logprobs.copy()
    chosen[3] = out.top_logprobs[3][1]
    planted = out.with_tokens([out.token_ids[0], UNMAPPED, *out.token_ids[2:]])
    v = Greedy(decode=model.decode).compare(None, replace(planted, chosen_logprobs=chosen), case)
    assert v.status == "fail" and v.evidence["first"] == 3, v.summary
