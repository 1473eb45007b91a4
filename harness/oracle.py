"""The oracle: a role, not a class. The pinned vLLM (``requirements/oracle.txt``) runs through the
same engine registry as every candidate, under the name ``oracle``.

* :func:`record_goldens` runs it once over a whole suite and writes ``goldens/<model>/<suite>/``
  (the only way goldens change: ``make record``);
* :func:`load_or_record` gives a gate verified goldens, recording them first when none exist;
* :func:`measure_speed` times it on a workload at a concurrency, for candidate/oracle speed ratios.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from pathlib import Path

from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Sampling
from harness.engines import RunnerContext, make_runner
from harness.goldens import (
    Golden,
    GoldenError,
    golden_dir,
    lock_path,
    read_golden,
    record_command,
    recording,
    staleness,
    write_golden,
)
from harness.models import ModelRef
from harness.pin import OraclePin, oracle_pin
from harness.provenance import device_facts, git_dirty, git_sha, now_utc, platform_facts
from harness.speed import Speed
from harness.steps import step
from harness.suites import Suite
from harness.workspace import Workspace

ORACLE = "oracle"
"""The name the oracle's runner reports (``EngineInfo.name``) in goldens and records."""


def oracle_available() -> str | None:
    """None when the pinned vLLM is importable here, else why not."""
    return None if importlib.util.find_spec("vllm") else "vLLM is not installed in this environment"


def oracle_spec(engine: str, suite: Suite) -> str:
    """The oracle's engine spec for ``suite``: ``engine``, with the suite's ``[oracle] dtype``."""
    if suite.oracle_dtype is None:
        return engine
    return f"{engine}{',' if ':' in engine else ':'}dtype={suite.oracle_dtype}"


def record_goldens(ws: Workspace, model: ModelRef, suite: Suite, pin: OraclePin | None = None, *,
                   engine: str | None = None, into: Path | None = None) -> Golden:
    """Run the pinned oracle once over the whole suite and write goldens/<model>/<suite>/, under the
    goldens' recording lock (a gate that wants them meanwhile waits, then reads what this wrote).

    ``pin``, ``engine`` and ``into`` record with another release instead (``harness repin``'s
    what-if: ``vllm@0.31.0`` into a scratch folder, never ``goldens/``)."""
    other = {"engine": engine, "into": into} if engine is not None or into is not None else {}
    if into is not None:
        return _record(ws, model, suite, pin, **other)
    with recording(lock_path(ws.root, model.slug, suite.name)):
        return _record(ws, model, suite, pin, **other)


def _record(ws: Workspace, model: ModelRef, suite: Suite, pin: OraclePin | None, *, engine: str | None = None,
            into: Path | None = None) -> Golden:
    pin = pin or oracle_pin()
    if engine is None and (why := oracle_available()) is not None:
        raise GoldenError(f"cannot record goldens for {model.name}/{suite.name}: {why}. "
                          "Install the oracle with `make venv`, then "
                          + record_command(model.name, suite.name))
    cases = suite.build_cases(model.encode, model.limits)
    ws.runs.mkdir(parents=True, exist_ok=True)
    runner = make_runner(oracle_spec(engine or pin.engine, suite), model,
                         RunnerContext(run_dir=ws.runs, name=ORACLE))
    t0 = time.perf_counter()
    try:
        with step(f"recording goldens {model.name}/{suite.name} with {pin.spec}"):
            runner.start()
            outputs = runner.run(cases, suite.sampling)
    except (EngineRefused, EngineFailed) as e:
        tail = e.log_tail if isinstance(e, EngineFailed) else ""
        raise GoldenError(f"the oracle ({pin.spec}) could not run {model.name}/{suite.name}: {e}"
                          + (f"\n--- engine log tail ---\n{tail}" if tail else "")) from None
    finally:
        runner.close()
    info = runner.info()
    if info.version != pin.version:
        raise GoldenError(f"the installed vLLM is {info.version} but the oracle pin is {pin.spec}: "
                          f"run `make venv` to install the pin before recording")
    facts = runner.facts()
    timings = {**facts.timings, "record_wall_s": time.perf_counter() - t0}
    folder = write_golden(
        golden_dir(into or ws.goldens, model, suite.name), model=model, suite=suite, cases=cases,
        outputs=outputs, oracle=EngineInfo(ORACLE, info.engine, info.version, settings=info.settings),
        pin=pin, provenance={
            "harness_sha": git_sha(ws.root), "harness_dirty": git_dirty(ws.root),
            "platform": platform_facts(), "device": dict(facts.device) or device_facts(),
            "created": now_utc(),
            "timings": timings})
    return read_golden(folder, model_name=model.name, suite_name=suite.name)


def load_or_record(ws: Workspace, model: ModelRef, suite: Suite, *, auto_record: bool,
                   pin: OraclePin | None = None) -> tuple[Golden, bool]:
    """The verified goldens for model+suite; records them first when missing and allowed.

    Returns (golden, recorded_now). Stale goldens are refused, never silently re-recorded.
    """
    pin = pin or oracle_pin()
    folder = golden_dir(ws.goldens, model, suite.name)
    if not (folder / "manifest.json").exists():
        if not auto_record:
            raise GoldenError(f"no goldens for {model.name}/{suite.name}; "
                              f"record them with: {record_command(model.name, suite.name)}")
        with recording(lock_path(ws.root, model.slug, suite.name)):
            if not (folder / "manifest.json").exists():  # else another gate recorded them meanwhile
                return record_goldens(ws, model, suite, pin), True
    golden = read_golden(folder, model_name=model.name, suite_name=suite.name)
    why = staleness(golden, model=model, suite=suite, pin=pin, cases=suite.build_cases(model.encode))
    if why:
        raise GoldenError(f"stale goldens in {folder}:\n  - " + "\n  - ".join(why)
                          + f"\nre-record them with: {record_command(model.name, suite.name)}")
    return golden, False


def measure_speed(model: ModelRef, cases: Sequence[Case], sampling: Sampling, concurrency: int,
                  run_dir: Path, pin: OraclePin | None = None) -> Speed:
    """Replay ``cases`` on the pinned oracle at ``concurrency`` (one engine start) and time it."""
    pin = pin or oracle_pin()
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = make_runner(pin.engine, model, RunnerContext(run_dir=run_dir, concurrency=concurrency,
                                                          name="oracle-speed"))
    try:
        runner.start()
        outs = runner.run(cases, sampling)
    finally:
        runner.close()
    speed = runner.facts().speed
    if speed is None:
        raise RuntimeError("the oracle's engine reported no speed")
    failed = [o.case_id for o in outs if o.error]
    if failed:
        raise RuntimeError(f"the oracle failed on {', '.join(failed)}")
    return speed
