"""Compiled kernels for whole-vocabulary rows: every per-row fact of two ``[n, V]`` arrays in one pass.

:func:`full_rows` reads each value of both arrays once and answers what
:func:`harness.compare.kernels.full.row_facts` answers with numpy (same formulas, same float64 accumulation):
``log sum exp`` of each side, ``D = sum p (c - o)``, ``sum d``, ``sum d^2``, ``sum o``, ``sum o^2``
and each side's top id. Rows are spread over numba's threads; each row goes through in blocks of
:data:`BLOCK` values that stay in the L1 cache, in three loops the compiler vectorises:

1. :func:`_exp_block`, per side: convert to float64, clamp at ``LOG_FLOOR``, the fraction of
   ``exp``, and the block's maximum (over the float bits read as ordered integers: LLVM vectorises
   an integer maximum, not a float one);
2. :func:`_exp_scale`: put the exponent into the results (integer adds on the bits);
3. :func:`_sums`: accumulate the seven sums (reassociated float64 sums: fastmath).

Why not ``math.exp``: numba calls the C library's scalar ``exp`` for it (no vector maths library
is installed with it), which held the facts at 6.5 ns a value pair; numpy's SIMD ``exp`` needs a
float64 temporary and a pass of its own. The ``exp`` here is the classic one: ``x = k ln2 + r``
(Cody-Waite, two-part ln2), ``exp(r)`` on ``|r| <= ln2/2`` by a Chebyshev fit of degree 11 (Estrin's
scheme), ``2^k`` put into the exponent bits: within 2 ulp of numpy's ``exp`` (the tests check).

Values are shifted by a running per-row maximum only when a block holds a value more than
:data:`SHIFT_AT` above the current shift (never for logprobs, whose maximum is about 0; the block
is then done again), so rows of raw logits do not overflow.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np

numba: Any = None
"""Imported on first use (:func:`compiled`): ``import harness.compare`` must not pay for it."""

LOG_FLOOR = -69.0
BLOCK = 512
"""Values per block of a row: six float64 scratch arrays of 4 KiB each stay in L1."""
SHIFT_AT = 64.0
"""A block whose maximum exceeds the row's shift by this much moves the shift (no overflow below
exp(64 + 64))."""
EXP_MIN = -708.0
"""exp of anything lower is taken as exp(-708) (~3e-308), negligible beside the row's maximum."""
EXP_MAX = 700.0
"""exp arguments are capped here: a block whose values run that far above the row's shift is done
again with a new shift (raw logits), so the capped values are never summed."""

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 with its low 28 bits cleared: k * _LN2_HI is exact for |k| < 2^24
_LN2_LO = 1.9082149292705877e-10
_MAGIC = 6755399441055744.0  # 1.5 * 2^52: t + _MAGIC rounds t to an integer held in the low bits
# exp(r) on |r| <= ln2/2: a Chebyshev fit of degree 11 (mpmath.chebyfit), within 1.01 ulp of exp
_C2, _C3, _C4, _C5 = 0.5000000000000019, 0.1666666666666668, 0.04166666666648795, 0.008333333333319589
_C6, _C7, _C8 = 0.0013888888952352863, 0.00019841269890076403, 2.4801485441561313e-05
_C9, _C10, _C11 = 2.755724088722987e-06, 2.763265472252779e-07, 2.5110049204818658e-08


def _as_float(key, bits) -> float:  # noqa: ANN001
    """The float32 whose ordered-integer key (:func:`_exp_block`) is ``key``, as float64, clamped at
    ``LOG_FLOOR``. ``bits``: a 1-value int32 scratch array."""
    bits[0] = key ^ ((key >> 31) & 0x7FFFFFFF)
    x = np.float64(bits.view(np.float32)[0])
    return LOG_FLOOR if x < LOG_FLOOR else x


def _exp_block(src, shift, xs, ps, tags) -> int:  # noqa: ANN001
    """``xs = max(float64(src), LOG_FLOOR)`` (NaN stays NaN), ``ps = exp(r)`` and ``tags`` = the
    rounded ``(xs - shift) / ln2`` in its low bits; returns the largest value of ``src`` as its
    float bits read as an ordered integer (``b ^ ((b >> 31) & 0x7FFFFFFF)`` sorts float32 like the
    floats: the compiler vectorises an integer maximum, not a float one; a NaN row's sums are NaN,
    and :func:`full_rows` recomputes it with numpy). No reassociation (``(t + MAGIC) - MAGIC`` must
    round, not cancel); contraction into fused multiply-adds only."""
    bits = src.view(np.int32)
    m = -(1 << 31)
    for j in range(src.size):
        m = max(m, bits[j] ^ ((bits[j] >> 31) & 0x7FFFFFFF))
        x = np.float64(src[j])
        x = LOG_FLOOR if x < LOG_FLOOR else x
        xs[j] = x
        e = x - shift
        e = EXP_MIN if e < EXP_MIN else (EXP_MAX if e > EXP_MAX else e)
        tm = e * _LOG2E + _MAGIC
        k = tm - _MAGIC
        r = (e - k * _LN2_HI) - k * _LN2_LO
        r2 = r * r
        # Estrin's scheme: shorter dependency chains than Horner's
        a = 1.0 + r
        b = _C2 + r * _C3
        c = _C4 + r * _C5
        d = _C6 + r * _C7
        f = _C8 + r * _C9
        g = _C10 + r * _C11
        r4 = r2 * r2
        ab = a + r2 * b
        cd = c + r2 * d
        fg = f + r2 * g
        ps[j] = ab + r4 * (cd + r4 * fg)
        tags[j] = tm
    return m


