"""The engine conformance kit: what every registered engine must do, checked the same way for each
(as Hypothesis checks every backend with one ``provider_conformance`` suite). A new engine gets it
by registering: ``tests/unit/test_engine_conformance.py`` runs :func:`contract` on every entry of
:data:`~harness.engines.base.ENGINES`, ``tests/integration/test_engine_conformance.py`` runs
:func:`full` on the engines installed in the project's venv.

Both return the problems they found, in words that name the engine and the check (empty: it
conforms); they never assert, so a planted double can prove each check fails what it should.

:func:`contract` starts nothing: the registry entry (a help text), the runner made from the bare
name (a runner, or :class:`~harness.api.EngineRefused` naming the candidate), the name it reports
(the context's, when given), :meth:`info` before ``start``, abilities declared whole (an engine with
half of :class:`~harness.abilities.Sampler`'s methods declares nothing the pipeline can use),
tensor kinds it refuses refused at once with the reason it declares, an unknown or malformed option
refused naming the option or carried into :meth:`info` (so the record names it), and ``close``
before ``start``, twice.

:func:`full` starts the engine: ``start`` (a refusal or failure must say why), :meth:`info` and the
device it reports, a two-case workload answered case by case (or refused, saying why), ``close``
twice, and no process of its own left running afterwards (an engine pool's live engines excepted:
they outlive runners by design).
"""

from __future__ import annotations

import os
import time
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import abilities
from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.engines.base import ENGINES, Factory, RunnerContext, engine_key, split_spec
from harness.models import ModelRef
from harness.registry import Registry

RUNNER_METHODS = ("info", "start", "run", "facts", "close")
ABILITIES = tuple(getattr(abilities, n) for n in ("Scorer", "TensorSource", "SpeedLevels", "Sampler",
                                                  "ServesOpenAI"))
EXAMPLE_VERSION = "0.0.1"
"""The release a ``name@`` entry is made with: the kit never installs it."""
UNKNOWN_OPTION = "kit_unknown_option=1"
BARE_OPTION = "kit_bare_option"
KIT_NAME = "kit-runner"


def example_spec(name: str) -> str:
    """The candidate spec the kit makes an entry's runner from: the name (``name@``: one release)."""
    return name + EXAMPLE_VERSION if name.endswith("@") else name


def with_option(spec: str, option: str) -> str:
    return f"{spec},{option}" if ":" in spec else f"{spec}:{option}"


def ability_methods(ability: type) -> list[str]:
    return sorted(a for a in typing._get_protocol_attrs(ability) if callable(getattr(ability, a, None)))  # type: ignore[attr-defined]


def _make(factory: Factory, spec: str, model: ModelRef, ctx: RunnerContext) -> Any:
    name, arg = split_spec(spec)
    return factory(spec, arg, model, ctx)


def contract(name: str, model: ModelRef, registry: Registry[Factory] = ENGINES,
             ctx: RunnerContext | None = None) -> list[str]:
    """The cheap half of the kit (see module doc): nothing is started."""
    ctx = ctx or RunnerContext()
    entry = registry.entry(name)
    spec = example_spec(name)
    problems: list[str] = []
    say = problems.append
    if not entry.help.strip():
        say(f"{name}: registered without a help text (harness list shows it)")
    try:
        runner = _make(entry.value, spec, model, ctx)
    except EngineRefused as e:
        if split_spec(spec)[0] not in str(e):
            say(f"{name}: refused {spec!r} without naming the candidate: {e}")
        return problems + _options(entry.value, spec, model, ctx, refused_bare=True)
    except Exception as e:  # noqa: BLE001 - the kit reports whatever a factory raises
        return [*problems, f"{name}: making {spec!r} raised {type(e).__name__}: {e} (refuse with "
                           f"EngineRefused naming the candidate instead)"]
    missing = [m for m in RUNNER_METHODS if not callable(getattr(runner, m, None))]
    if missing:
        return [*problems, f"{name}: the runner lacks {', '.join(missing)} of the Runner contract"]
    problems += _info(name, runner, spec, "before start")
    problems += _named(entry.value, spec, model, ctx)
    problems += _abilities(name, runner)
    problems += _options(entry.value, spec, model, ctx, refused_bare=False)
    for attempt in ("first", "second"):
        try:
            runner.close()
        except Exception as e:  # noqa: BLE001
            say(f"{name}: close() before start ({attempt} call) raised {type(e).__name__}: {e}")
    return problems


