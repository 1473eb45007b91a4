"""What a comparator is, in one place: a :class:`Unit`.

A comparator module declares one unit beside its class, and ``harness/compare/__init__.py`` adds
it with one line. The unit holds everything the pipeline asks of a comparator:

* its **parameters**: the fields of the comparator's dataclass made with :func:`param` are the keys
  its ``[compare.<name>]`` suite table may hold; each default is stated once, there;
* its **controls**: the planted mutations (and the golden checks' needs) that prove it can fail —
  the vacuous-gate guard (:mod:`harness.kinds.controls`) runs them beside every gate;
* its **needs**: what it needs the *candidate* to return (token ids, top-k logprobs); a candidate
  that cannot return them makes it impossible, and the record says why;
* its **device policy** (:data:`Policy`): whether it holds only where devices agree bit for bit,
  within its bar on any device, or judges nothing numeric (:mod:`harness.device_policy`).

:meth:`Unit.check` refuses a unit that lacks a part, so a comparator cannot join a gate without
controls, needs or a policy::

    @dataclass(frozen=True, slots=True)
    class MyCmp:
        key: ClassVar[str] = "my_cmp"
        needs_scores: ClassVar[bool] = False
        bar: float = param(0.1, "number", "the largest allowed ...")

        def compare(self, oracle, candidate, case) -> Verdict: ...

    UNIT = Unit(MyCmp, "what it judges", needs=TOKENS, across_devices="bits",
                controls=ControlSet((Mutation("flip", "fail", plant_decisive_flip),)))

The controls' vocabulary (:class:`Mutation`, :class:`Planted`, :class:`Needs`, :class:`ControlSet`)
lives here too: comparator modules declare controls without importing the guard that runs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.api import Comparator, Output
from harness.tomlcheck import InvalidTOML, Where, check_keys

Decode = Callable[[Sequence[int]], str]
Need = Literal["token_ids", "top_logprobs"]
TOKENS: frozenset[Need] = frozenset({"token_ids"})
LOGPROBS: frozenset[Need] = frozenset({"token_ids", "top_logprobs"})
Policy = Literal["bits", "bar", "any"]
"""How a comparator holds between goldens and a candidate on another device (see
:mod:`harness.device_policy`): ``bits``: only where the device policy expects exactness (bits within
one device class, token ids across CPU classes); ``bar``: within its bar on any device; ``any``: it
judges no numerics of the model (pages written and restored by one engine, hit counts)."""
POLICIES: tuple[Policy, ...] = ("bits", "bar", "any")


class ParamError(InvalidTOML):
    """A comparator parameter is unknown or has the wrong type; the message names the key."""


class UnitError(TypeError):
    """A comparator unit lacks a part (controls, needs, a device policy, a method its subject needs)."""


@dataclass(frozen=True, slots=True)
class Param:
    """One key of a ``[compare.<name>]`` table."""

    kind: Literal["number", "int", "edges", "choice"]
    """``number``, ``int`` (>= 0), ``edges`` (a list of ints >= 0) or ``choice``."""
    default: Any
    help: str
    choices: tuple[str, ...] = ()

    def check(self, value: Any, where: Where) -> None:
        """Raise ``where``'s error (the key's place in the suite) for a value of the wrong type."""
        ok = {
            "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "edges": lambda v: isinstance(v, list | tuple) and bool(v)
            and all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in v),
            "choice": lambda v: v in self.choices,
        }[self.kind](value)
        if not ok:
            want = {"number": "a number", "int": "an int >= 0", "edges": "a list of ints >= 0",
                    "choice": "one of " + ", ".join(repr(c) for c in self.choices)}[self.kind]
            raise where.fail(f"expected {want}, got {value!r}")

    def convert(self, value: Any) -> Any:
        """The suite's TOML value as the comparator's field holds it."""
        if value is None:
            return None
        return {"number": float, "int": int, "edges": lambda v: tuple(int(e) for e in v),
                "choice": str}[self.kind](value)


PARAM = "harness.param"
"""The dataclass field metadata key under which :func:`param` keeps a field's :class:`Param`."""


def param(default: Any, kind: Literal["number", "int", "edges", "choice"], help: str,  # noqa: A002
          choices: Sequence[str] = ()) -> Any:
    """A comparator field that a suite may set in ``[compare.<name>]``: its default, stated once."""
    p = Param(kind, default, help, tuple(choices))
    return field(default=p.convert(default), metadata={PARAM: p})


# ---------------------------------------------------------------------------------------------
# controls: what a unit plants to prove it can fail


@dataclass(frozen=True, slots=True, eq=False)
class Planted:
    """What a mutation made of one case: the pair the comparator is asked to judge."""

    oracle: Output
    """Usually the golden itself; a synthetic positive control may edit a copy."""
    candidate: Output
    note: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class PlantedEvidence:
    """What a mutation made of one case of a KV round trip: the evidence a page comparator judges."""

    evidence: Any
    """A :class:`~harness.kv_pages.evidence.CaseEvidence`."""
    note: str = ""


