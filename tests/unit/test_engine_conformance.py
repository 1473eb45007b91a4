"""The engine conformance kit (:mod:`harness.engines.conformance`) on every registered engine, and on
planted doubles that prove each check bites.

The contract half starts nothing, so it runs here for every entry of the registry: a new engine is
checked by registering it. The started half runs on the installed engines in
tests/integration/test_engine_conformance.py; here it runs on doubles whose process is ``sleep``
(no engine), one that conforms and one that breaks every rule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.abilities import TensorAbility
from harness.api import Case, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.engines import ENGINES
from harness.engines.base import NoTensors, RunnerContext, parse_options
from harness.engines.conformance import KIT_NAME, contract, descendants, full
from harness.models import ModelRef, resolve_model
from harness.workspace import Workspace

CASES = [Case("c01", (1, 2, 3), "abc"), Case("c02", (4, 5), "de")]
SAMPLING = Sampling(max_tokens=4)


@pytest.fixture(scope="module")
def model() -> ModelRef:
    return resolve_model("tiny-llama", Workspace.default())


@pytest.mark.parametrize("name", ENGINES.names())
def test_every_registered_engine_meets_the_contract(name: str, model: ModelRef) -> None:
    assert contract(name, model) == []


# --- the planted doubles -------------------------------------------------------------------------


class Sleeper:
    """A double whose engine process is ``sleep`` (no engine: the unit tier starts none)."""

    name: str
    proc: subprocess.Popen[bytes] | None = None

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, "double", "1.0")

    def start(self) -> None:
        self.proc = subprocess.Popen(["sleep", "300"], start_new_session=True)


class Conforming(Sleeper, NoTensors):
    """Everything the kit asks; its process is stopped on close."""

    def __init__(self, name: str, options: Mapping[str, str]) -> None:
        unknown = sorted(set(options) - {"speed"})
        if unknown:
            raise EngineRefused(f"candidate {name!r}: unknown option(s) {', '.join(unknown)}; valid: speed")
        self.name = name

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        return [Output(c.id, (7,) * sampling.max_tokens, "x") for c in cases]

    def facts(self) -> RunFacts:
        return RunFacts(device={"class": "double"})

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Broken(Sleeper):
    """Breaks one rule per check: a fixed name, half of the Sampler ability, a tensor kind declared
    impossible that does not refuse, unknown options swallowed, a second close that raises, and,
    started, one answer for two cases, no device, and its process left running."""

    name = "kit-broken"

    def __init__(self) -> None:
        self.closed = 0

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        return [Output(cases[0].id, (7,), "x")]

    def facts(self) -> RunFacts:
        return RunFacts()

    def close(self) -> None:
        self.closed += 1
        if self.closed > 1:
            raise RuntimeError("already closed")

    def sample(self, passes: Sequence[Any]) -> dict[str, Any]:
        return {}

    def tensor_ability(self) -> TensorAbility:
        return TensorAbility(why_not={"continuation": "no tensors here"})

    def capture_tensors(self, cases: Sequence[Case], continuations: Mapping[str, Sequence[int]]) -> dict[str, Any]:
        return {}

    def capture_layers(self, sequences: Mapping[str, Sequence[int]]) -> dict[str, Any]:
        return {}


@pytest.fixture
def doubles() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Registers kit-good and kit-broken for the test only; kills whatever they left running."""
    made: list[Any] = []

    def good(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Conforming:
        made.append(r := Conforming(ctx.name or spec, parse_options(arg, spec)))
        return r

    def broken(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Broken:
        made.append(r := Broken())
        return r

    with ENGINES.patched("kit-good", good, help="a conforming double"), ENGINES.patched("kit-broken", broken):
        yield made
    for r in made:
        if r.proc is not None and r.proc.poll() is None:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()


def test_the_kit_passes_a_conforming_double(doubles: list[Any], model: ModelRef) -> None:
    assert contract("kit-good", model) == []
    out = full("kit-good", model, CASES, SAMPLING, settle_s=2.0)
    assert out.problems == [] and out.refused is None and [o.case_id for o in out.outputs] == ["c01", "c02"]
    assert all(r.proc.poll() is not None for r in doubles if r.proc is not None)


def test_the_contract_fails_a_broken_double_once_per_rule(doubles: list[Any], model: ModelRef) -> None:
    got = contract("kit-broken", model)
    expected = [
        "registered without a help text",
        f"made under the name {KIT_NAME!r} it reports 'kit-broken'",
        "declares part of Sampler: has sample, lacks sampler_traits",
        "capturing continuation tensors, declared impossible (no tensors here), did not refuse",
        "capturing layers tensors, declared impossible",
        "accepted 'kit-broken:kit_unknown_option=1' but its info() does not name 'kit_unknown_option'",
        "accepted 'kit-broken:kit_bare_option' but its info() does not name 'kit_bare_option'",
        "close() before start (second call) raised RuntimeError: already closed",
    ]
    assert [sum(e in p for p in got) for e in expected] == [1] * len(expected), got
    assert len(got) == len(expected) and all(p.startswith("kit-broken: ") for p in got), got


def test_the_started_half_fails_a_broken_double(doubles: list[Any], model: ModelRef) -> None:
    out = full("kit-broken", model, CASES, SAMPLING, settle_s=1.0)
    left = [r.proc.pid for r in doubles if r.proc is not None]
    assert any("answered ['c01'] to the cases ['c01', 'c02']" in p for p in out.problems), out.problems
    assert any("facts() after run names no device" in p for p in out.problems), out.problems
    assert any("close() (second call) raised RuntimeError: already closed" in p for p in out.problems), out.problems
    assert any(f"left 1 process(es) running after close(): pid {left[0]} sleep 300" in p
               for p in out.problems), out.problems
    assert len(out.problems) == 4, out.problems


def test_a_refusal_must_name_the_candidate(model: ModelRef) -> None:
    def mute(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> Any:
        raise EngineRefused("cannot run here")

    with ENGINES.patched("kit-mute", mute, help="refuses without saying who"):
        got = contract("kit-mute", model)
    assert got[0] == "kit-mute: refused 'kit-mute' without naming the candidate: cannot run here", got


def test_descendants_sees_a_grandchild() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '5'])"],
                         start_new_session=True)
    try:
        for _ in range(50):
            kids = descendants()
            if any(_cmd(k).startswith(b"sleep") for k in kids if k != p.pid):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"no grandchild among {kids}")
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