def _info(name: str, runner: Any, spec: str, when: str) -> list[str]:
    try:
        info = runner.info()
    except Exception as e:  # noqa: BLE001
        return [f"{name}: info() {when} raised {type(e).__name__}: {e}"]
    if not isinstance(info, EngineInfo):
        return [f"{name}: info() {when} returned {type(info).__name__}, not EngineInfo"]
    out = []
    if not info.engine or not info.version:
        out.append(f"{name}: info() {when} names no engine family or version: {info!r}")
    if info.name != runner.name:
        out.append(f"{name}: info() {when} says {info.name!r}, the runner is {runner.name!r}")
    return out


def _named(factory: Factory, spec: str, model: ModelRef, ctx: RunnerContext) -> list[str]:
    """A runner made under another name (the oracle role, ``RunnerContext.name``) reports it."""
    name = split_spec(spec)[0]
    try:
        runner = _make(factory, spec, model, RunnerContext(ctx.run_dir, ctx.concurrency, KIT_NAME))
    except Exception as e:  # noqa: BLE001
        return [f"{name}: made under the name {KIT_NAME!r}, {spec!r} raised {type(e).__name__}: {e}"]
    if runner.name != KIT_NAME or runner.info().name != KIT_NAME:
        return [f"{name}: made under the name {KIT_NAME!r} it reports {runner.name!r} / "
                f"{runner.info().name!r} (RunnerContext.name is the name records carry)"]
    return []


def _abilities(name: str, runner: Any) -> list[str]:
    out = []
    for ability in ABILITIES:
        methods = ability_methods(ability)
        have = [m for m in methods if callable(getattr(runner, m, None))]
        if have and len(have) < len(methods):
            out.append(f"{name}: declares part of {ability.__name__}: has {', '.join(have)}, lacks "
                       f"{', '.join(m for m in methods if m not in have)} (the pipeline asks "
                       f"isinstance(runner, {ability.__name__}): a half declaration is none)")
    if isinstance(runner, abilities.TensorSource):
        out += _tensors(name, runner)
    return out


def _tensors(name: str, runner: Any) -> list[str]:
    ability = runner.tensor_ability()
    if not isinstance(ability, abilities.TensorAbility):
        return [f"{name}: tensor_ability() returned {type(ability).__name__}, not TensorAbility"]
    calls: dict[str, Callable[[], Any]] = {"continuation": lambda: runner.capture_tensors([], {}),
                                           "layers": lambda: runner.capture_layers({})}
    out = []
    for kind, call in calls.items():
        if ability.can(kind):  # type: ignore[arg-type]
            continue
        why = ability.reason(kind)  # type: ignore[arg-type]
        try:
            call()
        except EngineRefused as e:
            if why not in str(e):
                out.append(f"{name}: capturing {kind} tensors refuses with {e!r}, not the reason it "
                           f"declares ({why!r})")
            continue
        except Exception as e:  # noqa: BLE001
            out.append(f"{name}: capturing {kind} tensors (declared impossible: {why}) raised "
                       f"{type(e).__name__}: {e}, not EngineRefused")
            continue
        out.append(f"{name}: capturing {kind} tensors, declared impossible ({why}), did not refuse")
    return out


def _options(factory: Factory, spec: str, model: ModelRef, ctx: RunnerContext, refused_bare: bool
             ) -> list[str]:
    """An option the engine does not know is refused naming it, or carried into info()."""
    name = split_spec(spec)[0]
    out = []
    for option in (UNKNOWN_OPTION, BARE_OPTION):
        word = option.partition("=")[0]
        given = with_option(spec, option)
        try:
            runner = _make(factory, given, model, ctx)
        except EngineRefused as e:
            if word not in str(e):
                out.append(f"{name}: refused {given!r} without naming {word!r}: {e}")
            continue
        except Exception as e:  # noqa: BLE001
            out.append(f"{name}: {given!r} raised {type(e).__name__}: {e}, not EngineRefused naming "
                       f"{word!r}")
            continue
        if word not in repr(runner.info()):
            out.append(f"{name}: accepted {given!r} but its info() does not name {word!r} (refuse an "
                       f"option you do not know, or keep it in the settings records carry)"
                       + (" — the bare name was refused" if refused_bare else ""))
    return out


