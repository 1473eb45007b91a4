"""The contract of a gate kind: prepare -> run -> judge, registered by suite kind.

A suite names its kind (``kind = "parity"`` in ``suites/<name>.toml``, the default). The pipeline
(:mod:`harness.pipeline`) looks the kind up in :data:`KINDS`, calls its three steps, and hands the
:class:`Judgement` to the one record builder, which owns provenance, the vacuous-gate guard,
figures and writing. A kind never builds or writes a record itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harness.api import EngineInfo, Output, Runner, Verdict
from harness.engines.base import split_spec
from harness.goldens import Golden
from harness.models import ModelRef
from harness.records import Control, Record
from harness.registry import Registry
from harness.staleness import Current
from harness.suites import Suite
from harness.workspace import Workspace

if TYPE_CHECKING:
    from harness.kinds.distribution import Distribution
    from harness.speed import Speed

Transform = Callable[[Sequence[Output]], list[Output]]
"""Rewrites a candidate's outputs before judging: planted mutations in tests."""


@dataclass(frozen=True, slots=True, eq=False)
class GateRequest:
    """One gate to run: what the user asked for, resolved and validated."""

    model: ModelRef
    suite: Suite
    candidate: str
    """The engine spec under test (arm B of an A/B)."""
    reference: str | None = None
    """The reference configuration of an A/B (arm A); kinds with goldens use the pinned oracle."""
    connector: str | None = None
    """A third-party KV connector (``module:Class``) for KV kinds."""
    concurrency: int | None = None
    speed: Speed | str | bool = False
    """Also time the pinned oracle on the same workload (True), use a :class:`Speed` measured
    earlier in the same run, or a string saying why there is none."""
    auto_record: bool = True
    """Record missing goldens with the oracle first (else: a missing golden is bad input)."""
    transform: Transform | None = None
    runner: Runner | None = None
    """An already configured engine to use instead of the one the spec would make."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific inputs (e.g. the A/B's pre-run arms)."""


@dataclass(frozen=True, slots=True, eq=False)
class Judgement:
    """What a gate kind established. The record builder turns it into a :class:`Record`."""

    label: str
    """The candidate part of the record's name, e.g. ``hf``, ``kv-harness-store``, ``ab-vllm...``."""
    candidate: EngineInfo
    verdicts: tuple[Verdict, ...]
    gates: tuple[str, ...]
    """The comparators whose failure fails the run."""
    controls: tuple[Control, ...]
    summary: str
    timings: Mapping[str, float] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    golden: Golden | None = None
    """The goldens judged against (their provenance becomes the record's ``oracle``)."""
    reference: Mapping[str, Any] = field(default_factory=dict)
    """The reference side's provenance when there are no goldens (an A/B's arm A)."""
    distribution: Distribution | None = None
    """KL table and drift profile: the builder writes its pictures beside the record."""
    figure_title: str = ""
    pictures: Callable[[Path, str], object] | None = None
    """The kind's own pictures: (the record's folder, its id) -> writes ``<id>.<name>.png`` for each
    of :attr:`picture_names` (besides the distribution's)."""
    picture_names: tuple[str, ...] = ()
    suite: Mapping[str, Any] | None = None
    """The record's ``suite`` entry when the kind files its record under a name of its own (a
    diagnosis names the suite it diagnoses inside it); None: the request's suite."""


@runtime_checkable
class GateKind(Protocol):
    """One kind of gate. ``prepare`` validates and loads (goldens, settings) before any engine
    starts; ``run`` drives the engines; ``judge`` turns what they produced into verdicts, controls
    and figures."""

    name: str
    tables: tuple[str, ...]
    """The suite's top-level tables this kind reads besides [sampling]/[compare]/[[cases]]."""
    default_candidate: str
    """The engine under test when the user names none (``hf`` for parity, the pinned ``vllm`` for
    the kinds that drive vLLM itself)."""

    def prepare(self, ws: Workspace, req: GateRequest) -> Any: ...

    def run(self, ws: Workspace, req: GateRequest, prepared: Any) -> Any: ...

    def judge(self, ws: Workspace, req: GateRequest, prepared: Any, ran: Any) -> Judgement: ...

    def stale(self, rec: Record, cur: Current) -> list[str]:
        """Why a record of this kind no longer describes the tree, by the kind's own rule (empty: it
        still does). The candidate and harness rules every record has are applied beside it
        (:func:`harness.kinds.staleness`); the building blocks are in :mod:`harness.staleness`."""
        ...


KINDS: Registry[GateKind] = Registry("gate kind")
"""Suite kind -> the gate kind that runs it (add one with :func:`register_kind`)."""

PARTS = ("name", "tables", "default_candidate", "prepare", "run", "judge", "stale")


def register_kind(kind: GateKind, help: str) -> GateKind:  # noqa: A002
    """Register ``kind`` under its name; a kind that lacks a part of :class:`GateKind` — its
    staleness rule included, without which its records would be stale forever — is refused."""
    if not isinstance(kind, GateKind):
        missing = [p for p in PARTS if p not in dir(kind)]
        raise TypeError(f"gate kind {type(kind).__name__} lacks {', '.join(missing)} "
                        "(see harness.kinds.base.GateKind)")
    return KINDS.register(kind.name, help=help)(kind)


def say(req: GateRequest, text: str, echo: str | None = None) -> None:
    """Hand one line of progress to the request's ``progress`` callback; without one, print it as
    ``<echo>: text`` when ``echo`` is given, else say nothing."""
    progress: Callable[[str], None] | None = req.options.get("progress")
    if progress is not None:
        progress(text)
    elif echo is not None:
        print(f"{echo}: {text}", flush=True)


def engine_info(runner: Any, spec: str) -> EngineInfo:
    """What ``runner`` says of itself, or, for none or one that never started (it may not know its
    version), what its spec says."""
    if runner is not None:
        try:
            return runner.info()
        except Exception:  # noqa: BLE001 - an engine that never started may not know its version
            pass
    return EngineInfo(spec, split_spec(spec)[0], "unknown")
