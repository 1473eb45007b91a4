"""Comparators: each judges one case and returns a Verdict. One registry of self-contained units.

Every comparator is one module that declares its class and its :class:`~harness.compare.unit.Unit`
(parameters with their defaults, controls, what it needs from the candidate, its device policy),
and one line below adds the unit to :data:`COMPARATORS`, which refuses a unit that lacks a part.
A suite is checked against a unit's parameters when it loads (:func:`check_params`): an unknown key
is an error naming the file, the table and the key, with the closest valid keys ("did you mean"),
so a typo such as ``threshold_nat`` can never silently gate at the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.api import Comparator
from harness.compare import bit_exact, byte_equal, drift, kl, kv_hits, near_tie, nmse, rl_logprobs, strict
from harness.compare.unit import Decode, Param, ParamError, Unit
from harness.registry import Registry
from harness.tomlcheck import Where

__all__ = ["COMPARATORS", "Param", "ParamError", "Unit", "add", "build", "check_params", "unit"]

COMPARATORS: Registry[Unit] = Registry("comparator")
"""Comparator name -> its :class:`Unit`."""


def add(u: Unit) -> Unit:
    """Register a comparator unit (checked whole first: see :meth:`Unit.check`)."""
    return COMPARATORS.register(u.check().name, help=u.help)(u)


for _module in (strict, near_tie, kl, drift, nmse, bit_exact, rl_logprobs, byte_equal, kv_hits):
    add(_module.UNIT)


def unit(name: str) -> Unit:
    """The unit registered as ``name`` (an unknown name lists the closest valid ones)."""
    return COMPARATORS.get(name)


def check_params(name: str, params: Mapping[str, Any], where: Where) -> None:
    """Raise ``where``'s error (``where``: the suite's ``[compare.<name>]`` table, naming the file)
    for an unknown key or a value of the wrong type. ``gate`` is the pipeline's, not the comparator's."""
    unit(name).check_params(params, where)


def build(name: str, params: Mapping[str, Any] | None = None, decode: Decode | None = None) -> Comparator:
    """The comparator registered as ``name``, configured from its (checked) suite table ``params``."""
    return unit(name).build(params, decode)