def _exp_scale(out_bits, tag_bits) -> None:  # noqa: ANN001
    """``out *= 2^k``: add ``k << 52`` to the bits (``tag``'s low bits hold k; the rest shifts out)."""
    for j in range(out_bits.size):
        out_bits[j] += tag_bits[j] << 52


def _sums(x, y, p, q, acc) -> None:  # noqa: ANN001
    """Accumulate one block: acc = [S_o, S_c, D, sum d, sum d^2, sum o, sum o^2] (fastmath: any order)."""
    s_o = 0.0
    s_c = 0.0
    dd = 0.0
    sd = 0.0
    sd2 = 0.0
    so = 0.0
    so2 = 0.0
    for j in range(x.size):
        d = y[j] - x[j]
        s_o += p[j]
        s_c += q[j]
        dd += p[j] * d
        sd += d
        sd2 += d * d
        so += x[j]
        so2 += x[j] * x[j]
    acc[0] += s_o
    acc[1] += s_c
    acc[2] += dd
    acc[3] += sd
    acc[4] += sd2
    acc[5] += so
    acc[6] += so2


def _first_at(x, value) -> int:  # noqa: ANN001
    for j in range(x.size):
        if x[j] == value:
            return j
    return 0


def _rows(o, c, out, top) -> None:  # noqa: ANN001
    """out[i] = [log S_o, log S_c, D / S_o, sum d, sum d^2, sum o, sum o^2] (S with the shifts taken
    out), top[i] = [argmax o, argmax c], for every row i of ``o`` and ``c`` ([n, V])."""
    n, v = o.shape
    for i in numba.prange(n):
        x = np.empty(BLOCK)
        y = np.empty(BLOCK)
        p = np.empty(BLOCK)
        q = np.empty(BLOCK)
        tp = np.empty(BLOCK)
        tq = np.empty(BLOCK)
        acc = np.zeros(7)
        bits = np.empty(1, np.int32)
        shift_o = 0.0
        shift_c = 0.0
        best_o = -np.inf
        best_c = -np.inf
        arg_o = 0
        arg_c = 0
        oi, ci = o[i], c[i]
        for lo in range(0, v, BLOCK):
            w = min(BLOCK, v - lo)
            xs, ys, ps, qs, tps, tqs = x[:w], y[:w], p[:w], q[:w], tp[:w], tq[:w]
            ob, cb = oi[lo:lo + w], ci[lo:lo + w]
            mo = _as_float(_exp_block(ob, shift_o, xs, ps, tps), bits)
            mc = _as_float(_exp_block(cb, shift_c, ys, qs, tqs), bits)
            if mo > shift_o + SHIFT_AT:  # raw logits: move the shift, rescale what was summed, redo
                acc[0] *= np.exp(shift_o - mo)
                acc[2] *= np.exp(shift_o - mo)
                shift_o = mo
                _exp_block(ob, shift_o, xs, ps, tps)
            if mc > shift_c + SHIFT_AT:
                acc[1] *= np.exp(shift_c - mc)
                shift_c = mc
                _exp_block(cb, shift_c, ys, qs, tqs)
            if mo > best_o:
                best_o = mo
                arg_o = lo + _first_at(xs, mo)
            if mc > best_c:
                best_c = mc
                arg_c = lo + _first_at(ys, mc)
            _exp_scale(ps.view(np.int64), tps.view(np.int64))
            _exp_scale(qs.view(np.int64), tqs.view(np.int64))
            _sums(xs, ys, ps, qs, acc)
        out[i, 0] = np.log(acc[0]) + shift_o
        out[i, 1] = np.log(acc[1]) + shift_c
        out[i, 2] = acc[2] / acc[0]
        out[i, 3] = acc[3]
        out[i, 4] = acc[4]
        out[i, 5] = acc[5]
        out[i, 6] = acc[6]
        top[i, 0] = arg_o
        top[i, 1] = arg_c


_rows_kernel: Any = None


def compiled() -> Any:
    """The row kernel, compiled on first call (and cached on disk beside this module); None
    without numba. Replaces this module's helper functions by their compiled versions, which the
    kernel calls (and tests may call directly).

    numba's ``workqueue`` threads unless ``NUMBA_THREADING_LAYER`` says otherwise (see
    :func:`harness.compare.kernels.fused._compiled_kernel` for why)."""
    global numba, _rows_kernel, _as_float, _exp_block, _exp_scale, _sums, _first_at
    if _rows_kernel is None and available():
        import numba as nb

        numba = nb
        if "NUMBA_THREADING_LAYER" not in os.environ:  # read at numba's first parallel launch
            nb.config.THREADING_LAYER = "workqueue"
        strict = nb.njit(cache=True, boundscheck=False)
        _as_float, _exp_scale, _first_at = strict(_as_float), strict(_exp_scale), strict(_first_at)
        _exp_block = nb.njit(cache=True, boundscheck=False, fastmath={"contract"})(_exp_block)
        _sums = nb.njit(cache=True, boundscheck=False, fastmath={"reassoc", "nsz", "contract"})(_sums)
        _rows_kernel = nb.njit(parallel=True, cache=True, boundscheck=False)(_rows)
    return _rows_kernel


def available() -> bool:
    """numba is installed (checked without importing it)."""
    return numba is not None or importlib.util.find_spec("numba") is not None


def full_rows(o: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([n, 7] float64 sums, [n, 2] int64 tops)`` of two ``[n, V]`` arrays (see :func:`_rows`)."""
    kern = compiled()
    if kern is None:
        raise RuntimeError("numba is not installed: use harness.compare.kernels.full's numpy path")
    o, c = np.ascontiguousarray(o), np.ascontiguousarray(c)
    n = o.shape[0]
    out = np.empty((n, 7))
    top = np.empty((n, 2), np.int64)
    if n and o.shape[1]:
        kern(o, c, out, top)
    return out, top