Plant = Callable[[Any, Any, Any], "Planted | PlantedEvidence | str"]
"""(comparator, case, subject) -> the planted subject (a :class:`Planted` pair of outputs, or a
:class:`PlantedEvidence` for a page comparator), or a string saying why nothing could be planted."""


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    expect: Literal["fail", "pass"]
    plant: Plant


@dataclass(frozen=True, slots=True)
class Needs:
    """What a comparator needs from the goldens to be able to fail (the golden checks)."""

    logprobs: bool = False
    min_k: int = 0
    full_vocab: bool = False
    gaps: bool = False
    """Needs top-1/top-2 logprob gaps that are not all zero (near-tie bars, KL)."""
    pages: bool = False
    """Needs captured KV pages that are not degenerate (all zero, all alike)."""


@dataclass(frozen=True, slots=True)
class ControlSet:
    mutations: tuple[Mutation, ...]
    needs: Needs = field(default_factory=Needs)

    @property
    def must_fail(self) -> tuple[Mutation, ...]:
        return tuple(m for m in self.mutations if m.expect == "fail")


# ---------------------------------------------------------------------------------------------
# the unit


Subject = Literal["outputs", "scores", "pages"]


@dataclass(frozen=True, slots=True)
class Unit:
    """One comparator: its class, parameters, controls, needs and device policy."""

    cls: type
    """The comparator dataclass: ``key`` and ``needs_scores`` class attributes, :func:`param` fields,
    ``compare`` (and ``compare_run`` when it judges scores, ``judge_kv`` when it judges pages)."""
    help: str
    needs: frozenset[Need]
    """What the candidate must return for it to judge."""
    controls: ControlSet
    across_devices: Policy

    @property
    def name(self) -> str:
        return str(self.cls.key)

    @property
    def subject(self) -> Subject:
        if hasattr(self.cls, "judge_kv"):
            return "pages"
        return "scores" if self.cls.needs_scores else "outputs"

    def params(self) -> dict[str, Param]:
        """``{key: Param}``: the keys its suite table may hold."""
        return {f.name: f.metadata[PARAM] for f in dataclasses.fields(self.cls) if PARAM in f.metadata}

    def check_params(self, params: Mapping[str, Any], where: Where) -> None:
        """Raise ``where``'s error (``where``: the suite's ``[compare.<name>]`` table) for an unknown
        key or a value of the wrong type. ``gate`` is the pipeline's key, not the comparator's."""
        schema = self.params()
        check_keys(params, where, [*schema, "gate"])
        for key, value in params.items():
            if key != "gate":
                schema[key].check(value, where / key)

    def build(self, params: Mapping[str, Any] | None = None, decode: Decode | None = None) -> Comparator:
        """The comparator configured from its (checked) suite table; defaults are the fields' own."""
        params = dict(params or {})
        self.check_params(params, Where("parameters", ("compare", self.name), ParamError))
        schema = self.params()
        kw = {k: schema[k].convert(v) for k, v in params.items() if k in schema}
        if "decode" in {f.name for f in dataclasses.fields(self.cls)}:
            kw["decode"] = decode
        return self.cls(**kw)  # type: ignore[no-any-return]

    def check(self) -> Unit:
        """``self``, or :class:`UnitError` naming the part the unit lacks."""
        who = f"comparator unit {getattr(self.cls, 'key', self.cls.__name__)!r}"
        if not dataclasses.is_dataclass(self.cls):
            raise UnitError(f"{who}: {self.cls.__name__} must be a dataclass (its fields are its parameters)")
        for attr in ("key", "needs_scores", "compare"):
            if not hasattr(self.cls, attr):
                raise UnitError(f"{who}: {self.cls.__name__} has no {attr!r}")
        if not self.help.strip():
            raise UnitError(f"{who}: no help line")
        if not self.needs or not self.needs <= LOGPROBS:
            raise UnitError(f"{who}: needs must name what the candidate returns, a non-empty subset of "
                            f"{sorted(LOGPROBS)}; got {sorted(self.needs)}")
        if self.across_devices not in POLICIES:
            raise UnitError(f"{who}: across_devices must be one of {', '.join(POLICIES)}, got "
                            f"{self.across_devices!r}")
        if not self.controls.must_fail:
            raise UnitError(f"{who}: its controls plant no mutation that must fail: a gate on it could "
                            "never be shown to bite")
        if self.subject == "scores" and not hasattr(self.cls, "compare_run"):
            raise UnitError(f"{who}: it judges scores (needs_scores) but has no compare_run")
        for name, p in self.params().items():
            if p.default is not None:
                p.check(p.default, Where(f"{who}: default of {name!r}", error=ParamError))
        return self
