"""The harness's contracts. Read this first.

Data flows one way::

    Suite (cases + sampling) --Runner(oracle)--> goldens/ --+
                             --Runner(candidate)-----------+--> Comparators --> Verdicts --> Record

* A :class:`Case` is a workload item: prompt *token ids* (never text, so tokenizers cannot drift).
* A :class:`Runner` is any engine (vLLM, transformers, an HTTP server, a CLI). Oracle and candidate
  are roles, not code paths: any runner can play either.
* An :class:`Output` is what a runner produced for one case: generated ids plus per-position top-k
  logprobs.
* A :class:`Comparator` turns (oracle output, candidate output, case) into a :class:`Verdict`. It
  never asserts and never prints. Some also judge a whole run (:class:`RunComparator`) or the pages
  of a KV round trip (:class:`PageComparator`).

Everything the pipeline will ever ask of an engine is declared here: the :class:`Runner` methods,
the :class:`RunFacts` a runner reports after running (timings, speed, what it could return, KV
capacity), and the optional abilities an engine opts into by implementing a second protocol,
declared beside these contracts in :mod:`harness.abilities` (which builds on this module's
:class:`Case`, :class:`Output` and :class:`Sampling`):

* ``Scorer`` — teacher forcing: score given sequences in the same engine start;
* ``TensorSource`` — logits and hidden states; every engine declares its ``TensorAbility``,
  with the reason where it has none;
* ``SpeedLevels`` — replay a workload at several concurrencies in one start;
* ``Sampler`` — draw seeded samples (``SamplePass`` of ``SampleRequest`` -> ``Samples``) with the
  engine's own sampler, whose promises are its ``SamplerTraits``.

The pipeline never probes a runner with ``getattr``: it asks ``isinstance(runner, Ability)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # types only: these modules import this one
    from harness.capabilities import Capabilities
    from harness.kv_pages.evidence import CaseEvidence
    from harness.speed import Speed

Status = Literal["pass", "fail", "error", "refused", "skip"]
"""pass/fail: the comparator judged. error: the engine crashed, hung or answered garbage.
refused: the engine refused the configuration (its reason is kept). skip: not judged."""

STATUSES: tuple[Status, ...] = ("pass", "fail", "error", "refused", "skip")


@dataclass(frozen=True, slots=True)
class Case:
    """One workload item of a suite."""

    id: str
    """Stable id inside the suite, e.g. ``c03``; goldens and verdicts are keyed by it."""
    prompt_ids: tuple[int, ...]
    """The prompt as token ids: what every engine is fed."""
    prompt_text: str = ""
    """The text the ids were made from (for humans; engines never see it)."""
    tags: tuple[str, ...] = ()


SAMPLER_PARAMETERS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
"""The sampler's parameters (fields of :class:`Sampling`), in the order the sampling gate lists
them: the one list its settings, its reference transforms and :meth:`Sampling.to_json` read."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters shared by oracle and candidate.

    Every parity gate is greedy (``temperature`` 0, ``top_p`` 1): parity needs determinism, and a
    suite's ``[sampling]`` table is refused otherwise. Seeded sampling (``temperature`` > 0,
    ``top_p`` < 1) is for rollouts only: the invariance kind's trainer-vs-rollout check."""

    max_tokens: int
    logprobs: int = 5
    """k: how many top logprobs to keep per generated position."""
    temperature: float = 0.0
    seed: int = 0
    full_vocab: bool = False
    """The suite asked for ``logprobs = "full"``: besides the top-``logprobs`` rows, every engine
    that can returns the whole next-token distribution at every position as an array
    (:attr:`Output.full_logprobs`), whatever the vocabulary size."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``."""
    top_k: int = 0
    """Keep the ``top_k`` most likely tokens (0: off)."""
    min_p: float = 0.0
    """Keep the tokens at least ``min_p`` times as likely as the most likely one (0: off)."""
    repetition_penalty: float = 1.0
    """Divide a positive logit (multiply a negative one) of a token seen before by this (1: off);
    which tokens count as seen is the engine's rule (:mod:`harness.sampling.transforms`)."""
    presence_penalty: float = 0.0
    """Subtract this from the logit of every token seen before (0: off)."""
    frequency_penalty: float = 0.0
    """Subtract this times its count from the logit of every token seen before (0: off)."""

    OPTIONAL = tuple(p for p in SAMPLER_PARAMETERS if p != "temperature")
    """The fields ``to_json`` writes only when they are not their default."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 and self.top_p == 1.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "logprobs": self.logprobs,
            "temperature": self.temperature,
            "seed": self.seed,
            **({"full_vocab": True} if self.full_vocab else {}),
        }
        # greedy suites keep the exact form their goldens were recorded with (manifests hash it)
        defaults = Sampling(0)
        out.update({k: getattr(self, k) for k in self.OPTIONAL if getattr(self, k) != getattr(defaults, k)})
        return out


@dataclass(frozen=True, slots=True, eq=False)
class Output:
    """What one engine produced for one case.

    Arrays are float32/int32 with one row per generated position; they are ``None`` when the engine
    could not return logprobs (the record then says which comparators were impossible).
    """

    case_id: str
    token_ids: tuple[int, ...]
    text: str = ""
    top_ids: np.ndarray | None = None
    """[T, k] int32: the k most likely token ids at each generated position, best first."""
    top_logprobs: np.ndarray | None = None
    """[T, k] float32: their logprobs."""
    chosen_logprobs: np.ndarray | None = None
    """[T] float32: logprob of the token actually generated."""
    finish_reason: str = ""
    error: str | None = None
    """Set when the engine failed on this case; the comparators then answer ``error``."""
    full_logprobs: np.ndarray | None = None
    """[T, V] float32: the whole next-token distribution at each position, column = token id (often
    a read-only memory map of a ``.npy`` file in the run folder). Set when the suite asks for
    ``logprobs = "full"`` and the engine can deliver it; never a per-position dict."""

    @property
    def has_logprobs(self) -> bool:
        return self.top_ids is not None and self.top_logprobs is not None

    @property
    def vocab(self) -> int | None:
        """V of :attr:`full_logprobs` (None without full rows)."""
        return None if self.full_logprobs is None else int(self.full_logprobs.shape[1])

    def with_tokens(self, token_ids: Sequence[int]) -> Output:
        """A copy with other generated ids (planted mutations and controls); any other field is
        changed with :func:`dataclasses.replace`, which copies the rest."""
        return replace(self, token_ids=tuple(int(t) for t in token_ids))


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Who produced an output: enough to say which engine, version and tree it was."""

    name: str
    """The runner spec as the user wrote it, e.g. ``hf`` or ``vllm``."""
    engine: str
    """The engine family: ``vllm``, ``transformers``, ..."""
    version: str
    sha: str | None = None
    """The candidate engine's own git SHA, when it has one."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The configuration that can change outputs (dtype, block size, KV cache, concurrency ...):
    what a supported-models page publishes."""
    environment: Mapping[str, Any] = field(default_factory=dict)
    """Where and how it ran, which cannot change outputs (loopback URL, venv, timeouts, retries,
    protocol details): kept in the record, never published as a setting."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "engine": self.engine,
            "version": self.version,
            "sha": self.sha,
            "settings": dict(self.settings),
        }
        if self.environment:
            out["environment"] = dict(self.environment)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EngineInfo:
        return cls(d["name"], d["engine"], d["version"], d.get("sha"), d.get("settings", {}),
                   d.get("environment", {}))


@dataclass(frozen=True, slots=True)
class Verdict:
    """One comparator's judgement of one case."""

    case_id: str
    comparator: str
    status: Status
    summary: str
    """One line, e.g. ``strict FAIL at token 17/32``."""
    detail: str = ""
    """The multi-line explanation a failing verdict prints (both sides, prefix, top-k, fix)."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able facts the summary was computed from (positions, gaps, counts)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "comparator": self.comparator,
            "status": self.status,
            "summary": self.summary,
            "detail": self.detail,
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Verdict:
        return cls(
            d["case_id"], d["comparator"], d["status"], d["summary"], d.get("detail", ""),
            d.get("evidence", {}),
        )


class EngineRefused(Exception):
    """The engine refused the configuration (e.g. unsupported block size or KV dtype)."""


class EngineFailed(Exception):
    """The engine crashed or hung; ``log_tail`` keeps the end of its output."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What a runner measured and detected in its last ``run``: the only runner state the pipeline
    reads besides the outputs."""

    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds (``engine_start_s``, ``generate_s``, ``score_s`` ...) and ``output_tokens``."""
    speed: Speed | None = None
    """Output tok/s and TTFT at a concurrency, when the engine measured them itself (servers,
    vLLM's closed loop); otherwise :func:`harness.speed.candidate_speed` derives one from
    ``timings``."""
    batched: bool = False
    """Every case went in one batch (vLLM offline), not one request at a time."""
    capabilities: Capabilities | None = None
    """What the engine could return (token ids, top-k logprobs, how many), detected while running;
    None: everything the contract asks for (Python engines)."""
    kv_capacity: Mapping[str, Any] = field(default_factory=dict)
    """How much KV cache the engine holds, as the engine reports it: ``tokens`` (+ ``blocks``,
    ``block_size``) for a paged cache, or ``bytes_per_token`` for a cache measured in bytes."""
    case_facts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per case id: engine facts such as ``num_cached_tokens`` (prefix-cache hits)."""
    device: Mapping[str, Any] = field(default_factory=dict)
    """``{"class", "fingerprint"}`` (:mod:`harness.device`) of the process the engine computed in,
    when the engine reports it (vLLM's worker: its kernel library, ATen capability, steering);
    empty: the harness process's own (:func:`harness.provenance.device_facts`)."""


@runtime_checkable
class Runner(Protocol):
    """An engine that can replay a workload. Oracle or candidate: same contract.

    ``start`` loads the model once (the expensive part); ``run`` batches every case of the suite into
    that one engine; ``facts`` tells what it measured; ``close`` frees it. ``start`` raises
    :class:`EngineRefused` or :class:`EngineFailed`; ``run`` reports per-case failures in
    ``Output.error``.
    """

    name: str

    def info(self) -> EngineInfo: ...

    def start(self) -> None: ...

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]: ...

    def facts(self) -> RunFacts: ...

    def close(self) -> None: ...


