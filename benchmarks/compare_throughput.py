"""Micro-benchmark: positions/s of the vectorised comparators vs a per-token Python loop.

    python benchmarks/compare_throughput.py [--positions 1000000] [--k 5] [--json]

Synthetic run: ``positions`` positions split into sequences of 1000, top-``k`` logprobs on both
sides, the candidate a noisy copy of the oracle (so some tokens flip at near-ties). Timed:

* vectorised: strict + near-tie (whole-run kernels of :mod:`harness.compare.batch`), vLLM's
  mutual-top-k rule at every position, and KL (top-k+rest) at every position;
* loop: vLLM's ``check_logprobs_close`` rule, one Python iteration per token over the list-of-dicts
  logprobs vLLM returns (built before the clock starts).

Both sides run once, side by side in one process, and must agree on the mutual-top-k rule at every
position. Absolute times depend on the machine: read the ratio. Tests never assert times.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from harness.compare.batch import check_logprobs_close_loop, judge_batch
from harness.compare.kl import kl_topk_rest


@dataclass(frozen=True, slots=True, eq=False)
class Synthetic:
    o_tok: np.ndarray
    o_ids: np.ndarray
    o_lp: np.ndarray
    o_chosen: np.ndarray
    c_tok: np.ndarray
    c_ids: np.ndarray
    c_lp: np.ndarray


def synthetic(positions: int, k: int, seq_len: int = 1000, vocab: int = 32000, noise: float = 0.05,
              seed: int = 0) -> Synthetic:
    rng = np.random.default_rng(seed)
    s = max(1, positions // seq_len)
    shape = (s, seq_len, k)
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(64)])  # id pool
    o_ids = ids[rng.integers(0, 64, size=(s, seq_len))]
    o_lp = np.sort(rng.normal(-3, 2, size=shape), axis=2)[..., ::-1] - 0.05
    o_lp[..., 0] = np.maximum(o_lp[..., 0], -0.05)
    c_raw = o_lp + rng.normal(0, noise, size=shape)
    order = np.argsort(-c_raw, axis=2)
    c_ids = np.take_along_axis(o_ids, order, axis=2)
    c_lp = np.take_along_axis(c_raw, order, axis=2)
    return Synthetic(o_ids[..., 0].copy(), o_ids, o_lp, o_lp[..., 0].copy(), c_ids[..., 0].copy(),
                     c_ids, c_lp)


def vectorised(d: Synthetic, threshold: float = 0.5) -> tuple[np.ndarray, float, float]:
    """(mutual-top-k per position, strict share, mean KL)."""
    b = judge_batch(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, d.c_tok, d.c_ids, threshold)
    k = d.o_ids.shape[2]
    kl = kl_topk_rest(d.o_ids.reshape(-1, k), d.o_lp.reshape(-1, k), d.c_ids.reshape(-1, k),
                      d.c_lp.reshape(-1, k))
    return b.mutual_topk, float(b.strict.mean()), float(kl.mean())


def same_work_loop(o_tok: list, c_tok: list, o_d: list, c_d: list, threshold: float = 0.5
                   ) -> tuple[list[bool], list[bool], float]:
    """strict + near-tie + KL (top-k+rest), one Python iteration per token: the vectorised work,
    written the way a per-token comparator would be. (strict per sequence, near-tie per sequence,
    mean KL.)"""
    strict, tie, total, n = [], [], 0.0, 0
    for ot, ct, ol, cl in zip(o_tok, c_tok, o_d, c_d, strict=True):
        first = next((i for i, (a, b) in enumerate(zip(ot, ct, strict=True)) if a != b), None)
        strict.append(first is None)
        if first is None:
            tie.append(True)
        else:
            lp = ol[first].get(ct[first])
            tie.append(lp is not None and ol[first][ot[first]] - lp <= threshold)
        for po, pc in zip(ol, cl, strict=True):
            kl, ps, qs = 0.0, 0.0, 0.0
            for tid, a in po.items():
                b = pc.get(tid)
                if b is not None:
                    pa = math.exp(a)
                    kl += pa * (a - b)
                    ps += pa
                    qs += math.exp(b)
            rest_p, rest_q = max(1.0 - ps, 0.0), max(1.0 - qs, 1e-30)
            if rest_p > 0:
                kl += rest_p * math.log(rest_p / rest_q)
            total += max(kl, 0.0)
            n += 1
    return strict, tie, total / max(n, 1)


def as_dicts(ids: np.ndarray, lp: np.ndarray) -> list[list[dict[int, float]]]:
    return [[dict(zip(r_i.tolist(), r_l.tolist(), strict=True)) for r_i, r_l in zip(s_i, s_l, strict=True)]
            for s_i, s_l in zip(ids, lp, strict=True)]


def run(positions: int, k: int) -> dict[str, float]:
    d = synthetic(positions, k)
    n = int(d.o_tok.size)
    t0 = time.perf_counter()
    mutual, strict_share, mean_kl = vectorised(d)
    t_vec = time.perf_counter() - t0
    o_tok, c_tok = d.o_tok.tolist(), d.c_tok.tolist()
    o_d, c_d = as_dicts(d.o_ids, d.o_lp), as_dicts(d.c_ids, d.c_lp)
    t0 = time.perf_counter()
    loop = check_logprobs_close_loop(o_tok, c_tok, o_d, c_d)
    t_loop = time.perf_counter() - t0
    if not np.array_equal(np.asarray(loop, bool), mutual):
        raise SystemExit("the vectorised rule and the per-token loop disagree: a bug, not a benchmark")
    t0 = time.perf_counter()
    rule_only = judge_batch(d.o_tok, d.o_ids, d.o_lp, d.o_chosen, d.c_tok, d.c_ids).mutual_topk
    t_rule = time.perf_counter() - t0
    t0 = time.perf_counter()
    strict_l, _, kl_l = same_work_loop(o_tok, c_tok, o_d, c_d)
    t_same = time.perf_counter() - t0
    if abs(kl_l - mean_kl) > 1e-6 * max(1.0, mean_kl) or float(np.mean(strict_l)) != strict_share:
        raise SystemExit("the vectorised KL/strict and the per-token loop disagree: a bug")
    del rule_only
    return {"positions": n, "k": k, "vectorised_s": t_vec, "loop_s": t_loop,
            "vectorised_positions_per_s": n / t_vec, "loop_positions_per_s": n / t_loop,
            "ratio": t_loop / t_vec, "rule_only_vectorised_s": t_rule, "rule_only_ratio": t_loop / t_rule,
            "same_work_loop_s": t_same, "same_work_ratio": t_same / t_vec,
            "strict_share": strict_share, "mean_kl": mean_kl, "mutual_topk_share": float(mutual.mean())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = run(a.positions, a.k)
    if a.json:
        print(json.dumps(r, sort_keys=True))
        return 0
    print(f"{r['positions']:,} positions, k={r['k']}")
    print(f"  vectorised  strict + near-tie + vLLM rule + KL : {r['vectorised_s']:.3f} s  "
          f"{r['vectorised_positions_per_s']:,.0f} positions/s")
    print(f"  loop        vLLM check_logprobs_close rule     : {r['loop_s']:.3f} s  "
          f"{r['loop_positions_per_s']:,.0f} positions/s")
    print(f"  ratio (loop time / vectorised time)            : {r['ratio']:.2f}x")
    print("  context, same data, same process:")
    print(f"    vLLM rule alone, vectorised                  : {r['rule_only_vectorised_s']:.3f} s  "
          f"-> loop / vectorised {r['rule_only_ratio']:.1f}x (same work)")
    print(f"    strict + near-tie + KL as a per-token loop   : {r['same_work_loop_s']:.3f} s  "
          f"-> loop / vectorised {r['same_work_ratio']:.1f}x (same work)")
    print(f"  (strict {100 * r['strict_share']:.1f}% of sequences, mean KL {r['mean_kl']:.3g}, "
          f"mutual top-{r['k']} {100 * r['mutual_topk_share']:.2f}% of positions; both sides agree)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
