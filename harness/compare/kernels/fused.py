"""One pass over a whole run: strict, near-tie, vLLM's mutual-top-k rule and top-k KL at every position.

:func:`judge_run` takes a run of equal-length sequences as arrays (``[S, L]`` tokens, ``[S, L, k]``
top-k ids and logprobs, the dtypes the engines return: int32 / float32) and answers, in one
compiled loop per sequence (numba, sequences spread over the cores):

* the first divergent position of each sequence, hence strict;
* near-tie at that position: the candidate's token in the oracle's top-k within ``threshold`` nats
  of the oracle's chosen logprob;
* vLLM's ``check_logprobs_close`` rule at every position (each side's token in the other's top-k);
* KL(oracle || candidate) over {the ids both sides hold} + {rest} at every position, in float64,
  the same arithmetic as :func:`harness.compare.kl.kl_topk_rest` and the per-token loop.

Why compiled: numpy needs a dozen whole-array passes for the top-k lookup alone (k passes of
compare-and-copy over ``[n, k]``), and that, not arithmetic, held it at 3-5 M positions/s on
2 cores. The probabilities ``exp(logprob)`` are taken first by numpy (SIMD float64 exp, two passes),
the rest in the loop. Without numba the same answers come from the numpy kernels
(:func:`harness.compare.kernels.batch.judge_batch` and ``kl_topk_rest``).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; the numpy path still answers
    numba = None  # type: ignore[assignment]

REST_FLOOR = 1e-30


@dataclass(frozen=True, slots=True, eq=False)
class RunVerdicts:
    first_divergence: np.ndarray
    """[S] first position where the tokens differ; L when they never do."""
    strict: np.ndarray
    """[S] bool."""
    near_tie: np.ndarray
    """[S] bool."""
    mutual_topk: np.ndarray
    """[S, L] bool: vLLM's rule at every position."""
    kl: np.ndarray
    """[S, L] float64 KL(oracle || candidate), top-k + rest (a lower bound of the full-vocab KL)."""


def _kernel(o_tok, c_tok, o_ids, o_lp, o_chosen, c_ids, c_lp, p, q, threshold,  # noqa: ANN001
            kl, mutual, first, near) -> None:
    s_n, length, k = o_ids.shape
    for s in numba.prange(s_n):
        f = length
        for t in range(length):
            ot = o_tok[s, t]
            ct = c_tok[s, t]
            if f == length and ot != ct:
                f = t
            in_o = False
            in_c = False
            shared = 0.0
            ps = 0.0
            qs = 0.0
            for i in range(k):
                oi = o_ids[s, t, i]
                if oi == ct:
                    in_o = True
                if c_ids[s, t, i] == ot:
                    in_c = True
                for j in range(k):
                    if c_ids[s, t, j] == oi:  # ids are unique within a row: one match at most
                        pa = p[s, t, i]
                        a = max(np.float64(o_lp[s, t, i]), -69.0)
                        b = max(np.float64(c_lp[s, t, j]), -69.0)
                        shared += pa * (a - b)
                        ps += pa
                        qs += q[s, t, j]
                        break
            mutual[s, t] = in_o and in_c
            p_rest = min(max(1.0 - ps, 0.0), 1.0)
            q_rest = min(max(1.0 - qs, REST_FLOOR), 1.0)
            rest = p_rest * math.log(max(p_rest, REST_FLOOR) / q_rest) if p_rest > 0.0 else 0.0
            kl[s, t] = max(shared + rest, 0.0)
        first[s] = f
        if f == length:
            near[s] = True
        else:
            hit = False
            best = -np.inf
            for i in range(k):
                if o_ids[s, f, i] == c_tok[s, f]:
                    hit = True
                    best = max(best, np.float64(o_lp[s, f, i]))
            near[s] = hit and (np.float64(o_chosen[s, f]) - best <= threshold)


_compiled = None


def _compiled_kernel():  # noqa: ANN202
    """The numba kernel, compiled on first use (cached on disk beside this module).

    numba's ``workqueue`` threads, unless ``NUMBA_THREADING_LAYER`` says otherwise: OpenMP's spin
    after each parallel region, which on a small host shared with engines cost a quarter of the
    rate (22-24 against 28-30 M positions/s, measured side by side on 2 cores)."""
    global _compiled
    if _compiled is None and numba is not None:
        import os

        if "NUMBA_THREADING_LAYER" not in os.environ:  # read once, at numba's first parallel launch
            numba.config.THREADING_LAYER = "workqueue"
        _compiled = numba.njit(parallel=True, cache=True, boundscheck=False)(_kernel)
    return _compiled


def probabilities(lp: np.ndarray) -> np.ndarray:
    """``exp(lp)`` in float64 (numpy's SIMD exp: one cast pass, one exp pass; -inf gives 0)."""
    p = np.array(lp, dtype=np.float64)
    return np.exp(p, out=p)


def judge_run(o_tok: np.ndarray, o_ids: np.ndarray, o_lp: np.ndarray, o_chosen: np.ndarray,
              c_tok: np.ndarray, c_ids: np.ndarray, c_lp: np.ndarray, threshold: float = 0.5,
              compiled: bool = True) -> RunVerdicts:
    """Every verdict of a run in one pass. ``compiled`` False runs the numpy kernels instead (same
    answers; the tests hold both to the per-token loop)."""
    s_n, length, k = o_ids.shape
    kern = _compiled_kernel() if compiled else None
    if kern is None:
        from harness.compare.kernels.batch import judge_batch
        from harness.compare.kl import kl_topk_rest

        b = judge_batch(o_tok, o_ids, o_lp, o_chosen, c_tok, c_ids, threshold)
        o64, c64 = (np.maximum(np.asarray(x, np.float64), -69.0).reshape(-1, k) for x in (o_lp, c_lp))
        kl = kl_topk_rest(o_ids.reshape(-1, k), o64, c_ids.reshape(-1, k), c64).reshape(s_n, length)
        return RunVerdicts(b.first_divergence, b.strict, b.near_tie, b.mutual_topk, kl)
    kl = np.empty((s_n, length))
    mutual = np.empty((s_n, length), np.bool_)
    first = np.empty(s_n, np.int64)
    near = np.empty(s_n, np.bool_)
    with ThreadPoolExecutor(1) as pool:  # numpy's exp is single-threaded and frees the GIL: one side each
        p_future = pool.submit(probabilities, o_lp)
        q = probabilities(c_lp)
        p = p_future.result()
    kern(np.ascontiguousarray(o_tok), np.ascontiguousarray(c_tok), np.ascontiguousarray(o_ids),
         np.ascontiguousarray(o_lp), np.ascontiguousarray(o_chosen), np.ascontiguousarray(c_ids),
         np.ascontiguousarray(c_lp), p, q, float(threshold), kl, mutual, first, near)
    return RunVerdicts(first, first == length, near, mutual, kl)
