"""The engine registry and what every engine factory receives.

A candidate spec is ``NAME``, ``NAME:OPTIONS`` or ``NAME:ARGUMENT`` (``NAME@VERSION`` for released
builds of an engine). Each engine module registers one factory per name in :data:`ENGINES`::

    @ENGINES.register("hf", help="Hugging Face transformers (hf:device=cuda,dtype=bfloat16)")
    def _hf(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Runner: ...

``vllm@`` is the factory for every ``vllm@<version>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.abilities import TensorAbility
from harness.api import Case, EngineRefused, Runner
from harness.models import ModelRef
from harness.registry import Registry


@dataclass(frozen=True, slots=True)
class RunnerContext:
    """What a factory may need beyond the spec."""

    run_dir: Path | None = None
    """Where the run may write scratch files (engine logs, request files)."""
    concurrency: int | None = None
    """Requests in flight (``harness gate --concurrency``); None: the engine's default."""
    name: str | None = None
    """The name the runner reports (``EngineInfo.name``) when it is not the spec, e.g. ``oracle``."""


Factory = Callable[[str, "str | None", ModelRef, RunnerContext], Runner]

ENGINES: Registry[Factory] = Registry("candidate")
"""Engine name -> factory(spec, argument, model, context)."""


def split_spec(spec: str) -> tuple[str, str | None]:
    name, sep, arg = spec.partition(":")
    return name, (arg if sep else None)


def engine_key(name: str) -> str:
    """``vllm@0.31.0`` -> ``vllm@``: the registry key of a released build."""
    return name.split("@", 1)[0] + ("@" if "@" in name else "")


def parse_options(arg: str | None, spec: str) -> dict[str, str]:
    """``a=1,b=x`` -> {"a": "1", "b": "x"}; anything else is a clear error naming the spec."""
    if not arg:
        return {}
    out = {}
    for part in arg.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise EngineRefused(f"candidate {spec!r}: option {part!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def coerce(v: str) -> Any:
    """An option string as the engine wants it: int, float, bool, None or the string."""
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(v.lower(), v)


class NoTensors:
    """The :class:`~harness.abilities.TensorSource` declaration of an engine that exposes no tensors:
    the reason (``tensors_why_not``), and captures that refuse with it."""

    name: str
    tensors_why_not = "the engine exposes no tensors"

    def tensor_ability(self) -> TensorAbility:
        return TensorAbility(why_not={"continuation": self.tensors_why_not, "layers": self.tensors_why_not})

    def capture_tensors(self, cases: Sequence[Case], continuations: Mapping[str, Sequence[int]]
                        ) -> dict[str, dict[str, np.ndarray]]:
        raise EngineRefused(f"{self.name}: {self.tensors_why_not}")

    def capture_layers(self, sequences: Mapping[str, Sequence[int]]) -> dict[str, dict[str, np.ndarray]]:
        raise EngineRefused(f"{self.name}: {self.tensors_why_not}")
