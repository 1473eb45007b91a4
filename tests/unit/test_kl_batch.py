"""Whole-run kernels agree with the per-case comparators and with the per-token loop; the
micro-benchmark runs (its times are never asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from harness.api import Case, Output
from harness.compare.kernels.batch import check_logprobs_close_loop, judge_batch
from harness.compare.near_tie import NearTie
from harness.compare.strict import Strict

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("compare_throughput",
                                                  ROOT / "benchmarks" / "compare_throughput.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernels_agree_with_the_per_case_comparators() -> None:
    bench = _benchmark()
    d = bench.synthetic(40 * 50, k=5, seq_len=50, noise=0.3, seed=3)
    b = judge_batch(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, d.c_tok, d.c_ids, threshold=0.5)
    assert 0 < b.strict.sum() < b.near_tie.sum() < len(b.strict)  # every kind of verdict occurs
    for s in range(d.o_tok.shape[0]):
        case = Case(f"s{s}", (1,))
        o = Output(case.id, tuple(d.o_tok[s].tolist()), top_ids=d.o_ids[s].astype(np.int32),
                   top_logprobs=d.o_lp[s].astype(np.float32),
                   chosen_logprobs=d.o_chosen[s].astype(np.float32))
        c = Output(case.id, tuple(d.c_tok[s].tolist()))
        assert (Strict().compare(o, c, case).status == "pass") == bool(b.strict[s])
        assert (NearTie(0.5).compare(o, c, case).status == "pass") == bool(b.near_tie[s]), s


def test_vllm_rule_kernel_equals_the_per_token_loop() -> None:
    bench = _benchmark()
    d = bench.synthetic(3000, k=3, seq_len=100, noise=1.5, seed=4)  # loud: some tokens leave top-3
    b = judge_batch(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, d.c_tok, d.c_ids)
    loop = check_logprobs_close_loop(d.o_tok.tolist(), d.c_tok.tolist(), bench.as_dicts(d.o_ids, d.o_lp),
                                     bench.as_dicts(d.c_ids, d.c_lp))
    assert np.array_equal(np.asarray(loop), b.mutual_topk)


def test_benchmark_runs_and_both_sides_agree() -> None:
    r = _benchmark().run(20_000, 5, repeats=1, loop_positions=20_000)  # aborts if any side disagrees
    assert r["positions"] == r["loop_positions"] == 20_000
    assert r["fused_over_loop"] > 0 and r["fused_over_numpy"] > 0 and r["kl_max_gap_vs_loop"] <= 1e-9
    assert 0 < r["mean_kl"] < 1
