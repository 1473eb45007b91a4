"""Reference transforms: the harness's own implementation of every sampling parameter, applied to
the oracle's raw logits in the order an engine documents, with the tokens its penalties see.

The engines disagree on both, so a reference is always *for a chain* (:data:`CHAINS`):

* ``vllm``: penalties -> temperature -> min_p -> top_k -> top_p (``vllm/v1/sample/sampler.py``:
  ``apply_penalties``, then ``sample``: ``apply_temperature``, the argmax-invariant logits
  processors — min_p —, ``TopKTopPSampler``). The repetition penalty sees the prompt and the
  output, presence and frequency the output only.
* ``transformers``: repetition -> temperature -> top_k -> top_p -> min_p
  (``GenerationMixin._get_logits_processor``); the repetition penalty sees every input id; there is
  no presence or frequency penalty.
* ``llama.cpp``: penalties -> top_k -> typical -> top_p -> min_p -> temperature -> dist
  (``Llama._init_sampler`` of llama-cpp-python 0.3.36; llama.cpp's ``common_sampler`` default chain
  also tempers last). Its penalties see the last 64 tokens the sampler itself drew, never the prompt.

So temperature 0.6 with top-p 0.8 keeps different nuclei in vLLM (top-p on the tempered
distribution) and llama.cpp (top-p on the raw one, tempered after), and min-p with temperature
likewise; a repetition penalty reaches the prompt in vLLM and transformers but only the tokens
llama-cpp-python itself drew.

Every truncation step also reports *borderline* tokens: those whose keep/drop decision would flip if
the engine's float32 arithmetic moved a logit or a cumulative probability by ``tol`` (a top-k cut
between two nearly equal logits, a nucleus whose cumulative mass lands on ``p``). A borderline
token ever drawn is not a support violation, and the fit leaves borderline tokens out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from harness.api import SAMPLER_PARAMETERS, Sampling
from harness.registry import Registry

DEFAULT_TOL = 1e-3
"""Borderline width: nats for a logit cut (top-k, min-p), probability for a cumulative one (top-p)."""


@dataclass(frozen=True, slots=True)
class History:
    """The tokens a penalty may see when the next token is drawn."""

    context: tuple[int, ...]
    """Everything before the drawn token: the request's prompt and the tokens drawn before it."""
    output: tuple[int, ...] = ()
    """The tokens the engine drew itself in this request, before this one."""


