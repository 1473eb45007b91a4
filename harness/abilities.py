"""What an engine can do beyond generating: the optional abilities of the one
:class:`~harness.api.Runner`, beside the contracts of :mod:`harness.api` (read that first).

An engine opts into an ability by implementing its protocol beside the :class:`~harness.api.Runner`
methods; the pipeline asks ``isinstance(runner, Ability)``, never ``getattr``:

* :class:`Scorer` — teacher forcing: score given sequences in the same engine start;
* :class:`TensorSource` — logits and hidden states; every engine declares its
  :class:`TensorAbility`, with the reason where it has none;
* :class:`SpeedLevels` — replay a workload at several concurrencies in one start;
* :class:`Sampler` — draw seeded samples with the engine's own sampler (the sampling gate), with
  what that sampler promises (:class:`SamplerTraits`);
* :class:`ServesOpenAI` — answer the OpenAI API at an :class:`Endpoint` (the API gate);
* :class:`Preflight` — check in seconds, before anything starts, what would make ``start`` fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # types only
    from harness.api import Case, Output, Sampling
    from harness.speed import Speed


@runtime_checkable
class Scorer(Protocol):
    """Optional ability: score given sequences (teacher forcing), in the same engine start.

    Once greedy outputs diverge nothing after the divergence compares, so a distribution comparator
    asks the candidate for its next-token distribution at every position of *prompt + oracle
    continuation*. Scores go through the path the engine decodes with (vLLM: ``prompt_logprobs``;
    transformers with a quantized KV cache: one token per step). An engine without this ability is
    judged until its first divergence, and every report says so.
    """

    def run_and_score(self, cases: Sequence[Case], sampling: Sampling,
                      continuations: Mapping[str, Sequence[int]] | None, k: int
                      ) -> tuple[list[Output], list[Output]]:
        """Generate every case as :meth:`~harness.api.Runner.run` does, then score
        ``prompt + continuations[id]`` (``continuations`` None: score its own generations, the
        control of an A/B arm).

        A score is an :class:`~harness.api.Output` whose ``token_ids`` are the continuation and whose rows are
        the engine's top-``k`` logprobs before each of its tokens; ``chosen_logprobs`` are the
        logprobs of the continuation's tokens. With ``sampling.full_vocab`` the score also holds
        the whole distributions (``full_logprobs``), as arrays.
        """
        ...


TensorKind = Literal["continuation", "layers"]
"""What :class:`TensorSource` can return: ``continuation`` (:meth:`TensorSource.capture_tensors`) or
``layers`` (:meth:`TensorSource.capture_layers`)."""


@dataclass(frozen=True, slots=True)
class TensorAbility:
    """What an engine can expose of its forward pass, known before it starts: every engine of this
    tree declares it, and one that cannot says why (a server that answers tokens and logprobs only,
    a model family whose sub-blocks the taps do not know)."""

    continuation: bool = False
    """:meth:`TensorSource.capture_tensors`: logits and per-layer hidden states at continuation
    positions (NMSE of tensors in an A/B, a trainer's logits)."""
    layers: bool = False
    """:meth:`TensorSource.capture_layers`: each layer's sub-block stream, the final norm and the
    logits at every position of a sequence (localizing where two engines part)."""
    why_not: Mapping[str, str] = field(default_factory=dict)
    """``continuation`` / ``layers`` -> why the engine cannot return it."""
    note: str = ""
    """How it captures (e.g. "hooks in vLLM's worker process, eager mode"), for the record."""

    def can(self, kind: TensorKind) -> bool:
        return bool(self.continuation if kind == "continuation" else self.layers)

    def reason(self, kind: TensorKind) -> str:
        return self.why_not.get(kind) or f"the engine declares no {kind} tensors"


@runtime_checkable
class TensorSource(Protocol):
    """The engine's declaration of what it can expose of its forward pass (:meth:`tensor_ability`)
    and the captures themselves. Engines that cannot expose tensors implement it too, to say why;
    their captures raise :class:`~harness.api.EngineRefused` with that reason. ``start`` comes first, as for
    :meth:`~harness.api.Runner.run`."""

    def tensor_ability(self) -> TensorAbility: ...

    def capture_tensors(self, cases: Sequence[Case], continuations: Mapping[str, Sequence[int]]
                        ) -> dict[str, dict[str, np.ndarray]]:
        """Per case id: ``logits`` and ``hidden.<layer>`` at each continuation position."""
        ...

    def capture_layers(self, sequences: Mapping[str, Sequence[int]]) -> dict[str, dict[str, np.ndarray]]:
        """Teacher forcing, per sequence id (the sequence is token ids, fed whole): at every position,
        ``layer.<i>.attn`` and ``layer.<i>.mlp`` (``.moe``: a mixture-of-experts block) — the residual
        stream after each sub-block —, ``final_norm`` and ``logits``, each ``[positions, width]``
        float32, named alike in every engine (:mod:`harness.engines.launch.layer_taps`). Raises
        :class:`~harness.api.EngineRefused` (the reason) or :class:`~harness.api.EngineFailed` (the
        engine crashed)."""
        ...


@runtime_checkable
class SpeedLevels(Protocol):
    """Optional ability: replay a workload at several concurrencies in one engine start
    (``harness speed``: c1/c4/c8 beside the oracle). Without it an engine is timed once, at its
    own concurrency."""

    def measure_speeds(self, cases: Sequence[Case], sampling: Sampling,
                       levels: Sequence[int]) -> dict[int, Speed]:
        """Concurrency -> the :class:`~harness.speed.Speed` of the whole workload at it (``start``
        first; the runner stays started)."""
        ...


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """``n`` seeded draws of the next ``sampling.max_tokens`` tokens after one prompt, with the
    engine's own sampler (the sampling gate)."""

    key: str
    prompt_ids: tuple[int, ...]
    sampling: Sampling
    """temperature, top-k, top-p, min-p and penalties; ``seed`` is the first draw's seed (draw i:
    ``seed + i`` where the engine seeds requests; one seed per call where it does not)."""
    n: int
    path: tuple[int, ...] = ()
    """The oracle's tokens a draw is judged after: a driver may stop a draw once it leaves them
    (what would follow is never judged)."""


@dataclass(frozen=True, slots=True)
class SamplePass:
    """Requests an engine runs together: ``alone`` runs each draw in a call of its own (the
    determinism lane: a seeded draw must not depend on its batch, where the engine promises it)."""

    name: str
    requests: tuple[SampleRequest, ...]
    alone: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Samples:
    """What one :class:`SampleRequest` drew."""

    key: str
    tokens: np.ndarray
    """[n, max_tokens] int32: draw i's tokens; -1 after a draw stopped early."""
    logprobs: np.ndarray | None = None
    """[n, max_tokens] float32: the engine's logprob of each drawn token, as its
    :attr:`SamplerTraits.logprobs_mode` says; None when it returns none."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SamplerTraits:
    """What an engine's sampler promises: the reference the gate judges it against."""

    chain: str
    """The documented order and history rules of its sampler (``vllm``, ``transformers``,
    ``llama.cpp``: :data:`harness.sampling.transforms.CHAINS`)."""
    logprobs_mode: str
    """Which logprobs it returns: ``raw_logprobs`` (before any processor), ``processed_logprobs``
    (of the distribution it drew from) or ``none``."""
    seed_scope: Literal["request", "call"]
    """``request``: every request has its own seeded generator, so its draws cannot depend on the
    batch (vLLM); ``call``: one generator per call (transformers), nothing promised across a batch."""
    unsupported: Mapping[str, str] = field(default_factory=dict)
    """Parameter -> why the engine cannot apply it (its tests are ``refused`` with that reason)."""
    seed_hint: str = ""
    """What of the engine's own state can move a seeded draw (a prefix cache): a failing
    ``sampling.seed`` verdict says it, with the option that rules it out."""


@runtime_checkable
class Sampler(Protocol):
    """Optional ability: draw seeded samples with the engine's own sampler (``make sampling``).

    The sampling gate makes the candidate's runner as every gate does and asks it for this ability.
    ``sample`` starts what its draws need — the gate does not call ``start`` first: the pinned vLLM
    and llama.cpp draw in a child process of their own — and runs every pass in that one start;
    ``info`` and ``facts`` then tell what drew; ``close`` frees it."""

    def sampler_traits(self) -> SamplerTraits: ...

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        """Pass name -> request key -> its draws. Per-request failures are ``Samples.error``;
        :class:`~harness.api.EngineRefused` / :class:`~harness.api.EngineFailed` for the whole
        engine."""
        ...


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a started engine answers the OpenAI API (the API gate's candidate)."""

    base_url: str
    """Ends with ``/v1``."""
    model: str | None
    """The served model name (None: the first one ``/v1/models`` lists)."""
    managed: bool
    """The harness started this server itself, so requests that might kill it may be sent (the API
    gate's robustness facet); a server the user runs is probed only where the user says so."""
    key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key, if the server wants one (never written)."""
    body: tuple[tuple[str, Any], ...] = ()
    """Request fields the engine needs on every request (llama.cpp: ``repeat_penalty`` 1.0 to decode
    greedily)."""


@runtime_checkable
class ServesOpenAI(Protocol):
    """Optional ability: the engine answers the OpenAI API on a base URL once started (``make api``).

    Every runner that starts a server on loopback (``vllm-server``, ``llamacpp``) or talks to one
    (``openai:<url>``) declares it; the API gate calls ``start``, reads :meth:`endpoint`, sends its
    own requests there and ``close`` s the runner. A new managed server is an API candidate as soon
    as its runner implements this one method."""

    def endpoint(self) -> Endpoint:
        """The running server's :class:`Endpoint` (``start`` first)."""
        ...


@runtime_checkable
class Preflight(Protocol):
    """Optional ability: check what can be checked in seconds without starting anything — a path the
    spec names, a server the spec points at — so that a gate refuses before its oracle starts rather
    than minutes later. The API gate calls it before the oracle's server starts."""

    def preflight(self) -> None:
        """Raise ``FileNotFoundError`` for a path the spec names that does not exist (a usage error:
        the command exits 2 and writes no record) and :class:`~harness.api.EngineRefused` for an engine
        that cannot serve as specified (nothing answers at its URL: a refused record)."""
        ...
