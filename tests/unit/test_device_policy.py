"""The cross-device policy: which classes may be held to bit-identity, and its planted faults."""

from __future__ import annotations

import numpy as np
import pytest

from harness.api import Output
from harness.device_policy import (
    FLOAT32_ATOL,
    DevicePolicy,
    check_reproduction,
    logprob_drift,
    policy,
)
from tests.conftest import make_output

AVX512 = "cpu-x86_64-avx512bf16"
AVX2 = "cpu-x86_64-avx2"


def _goldens() -> dict[str, Output]:
    return {cid: make_output(cid, [10 + i, 20 + i, 30 + i, 40 + i], seed=i)
            for i, cid in enumerate(("c01", "c02"))}


def _moved(outs: dict[str, Output], delta: float, case: str = "c02", pos: int = 2) -> dict[str, Output]:
    """A copy whose top-k logprobs (and chosen logprob) at one position moved by ``delta``."""
    out = dict(outs)
    o = outs[case]
    assert o.top_logprobs is not None and o.chosen_logprobs is not None
    top, chosen = o.top_logprobs.copy(), o.chosen_logprobs.copy()
    top[pos] += np.float32(delta)
    chosen[pos] += np.float32(delta)
    out[case] = Output(o.case_id, o.token_ids, o.text, o.top_ids, top, chosen, o.finish_reason)
    return out


def _one_ulp(outs: dict[str, Output]) -> dict[str, Output]:
    out = dict(outs)
    o = outs["c01"]
    assert o.top_logprobs is not None
    top = o.top_logprobs.copy()
    top[1, 3] = np.nextafter(top[1, 3], np.float32(0))
    out["c01"] = Output(o.case_id, o.token_ids, o.text, o.top_ids, top, o.chosen_logprobs,
                        o.finish_reason)
    return out


@pytest.mark.parametrize(("g", "c", "dtype", "relation", "exact", "atol"), [
    (AVX512, AVX512, "float32", "same-class", ("token_ids", "logprobs"), 0.0),
    ("cuda-sm90", "cuda-sm90", "bfloat16", "same-class", ("token_ids", "logprobs"), 0.0),
    (AVX512, AVX2, "float32", "cross-cpu", ("token_ids",), FLOAT32_ATOL),
    (AVX512, "cpu-x86_64-avx512bf16+aten-avx2", "float32", "cross-cpu", ("token_ids",), FLOAT32_ATOL),
    (AVX512, AVX2, "bfloat16", "cross-device", (), None),
    (AVX512, "cuda-sm90", "float32", "cross-device", (), None),
    ("cuda-sm80", "cuda-sm90", "float32", "cross-device", (), None),
    ("unknown", AVX512, "float32", "unknown-cpu", ("token_ids",), FLOAT32_ATOL),
    ("unknown", "cuda-sm90", "float32", "unknown-device", (), None),
    ("unknown", "unknown", "float32", "unknown-device", (), None),
    ("", AVX2, "float32", "unknown-cpu", ("token_ids",), FLOAT32_ATOL),
])
def test_policy_table(g: str, c: str, dtype: str, relation: str, exact: tuple[str, ...],
                      atol: float | None) -> None:
    pol = policy(g, c, dtype=dtype)
    assert (pol.relation, pol.exact, pol.logprob_atol) == (relation, exact, atol)
    assert pol.same_class == (relation == "same-class")
    assert "kl" in pol.bars and "nmse" in pol.bars and "near_tie" in pol.bars


def test_the_statement_names_both_classes_and_the_expectation() -> None:
    same = policy(AVX512, AVX512).statement
    assert same == (f"goldens and candidate both {AVX512}: same device class — token ids and logprobs "
                    "must be bit-identical")
    cross = policy(AVX512, AVX2).statement
    assert AVX512 in cross and AVX2 in cross and "within 0.0001 nats" in cross and "not bit-exact" in cross
    gpu = policy(AVX512, "cuda-sm90").statement
    assert "cuda-sm90" in gpu and "only the near-tie, KL and NMSE bars apply" in gpu
    unknown = policy("unknown", AVX2).statement
    assert "never assumed equal" in unknown and "goldens unknown" in unknown
    assert policy(AVX512, AVX2).to_json()["statement"] == cross
    assert isinstance(policy(AVX512, AVX2), DevicePolicy)


