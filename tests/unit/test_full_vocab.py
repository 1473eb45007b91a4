"""Whole distributions as arrays: suites say logprobs = "full"; KL / NMSE / controls read [T, V]
arrays (memory maps included) in one chunked pass, equal to a naive float64 computation, and never
build a per-position dict; misplaced or unwritten rows and perturbed distributions fail."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.api import Case, Output, Sampling
from harness.compare import build, unit
from harness.compare.kernels.full import dense_from_topk, row_facts, topk
from harness.compare.kl import KL, RUN, plant_kl_shift
from harness.compare.nmse import NMSE, plant_nmse_noise
from harness.compare.unit import Needs
from harness.kinds.controls import golden_checks, run_controls
from harness.suites import FULL_TOP_K, SuiteError, load_suite

CASE = Case("c01", (1, 2, 3))


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def naive(o: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, float]:
    """KL per row and pooled NMSE of renormalised rows, the plain float64 way (no chunks, no tricks)."""
    o2, c2 = log_softmax64(o), log_softmax64(c)
    kl = (np.exp(o2) * (o2 - c2)).sum(axis=1)
    return kl, float(((c2 - o2) ** 2).sum() / (o2**2).sum())


def distributions(n: int, v: int, seed: int, scale: float = 3.0, noise: float = 0.05
                  ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    o = log_softmax64(rng.standard_normal((n, v)) * scale).astype(np.float32)
    c = log_softmax64(o + rng.standard_normal((n, v)) * noise).astype(np.float32)
    return o, c


def output(case_id: str, full: np.ndarray, tokens: np.ndarray | None = None, k: int = FULL_TOP_K) -> Output:
    """An engine's output: top-k rows and chosen logprobs consistent with its full rows."""
    tok = full.argmax(axis=1) if tokens is None else tokens
    ids, lps = topk(full, k)
    return Output(case_id, tuple(int(t) for t in tok), top_ids=ids, top_logprobs=lps,
                  chosen_logprobs=full[np.arange(len(tok)), tok].astype(np.float32), finish_reason="length",
                  full_logprobs=full)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(2, 300), st.integers(0, 10**6), st.floats(0.0, 2.0),
       st.integers(1, 5000), st.floats(-2.0, 2.0))
def test_row_facts_equal_a_naive_float64_computation(n: int, v: int, seed: int, noise: float,
                                                     chunk: int, shift: float) -> None:
    o, c = distributions(n, v, seed, noise=noise)
    c = (c + np.float32(shift)).astype(np.float32)  # rows off by a constant are renormalised first
    f = row_facts(o, c, chunk_elements=chunk)  # any slicing gives the same answer
    kl, pooled = naive(o, c)
    np.testing.assert_allclose(f.kl, np.maximum(kl, 0), rtol=1e-7, atol=1e-12)
    assert f.sq_err.sum() / f.sq_ref.sum() == pytest.approx(pooled, rel=1e-7, abs=1e-15)
    np.testing.assert_allclose(f.o_lse, 0, atol=1e-5)
    assert np.array_equal(f.o_top, o.argmax(axis=1)) and np.array_equal(f.c_top, c.argmax(axis=1))


def test_identical_rows_give_exactly_zero() -> None:
    o, _ = distributions(16, 1000, 1)
    f = row_facts(o, o.copy())
    assert f.kl.max() == 0.0 and f.sq_err.max() == 0.0


def test_topk_and_dense_round_trip() -> None:
    o, _ = distributions(5, 64, 2)
    ids, lps = topk(o, 64)
    assert np.array_equal(dense_from_topk(ids, lps), o)  # top-V rows hold the whole vocabulary
    ids5, lps5 = topk(o, 5)
    assert dense_from_topk(ids5, lps5) is None  # top-5 rows do not
    assert np.array_equal(lps5[:, 0], o.max(axis=1)) and np.all(np.diff(lps5, axis=1) <= 0)


def test_comparators_judge_full_rows_against_the_naive_answer() -> None:
    o, c = distributions(64, 4096, 3, noise=0.02)
    a, b = output("c01", o), output("c01", c, tokens=o.argmax(axis=1))  # b scores a's tokens
    kl, pooled = naive(o, c)
    v = KL(max_mean=1.0).compare(a, b, CASE)
    assert v.status == "pass" and v.evidence["mode"] == "full-vocab"
    assert v.evidence["mean"] == pytest.approx(float(np.maximum(kl, 0).mean()), rel=1e-6)
    n = NMSE(max_nmse=1.0).compare(a, b, CASE)
    assert n.status == "pass" and n.evidence["nmse"] == pytest.approx(pooled, rel=1e-6)
    assert n.evidence["worst_position"] == int(np.argmax(((log_softmax64(c) - log_softmax64(o)) ** 2).sum(1)
                                                         / (log_softmax64(o) ** 2).sum(1)))
    # tighter bars fail, naming the worst position
    assert KL(max_mean=float(kl.mean()) / 2).compare(a, b, CASE).status == "fail"
    assert NMSE(max_nmse=pooled / 2).compare(a, b, CASE).status == "fail"