@runtime_checkable
class Comparator(Protocol):
    """Judges a candidate output against the oracle's. Returns a verdict; never asserts or prints.

    Everything else the pipeline needs of a comparator — its parameters, controls, what it needs
    from the candidate, how it holds across devices — is declared beside it in one
    :class:`~harness.compare.unit.Unit`."""

    key: str
    needs_scores: bool
    """True: it judges the candidate's *scores* of the oracle's sequences (teacher forcing) and
    also judges a whole run with ``compare_run``; False: it judges what the candidate generated."""

    def compare(self, oracle: Output, candidate: Output, case: Case) -> Verdict: ...


@runtime_checkable
class RunComparator(Comparator, Protocol):
    """A comparator that also judges a whole run: every position of every case pooled, one verdict
    with the case id ``(run)`` (KL, drift, NMSE, trainer-vs-rollout logprobs)."""

    def compare_run(self, oracles: Sequence[Output], candidates: Sequence[Output],
                    cases: Sequence[Case]) -> Verdict: ...


@runtime_checkable
class PageComparator(Comparator, Protocol):
    """A comparator of what a KV round trip left behind (pages, hit counts) rather than of outputs."""

    def judge_kv(self, case: Case, evidence: CaseEvidence) -> Verdict: ...


def failure_verdicts(comparators: Iterable[str], case_ids: Iterable[str], status: Status, reason: str,
                     tail: str = "", who: str = "", evidence: Mapping[str, Any] | None = None
                     ) -> list[Verdict]:
    """An engine that refused, crashed or could not run: every comparator of every case answers
    ``status`` with the reason (its first line in the summary, all of it and the engine's log tail in
    the detail). ``who`` names the engine when a gate runs several (``arm B (vllm)``, ``producer``)."""
    from harness.excerpt import first_line

    head = first_line(reason) or status
    summary = f"{status}: {who}: {head}" if who else f"{status}: {head}"
    detail = reason + (f"\n--- {who + ' ' if who else ''}engine log tail ---\n{tail}" if tail else "")
    ev = {"reason": reason, **(evidence or {})}
    case_ids = list(case_ids)
    return [Verdict(cid, name, status, summary, detail, ev) for name in dict.fromkeys(comparators)
            for cid in case_ids]