@dataclass(frozen=True, slots=True)
class Chain:
    """One engine's documented sampler: the order of its steps and what its penalties see."""

    name: str
    order: tuple[str, ...]
    """Step names (:data:`STEPS`) in the order the engine applies them."""
    repetition_sees: Literal["context", "output"]
    counts_see: Literal["context", "output"]
    """Which tokens the presence and frequency penalties count."""
    window: int | None = None
    """Only the last ``window`` tokens count (llama.cpp's ``last_n``); None: all of them."""
    unsupported: Mapping[str, str] = field(default_factory=dict)
    """Parameter -> why this engine has no such parameter."""
    source: str = ""
    """Where the order is documented (the engine's own source, at the pinned version)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "order": list(self.order),
            "repetition_sees": self.repetition_sees,
            "counts_see": self.counts_see,
            "window": self.window,
            "unsupported": dict(self.unsupported),
            "source": self.source,
        }


CHAINS: Registry[Chain] = Registry("sampler chain")


def _chain(c: Chain) -> Chain:
    return CHAINS.register(c.name, help=" -> ".join(c.order))(c)


VLLM = _chain(
    Chain(
        "vllm",
        ("penalties", "temperature", "min_p", "top_k", "top_p"),
        "context",
        "output",
        source="vllm/v1/sample/sampler.py (0.32): Sampler.forward applies the penalties "
        "(ops/penalties.py: repetition on prompt and output tokens, frequency and presence on "
        "output tokens), then sample(): apply_temperature, the argmax-invariant logits processors "
        "(MinPLogitsProcessor), then TopKTopPSampler (top-k mask, then top-p on its softmax)",
    )
)
TRANSFORMERS = _chain(
    Chain(
        "transformers",
        ("penalties", "temperature", "top_k", "top_p", "min_p"),
        "context",
        "context",
        unsupported={
            "presence_penalty": "transformers' generate has no presence penalty",
            "frequency_penalty": "transformers' generate has no frequency penalty",
        },
        source="transformers GenerationMixin._get_logits_processor: RepetitionPenaltyLogitsProcessor "
        "(every input id), then the sampling warpers Temperature, TopK, TopP, MinP",
    )
)
LLAMA_CPP = _chain(
    Chain(
        "llama.cpp",
        ("penalties", "top_k", "top_p", "min_p", "temperature"),
        "output",
        "output",
        window=64,
        source="llama-cpp-python 0.3.36 Llama._init_sampler: penalties(last_n 64), top_k, typical, top_p, "
        "min_p, temp, dist; the sampler is made per request and accepts only the tokens it drew",
    )
)


@dataclass(frozen=True, slots=True, eq=False)
class Reference:
    """The distribution an engine following ``chain`` must draw the next token from."""

    probs: np.ndarray
    """[V] float64, summing to 1, exactly 0 outside the support."""
    borderline: tuple[int, ...] = ()
    """Tokens whose membership of the support is within ``tol`` of flipping."""
    steps: tuple[str, ...] = ()
    """The steps that changed something, in the order applied."""
    ranked: np.ndarray | None = None
    """The support, most likely first (what the fit's cells are cut from)."""

    @property
    def support(self) -> np.ndarray:
        return np.flatnonzero(self.probs > 0)


def softmax(logits: np.ndarray) -> np.ndarray:
    """float64 softmax over the finite entries (-inf -> 0)."""
    x = np.asarray(logits, np.float64)
    m = np.max(x)
    e = np.exp(x - m)
    return e / e.sum()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    m = np.max(x)
    return x - m - np.log(np.exp(x - m).sum())


Step = Callable[[np.ndarray, Sampling, History, Chain, float], "tuple[np.ndarray, tuple[int, ...]]"]
"""(logits, sampling, history, chain, tol) -> (new logits, borderline tokens). Never in place."""


def seen(history: History, sees: str, window: int | None) -> tuple[int, ...]:
    toks = history.context if sees == "context" else history.output
    return toks[-window:] if window else toks


def penalties(
    x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Repetition (divide a positive logit, multiply a negative one), then frequency and presence
    (subtract ``f * count + p * [count > 0]``), as vLLM's ``apply_penalties`` and llama.cpp's
    ``llama_sampler_penalties_apply`` both do."""
    y = x.copy()
    if s.repetition_penalty != 1.0:
        idx = np.unique(np.asarray(seen(h, c.repetition_sees, c.window), np.int64))
        if idx.size:
            r = float(s.repetition_penalty)
            y[idx] = np.where(y[idx] > 0, y[idx] / r, y[idx] * r)
    if s.presence_penalty or s.frequency_penalty:
        toks = np.asarray(seen(h, c.counts_see, c.window), np.int64)
        if toks.size:
            counts = np.bincount(toks, minlength=y.size)[: y.size].astype(np.float64)
            y -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0)
    return y, ()


def temperature(
    x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float
) -> tuple[np.ndarray, tuple[int, ...]]:
    if s.temperature <= 0:
        raise ValueError("the sampling gate draws with temperature > 0 (0 is greedy: the parity gates)")
    return (x / float(s.temperature) if s.temperature != 1.0 else x), ()


def top_k(x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float) -> tuple[np.ndarray, tuple[int, ...]]:
    """Keep every token whose logit is at least the k-th largest (ties at the cut kept)."""
    k = int(s.top_k)
    finite = np.isfinite(x)
    if k <= 0 or k >= int(finite.sum()):
        return x, ()
    vals = np.sort(x[finite])[::-1]
    cut, nxt = vals[k - 1], vals[k]
    y = np.where(x >= cut, x, -np.inf)
    border: tuple[int, ...] = ()
    if cut - nxt <= tol:
        border = tuple(int(i) for i in np.flatnonzero(finite & (x >= nxt - tol) & (x <= cut + tol)))
    return y, border


def top_p(x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float) -> tuple[np.ndarray, tuple[int, ...]]:
    """Keep the most likely tokens until their mass reaches ``p``: a token is kept when the mass
    of the tokens before it (most likely first) is below ``p`` (at least one is kept)."""
    p = float(s.top_p)
    if p >= 1.0:
        return x, ()
    probs = softmax(x)
    order = np.argsort(-probs, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(probs[order])[:-1]])
    keep = before < p
    keep[0] = True
    y = np.full_like(x, -np.inf)
    y[order[keep]] = x[order[keep]]
    live = probs[order] > 0
    border = tuple(int(t) for t in order[(np.abs(before - p) <= tol) & live])
    return y, border


def min_p(x: np.ndarray, s: Sampling, h: History, c: Chain, tol: float) -> tuple[np.ndarray, tuple[int, ...]]:
    """Keep the tokens with ``p_i >= min_p * p_max``: ``logit_i >= logit_max + log(min_p)``."""
    m = float(s.min_p)
    if m <= 0.0:
        return x, ()
    thr = np.max(x) + np.log(m)
    y = np.where(x >= thr, x, -np.inf)
    border = tuple(int(i) for i in np.flatnonzero(np.isfinite(x) & (np.abs(x - thr) <= tol)))
    return y, border


STEPS: Mapping[str, Step] = {
    "penalties": penalties,
    "temperature": temperature,
    "top_k": top_k,
    "top_p": top_p,
    "min_p": min_p,
}


def transform(
    logits: np.ndarray,
    s: Sampling,
    history: History,
    chain: Chain,
    *,
    tol: float = DEFAULT_TOL,
    steps: Mapping[str, Step] | None = None,
    order: Sequence[str] | None = None,
) -> Reference:
    """The distribution ``chain`` draws the next token from, given the raw ``logits`` of the
    position, the parameters ``s`` and the tokens a penalty may see.

    ``steps`` replaces step functions and ``order`` the chain's order: the planted samplers
    (:mod:`harness.kinds.sampling.doubles`) are this same code with one step wrong."""
    impl = {**STEPS, **(steps or {})}
    x = np.asarray(logits, np.float64).copy()
    border: set[int] = set()
    ran = []
    for name in order or chain.order:
        y, b = impl[name](x, s, history, chain, tol)
        if y is not x and not np.array_equal(y, x):
            ran.append(name)
        # a later step cannot un-drop a token, so borderline tokens of a step are the ones it decided
        border |= set(b)
        x = y
    probs = softmax(x)
    probs[~np.isfinite(x)] = 0.0
    probs /= probs.sum()
    support = np.flatnonzero(probs > 0)
    return Reference(
        probs, tuple(sorted(border)), tuple(ran), support[np.argsort(-probs[support], kind="stable")]
    )


def changed_by(s: Sampling) -> tuple[str, ...]:
    """The parameters of ``s`` that are not at their neutral value."""
    neutral = Sampling(1, temperature=1.0)
    return tuple(p for p in SAMPLER_PARAMETERS if getattr(s, p) != getattr(neutral, p))