def test_a_memory_mapped_vocabulary_is_judged_without_a_dict_per_position(tmp_path: Path) -> None:
    n, v = 256, 49152  # smollm2's vocabulary: 50 MB a side
    o, c = distributions(n, v, 4, noise=0.01)
    for name, x in (("o", o), ("c", c)):
        np.save(tmp_path / f"{name}.npy", x)
    om, cm = (np.load(tmp_path / f"{x}.npy", mmap_mode="r") for x in ("o", "c"))
    a, b = output("c01", om), output("c01", cm, tokens=o.argmax(axis=1))
    del o, c
    tracemalloc.start()
    kl = build("kl", {"max_mean": 1.0}).compare_run([a], [b], [CASE])
    nm = build("nmse", {"max_nmse": 1.0}).compare_run([a], [b], [CASE])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert kl.status == nm.status == "pass" and kl.case_id == RUN
    # 12.6 M values a side: a dict per position would need gigabytes, a float64 copy 100 MB
    assert peak < 32 * 2**20, f"peak Python allocation {peak / 2**20:.0f} MiB while judging memory maps"


def test_misplaced_or_unwritten_rows_are_refused_not_judged() -> None:
    o, c = distributions(32, 500, 5)
    a = output("c01", o)
    shifted = np.roll(c, 1, axis=0)  # rows written one position late
    b = output("c01", c, tokens=o.argmax(axis=1))
    bad = Output(b.case_id, b.token_ids, top_ids=b.top_ids, top_logprobs=b.top_logprobs,
                 chosen_logprobs=b.chosen_logprobs, full_logprobs=shifted)
    v = KL().compare(a, bad, CASE)
    assert v.status == "error" and "misplaced or were never written" in v.detail
    zeros = Output(b.case_id, b.token_ids, top_ids=b.top_ids, top_logprobs=b.top_logprobs,
                   chosen_logprobs=b.chosen_logprobs, full_logprobs=np.zeros_like(c))
    assert NMSE().compare(a, zeros, CASE).status == "error"
    # and a golden of rows that are not distributions is degenerate: the gate would be vacuous
    (_, lp) = golden_checks("nmse", Needs(logprobs=True, full_vocab=True),
                            [Output("c01", a.token_ids, top_ids=a.top_ids, top_logprobs=a.top_logprobs,
                                    chosen_logprobs=a.chosen_logprobs, full_logprobs=o + 1.0)])
    assert not lp.ok and "not distributions" in lp.note


def test_planted_perturbations_of_full_rows_fail_and_a_copy_passes() -> None:
    o, _ = distributions(128, 2048, 6, scale=4.0)
    a = output("c01", o)
    for comp, plant in ((KL(max_mean=1e-3), plant_kl_shift), (NMSE(max_nmse=5e-4), plant_nmse_noise)):
        p = plant(comp, CASE, a)
        assert not isinstance(p, str) and p.candidate.full_logprobs is not None
        assert comp.compare(p.oracle, p.candidate, CASE).status == "fail", p.note
        assert np.allclose(np.exp(np.asarray(p.candidate.full_logprobs, np.float64)).sum(1), 1, atol=1e-4)
    controls = run_controls(build("drift", {"max_slope_per_1k": 0.02}), unit("drift").controls, [CASE], {"c01": a})
    assert all(c.ok for c in controls), controls
    controls = run_controls(build("nmse", {}), unit("nmse").controls, [CASE], {"c01": a})
    assert all(c.ok for c in controls) and any("full-vocab rows" in c.note for c in controls), controls


def test_top_k_goldens_keep_their_meaning() -> None:
    """Goldens of top-k suites (smoke: top-5; long_horizon: top-20) hold no full rows: NMSE says so
    and KL is the top-k+rest lower bound, as before."""
    o, c = distributions(8, 512, 7)
    a, b = output("c01", o, k=5), output("c01", c, tokens=o.argmax(axis=1), k=5)
    a5 = Output(a.case_id, a.token_ids, top_ids=a.top_ids, top_logprobs=a.top_logprobs,
                chosen_logprobs=a.chosen_logprobs)
    assert NMSE().compare(a5, b, CASE).status == "skip"
    assert KL(max_mean=1.0).compare(a5, b, CASE).evidence["mode"] == "top-k+rest"
    # a top-V golden (every id in every row) is still full-vocab
    ids, lps = topk(o, 512)
    aV = Output(a.case_id, a.token_ids, top_ids=ids, top_logprobs=lps, chosen_logprobs=a.chosen_logprobs)
    assert KL(max_mean=1.0).compare(aV, b, CASE).evidence["mode"] == "full-vocab"


def test_suites_ask_for_the_whole_vocabulary_by_name(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    s = load_suite(root / "suites" / "ab_smoke.toml")
    assert s.sampling.full_vocab and s.sampling.logprobs == FULL_TOP_K
    assert s.sampling.to_json()["full_vocab"] is True
    assert "full_vocab" not in Sampling(max_tokens=4).to_json()  # top-k suites' goldens read as before
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nversion = 1\n[sampling]\nmax_tokens = 4\nlogprobs = "all"\n'
                   '[compare.strict]\n[[cases]]\nid = "a"\ntext = "x"\n')
    with pytest.raises(SuiteError, match=r"bad.toml: \[sampling\].logprobs: expected an integer >= 0 or \"full\""):
        load_suite(bad)