@dataclass
class Outcome:
    """What :func:`full` saw."""

    problems: list[str] = field(default_factory=list)
    refused: str | None = None
    """Why the engine would not start (or run) the workload, in its own words."""
    outputs: list[Output] = field(default_factory=list)
    info: EngineInfo | None = None
    facts: RunFacts | None = None


def full(spec: str, model: ModelRef, cases: Sequence[Case], sampling: Sampling,
         ctx: RunnerContext | None = None, registry: Registry[Factory] = ENGINES,
         spared: Callable[[], Iterable[int]] = lambda: (), settle_s: float = 10.0) -> Outcome:
    """The whole kit on a started engine (see module doc). ``spared``: process groups that may
    outlive the runner (an engine pool's live engines); ``settle_s``: how long a stopped process
    may take to go."""
    ctx = ctx or RunnerContext()
    name, _ = split_spec(spec)
    factory = registry.find(name) or registry.get(engine_key(name))
    out = Outcome()
    say = out.problems.append
    runner = _make(factory, spec, model, ctx)
    before = set(descendants())
    seen: dict[int, str] = {}
    try:
        try:
            runner.start()
        except (EngineRefused, EngineFailed) as e:
            out.refused = str(e)
            if not str(e).strip():
                say(f"{name}: start() raised {type(e).__name__} saying nothing")
            return out
        seen.update(_new(before))
        try:
            outs = runner.run(list(cases), sampling)
        except EngineRefused as e:
            out.refused = str(e)
            return out
        seen.update(_new(before))
        out.outputs = list(outs)
        ids = [o.case_id for o in outs]
        if ids != [c.id for c in cases]:
            say(f"{name}: answered {ids} to the cases {[c.id for c in cases]} (one output per case, "
                f"in order)")
        for o in outs:
            if o.error is None and not o.token_ids:
                say(f"{name}: {o.case_id}: no tokens and no error")
            if o.error is not None and not o.error.strip():
                say(f"{name}: {o.case_id}: an empty error")
            if len(o.token_ids) > sampling.max_tokens:
                say(f"{name}: {o.case_id}: {len(o.token_ids)} tokens, max_tokens {sampling.max_tokens}")
        out.info = runner.info()
        out.problems += _info(name, runner, spec, "after run")
        out.facts = runner.facts()
        if not isinstance(out.facts, RunFacts) or not out.facts.device:
            say(f"{name}: facts() after run names no device: {out.facts!r}")
    finally:
        for attempt in ("first", "second"):
            try:
                runner.close()
            except Exception as e:  # noqa: BLE001
                say(f"{name}: close() ({attempt} call) raised {type(e).__name__}: {e}")
    left = _left(seen, set(spared()), settle_s)
    if left:
        say(f"{name}: left {len(left)} process(es) running after close(): "
            + "; ".join(f"pid {p} {cmd}" for p, cmd in sorted(left.items())))
    return out


# --- processes ----------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, process group, start time) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[1].split()
    if rest[0] == "Z":
        return None
    return int(rest[1]), int(rest[2]), rest[19]


def descendants(root: int | None = None) -> dict[int, str]:
    """Every live process below ``root`` (this one): pid -> its start time (a pid reused later is
    another process)."""
    root = root or os.getpid()
    parent: dict[int, int] = {}
    start: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := _stat(int(entry))) is not None:
            parent[int(entry)], start[int(entry)] = s[0], s[2]
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        me = todo.pop()
        for pid, pp in parent.items():
            if pp == me and pid not in out:
                out[pid] = start[pid]
                todo.append(pid)
    return out


def _new(before: set[int]) -> dict[int, str]:
    return {p: t for p, t in descendants().items() if p not in before}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def _left(seen: dict[int, str], spared: set[int], settle_s: float) -> dict[int, str]:
    """The processes of ``seen`` still running (the same start time) after ``settle_s``, outside the
    ``spared`` process groups."""
    deadline = time.monotonic() + settle_s
    while True:
        left = {}
        for pid, started in seen.items():
            s = _stat(pid)
            if s is not None and s[2] == started and s[1] not in spared:
                left[pid] = _cmdline(pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
