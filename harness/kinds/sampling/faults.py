"""The planted faults of the sampling gate: the reference transform's own code
(:func:`harness.sampling.transforms.transform`) with one step replaced or moved, and what each one
does to a test's distribution.

The planner (:mod:`harness.kinds.sampling.plan`) uses them to choose, per setting, the position where
every fault of that setting moves the distribution visibly (:func:`visible_tv`) and to size its
draws by the power against the weakest (:func:`power_against_fault`); the doubles
(:mod:`harness.kinds.sampling.doubles`) draw from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from harness.api import Sampling
from harness.kinds.sampling import gof
from harness.sampling.transforms import (
    Chain,
    History,
    Reference,
    Step,
    penalties,
    softmax,
    top_k,
    top_p,
    transform,
)


def _top_p_plus_one(
    x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float
) -> tuple[np.ndarray, tuple[int, ...]]:
    y, border = top_p(x, s, h, c, tol)
    out = np.isfinite(x) & ~np.isfinite(y)
    if out.any():
        extra = int(np.flatnonzero(out)[np.argmax(x[out])])
        y = y.copy()
        y[extra] = x[extra]
    return y, border


def _top_k_plus_one(
    x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float
) -> tuple[np.ndarray, tuple[int, ...]]:
    return top_k(x, Sampling(1, top_k=s.top_k + 1) if s.top_k > 0 else s, h, c, tol)


def _no_temperature(
    x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float
) -> tuple[np.ndarray, tuple[int, ...]]:
    return x, ()


def _wrong_sign(
    x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float
) -> tuple[np.ndarray, tuple[int, ...]]:
    flipped = Sampling(
        1,
        repetition_penalty=1.0 / s.repetition_penalty,
        presence_penalty=-s.presence_penalty,
        frequency_penalty=-s.frequency_penalty,
    )
    return penalties(x, flipped, h, c, tol)


def _min_p_absolute(
    x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float
) -> tuple[np.ndarray, tuple[int, ...]]:
    if s.min_p <= 0:
        return x, ()
    p = softmax(x)
    keep = p >= s.min_p
    keep[np.argmax(x)] = True  # like every min-p, it keeps at least one token
    return np.where(keep, x, -np.inf), ()


def _temperature_moved(chain: Chain) -> tuple[str, ...]:
    """The chain's order with temperature on the other side of the truncations: after top-p where
    the chain tempers first (vLLM, transformers), right after the penalties where it tempers last
    (llama.cpp)."""
    rest = [s for s in chain.order if s != "temperature"]
    first_cut = min(chain.order.index(s) for s in ("top_k", "top_p", "min_p"))
    if chain.order.index("temperature") < first_cut:
        return (*rest, "temperature")
    return (rest[0], "temperature", *rest[1:])


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    params: tuple[str, ...]
    """The parameters (verdicts ``sampling.<param>``) it must fail."""
    steps: Mapping[str, Step] | None = None
    order: Callable[[Chain], tuple[str, ...]] | None = None

    def label(self, chain: Chain) -> str:
        if self.order is not None and chain.order.index("temperature") > chain.order.index("top_p"):
            return "temperature applied before top-p instead of after"
        return self.name


FAULTS: tuple[Fault, ...] = (
    Fault("top-p keeps one token too many", ("top_p",), {"top_p": _top_p_plus_one}),
    Fault("temperature applied after top-p instead of before", ("order",), order=_temperature_moved),
    Fault(
        "penalty with the wrong sign",
        ("repetition_penalty", "presence_penalty", "frequency_penalty"),
        {"penalties": _wrong_sign},
    ),
    Fault(
        "min-p relative to the wrong probability (the total, not the most likely token's)",
        ("min_p",),
        {"min_p": _min_p_absolute},
    ),
    Fault("top-k keeps one token too many", ("top_k",), {"top_k": _top_k_plus_one}),
    Fault("temperature not applied", ("temperature",), {"temperature": _no_temperature}),
)


def references(
    rows: Sequence[np.ndarray],
    s: Sampling,
    prefix: Sequence[int],
    path: Sequence[int],
    chain: Chain,
    tol: float,
    fault: Fault | None = None,
) -> tuple[Reference, ...]:
    """The distribution of the token drawn at each step (``len(path) + 1`` of them) from
    ``prefix``, the engine following ``path`` before the judged one: ``rows[j]`` are the oracle's
    raw logits after ``prefix + path[:j]``; with ``fault``, the planted sampler's."""
    out = []
    for j in range(len(path) + 1):
        hist = History(tuple(prefix) + tuple(path[:j]), tuple(path[:j]))
        out.append(
            transform(
                rows[j],
                s,
                hist,
                chain,
                tol=tol,
                steps=fault.steps if fault else None,
                order=fault.order(chain) if fault and fault.order else None,
            )
        )
    return tuple(out)


def visible(ref: Reference) -> np.ndarray:
    """[V] bool: the tokens whose draws the judge counts (every token but the borderline ones)."""
    keep = np.ones(ref.probs.size, bool)
    keep[list(ref.borderline)] = False
    return keep


def visible_tv(ref: Reference, alt: Reference) -> float:
    """The total-variation distance the judge can see between a test's reference and a fault's
    distribution: both restricted to the tokens that are not borderline and renormalised (a draw
    of a borderline token is neither a violation nor in the fit), mass outside the support
    included (the support check's)."""
    keep = visible(ref)
    q, a = ref.probs[keep], alt.probs[keep]
    if q.sum() <= 0 or a.sum() <= 0:
        return 0.0
    return 0.5 * float(np.abs(q / q.sum() - a / a.sum()).sum())


def path_probability(refs: Sequence[Reference], path: Sequence[int]) -> float:
    return float(np.prod([refs[j].probs[tok] for j, tok in enumerate(path)])) if path else 1.0


def power_against_fault(
    refs: Sequence[Reference],
    alt: Sequence[Reference],
    path: Sequence[int],
    judged: int,
    draws: int,
    level: float,
    min_expected: float,
    max_cells: int,
    planned: gof.Cells | None = None,
) -> float:
    """The probability that a test (``draws`` requested, the first ``judged`` on the path fitted)
    fails a sampler drawing from ``alt``: the fit's power on the draws that follow the path under
    ``alt``, or the support checks' (a draw of ``alt``'s mass outside the support, at the judged
    step or an earlier one), whichever is larger."""
    ref = refs[-1]
    p_alt = path_probability(alt, path)
    n_eff = min(judged, int(draws * p_alt))
    q = ref.probs
    outside = (q <= 0) & visible(ref)
    cells = (
        planned
        if planned is not None and n_eff == planned.n
        else gof.cells_for(q, n_eff, min_expected, max_cells, ref.ranked)
    )
    p_test = gof.power_against(cells, q, alt[-1].probs, level, outside)
    for j in range(len(path)):  # a draw outside an earlier step's support fails the test too
        on = path_probability(alt, path[:j])
        leak = float(alt[j].probs[(refs[j].probs <= 0) & visible(refs[j])].sum()) * on
        p_test = max(p_test, 1.0 - (1.0 - leak) ** draws)
    return p_test


def of(param: str) -> tuple[Fault, ...]:
    """The planted faults that must fail the verdicts of ``param``."""
    return tuple(f for f in FAULTS if param in f.params)