def test_an_identical_recording_passes_every_relation() -> None:
    g = _goldens()
    for cls in (AVX512, AVX2, "unknown", "cuda-sm90"):
        assert check_reproduction(policy(AVX512, cls), g, dict(g)) == []


def test_planted_one_ulp_fails_the_same_class_check_but_not_the_cross_class_one() -> None:
    g, f = _goldens(), _one_ulp(_goldens())
    problems = check_reproduction(policy(AVX512, AVX512), g, f)
    assert len(problems) == 1
    assert problems[0].startswith("c01: top_logprobs not bit-identical (1 of 20 differ)")
    assert f"both {AVX512}" in problems[0]
    assert check_reproduction(policy(AVX512, AVX2), g, f) == []


def test_planted_perturbation_beyond_the_tolerance_fails_the_cross_class_check() -> None:
    g = _goldens()
    within = _moved(g, 0.5 * FLOAT32_ATOL)
    assert check_reproduction(policy(AVX512, AVX2), g, within) == []
    beyond = _moved(g, 3 * FLOAT32_ATOL)
    problems = check_reproduction(policy(AVX512, AVX2), g, beyond)
    assert len(problems) == 1 and problems[0].startswith("c02 position 2: token ")
    assert "> 0.0001" in problems[0] and AVX2 in problems[0] and AVX512 in problems[0]
    assert check_reproduction(policy("unknown", AVX2), g, beyond)  # unknown goldens: same bound
    assert check_reproduction(policy(AVX512, "cuda-sm90"), g, beyond) == []  # bars judge that


def test_a_flipped_token_fails_both_checks() -> None:
    g = _goldens()
    f = dict(g)
    f["c01"] = g["c01"].with_tokens([10, 20, 99, 40])
    for pol in (policy(AVX512, AVX512), policy(AVX512, AVX2)):
        assert check_reproduction(pol, g, f)[0].startswith("c01: token ids differ at position 2")
    assert check_reproduction(policy(AVX512, AVX2), g, {"c01": g["c01"]})[0].startswith(
        "c02: missing from the fresh recording")


def _with_row(o: Output, pos: int, ids: list[int], lps: list[float]) -> Output:
    assert o.top_ids is not None and o.top_logprobs is not None
    top_ids, top = o.top_ids.copy(), o.top_logprobs.copy()
    top_ids[pos], top[pos] = ids, lps
    return Output(o.case_id, o.token_ids, o.text, top_ids, top, o.chosen_logprobs, o.finish_reason)


def test_near_ties_may_reorder_or_cross_the_top_k_boundary_within_the_bound() -> None:
    base = make_output("c01", [7, 8], k=3)
    g = {"c01": _with_row(base, 0, [7, 100, 101], [-0.1, -2.0, -2.00001])}
    swapped = {"c01": _with_row(base, 0, [7, 101, 100], [-0.1, -2.000004, -2.000006])}
    crossed = {"c01": _with_row(base, 0, [7, 100, 555], [-0.1, -2.0, -2.000012])}
    far = {"c01": _with_row(base, 0, [7, 100, 555], [-0.1, -2.0, -1.5])}
    pol = policy(AVX512, AVX2)
    assert check_reproduction(pol, g, swapped) == []
    assert check_reproduction(pol, g, crossed) == []
    assert "only in the fresh top-k" in check_reproduction(pol, g, far)[0]
    assert check_reproduction(policy(AVX512, AVX512), g, swapped)[0].startswith(
        "c01: top_ids not bit-identical")


def test_logprob_drift_counts_what_moved() -> None:
    g = _goldens()
    assert logprob_drift(g, g) == {"logprobs": 40, "differ": 0, "max_abs": 0.0}
    d = logprob_drift(g, _moved(g, 3e-5))
    assert d["differ"] == 5 and d["max_abs"] == pytest.approx(3e-5, rel=0.05)
