"""pytest plugin: gate an engine from your own test suite, or run a matrix file as pytest items.

Installed with the package (entry point ``pytest11``). In a test::

    def test_my_engine_matches_vllm(parity_gate):
        parity_gate(model="tiny-llama", suite="smoke", candidate="openai:http://127.0.0.1:8000")

``parity_gate`` runs the gate, writes its record, and fails the test with every failing verdict's
explanation when the outcome is not ``pass``. ``--parity-root`` points at a harness workspace
(suites/, goldens/, models/, reports/); the default is the installed harness's repository.

Every session counts the engines it starts (:mod:`harness.engines.launch.ledger`): ``$HARNESS_ENGINE_LEDGER``
points at a file for the session (unless already set), and the terminal summary ends with the count
(``engine starts: 0`` included), the seconds spent starting them, which test files paid for them and
which engines (kind and model) they were; above it, the ten slowest tests (setup, call and teardown).

``pytest --harness-matrix fleet.toml [--harness-shard I/N] [--harness-device cpu|cuda|all]`` makes
every entry of the matrix file (of this machine's device kind, of shard I of N) one pytest item:
``-n auto`` (pytest-xdist) runs entries in parallel, ``--junitxml`` gives one JUnit case per entry
with its record, outcome and timings as properties. An entry the matrix expects to fail
(``expect = "fail"``) is an ``xfail`` that turns into a failure if it passes or fails otherwise.
Given alone, ``--harness-matrix`` replaces the configured test paths: only the matrix runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.engines.launch import ledger
from harness.records import Record
from harness.signals import interrupt_on_sigterm
from harness.workspace import Workspace


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("parity-harness")
    g.addoption("--parity-root", default=None, help="harness workspace (suites/, goldens/, reports/)")
    g.addoption("--parity-no-record", action="store_true",
                help="fail instead of recording missing goldens with the oracle")
    g.addoption("--harness-matrix", default=None, metavar="FILE",
                help="run every entry of this matrix file (fleet.toml) as a pytest item")
    g.addoption("--harness-shard", default=None, metavar="I/N",
                help="only the entries of shard I of N (balanced by recorded durations)")
    g.addoption("--harness-device", default="auto", choices=["auto", "cpu", "cuda", "all"],
                help="which device kind's entries to run (auto: cuda when a GPU is visible, else cpu)")


def failure_report(rec: Record) -> str:
    lines = [f"gate {rec.outcome}: {rec.summary}"]
    lines += [v.detail or v.summary for v in rec.verdicts
              if v.comparator in rec.gates and v.status != "pass"]
    lines += [f"{'VACUOUS' if c.vacuates else 'positive control failed'}: {c.comparator} control "
              f"{c.mutation!r} expected {c.expect}, got {c.got}" for c in rec.controls if not c.ok]
    return "\n".join(lines)


@pytest.fixture
def parity_workspace(request: pytest.FixtureRequest) -> Workspace:
    root = request.config.getoption("--parity-root")
    return Workspace(Path(root).resolve()) if root else Workspace.default()


@pytest.fixture
def parity_gate(request: pytest.FixtureRequest, parity_workspace: Workspace) -> Callable[..., Record]:
    from harness.pipeline import run_gate_by_name

    auto = not request.config.getoption("--parity-no-record")

    def gate(model: str = "tiny-llama", suite: str = "smoke", candidate: str = "hf") -> Record:
        rec = run_gate_by_name(parity_workspace, model, suite, candidate, auto_record=auto).record
        if rec.outcome != "pass":
            pytest.fail(failure_report(rec), pytrace=False)
        return rec

    return gate


# ---------------------------------------------------------------------------------------------
# the matrix file as pytest items

MATRIX = pytest.StashKey[Path]()
SELECTION = pytest.StashKey[str]()


def _workspace(config: pytest.Config) -> Workspace:
    root = config.getoption("--parity-root")
    return Workspace(Path(root).resolve()) if root else Workspace.default()


SLOWEST = 10
"""How many of the slowest tests the terminal summary names."""
LEDGER = pytest.StashKey[str]()  # the session's ledger file
OWN_LEDGER = pytest.StashKey[bool]()  # made for this session (deleted at its end), not named by a caller


def session_ledger(config: pytest.Config) -> str | None:
    """The session's engine-start ledger file: what ``$HARNESS_ENGINE_LEDGER`` named when the session
    began (a test may point the variable elsewhere for a while)."""
    return config.stash.get(LEDGER, None)


def pytest_configure(config: pytest.Config) -> None:
    interrupt_on_sigterm()  # SIGTERM stops the whole run, not just the current test
    if not os.environ.get(ledger.ENV) and not hasattr(config, "workerinput"):  # xdist workers inherit it
        fd, path = tempfile.mkstemp(prefix="harness-engine-starts-", suffix=".jsonl")
        os.close(fd)
        os.environ[ledger.ENV] = path
        config.stash[OWN_LEDGER] = True
    if os.environ.get(ledger.ENV):
        config.stash[LEDGER] = os.environ[ledger.ENV]
    name = config.getoption("--harness-matrix")
    if not name:
        return
    path = Path(name).resolve()
    if not path.is_file():
        raise pytest.UsageError(f"--harness-matrix {name}: no such file")
    if config.getoption("--harness-shard") and config.getoption("--harness-device") == "all":
        raise pytest.UsageError("--harness-shard needs one device kind (--harness-device cpu|cuda): "
                                "each device's entries are sharded on their own")
    config.stash[MATRIX] = path
    _share_cores()
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(path)]  # the matrix alone, not the configured test paths
    elif str(path) not in {str(Path(a).resolve()) for a in config.args}:
        config.args.append(str(path))


def slowest(reports: Iterable[Any], n: int = SLOWEST) -> list[tuple[float, str]]:
    """The ``n`` tests that took longest, each as (seconds, node id), longest first: setup, call and
    teardown added up (a module fixture's engine start counts for the test that first asked for it)."""
    total: dict[str, float] = {}
    for r in reports:
        if getattr(r, "when", None) in ("setup", "call", "teardown") and hasattr(r, "duration"):
            total[r.nodeid] = total.get(r.nodeid, 0.0) + float(r.duration)
    return sorted(((s, node) for node, s in total.items()), key=lambda x: (-x[0], x[1]))[:n]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    reports = [r for group in terminalreporter.stats.values() for r in group]
    top = slowest(reports)
    if top:
        terminalreporter.section(f"slowest {len(top)} tests")
        for seconds, node in top:
            terminalreporter.write_line(f"{seconds:8.1f} s  {node}")
    path = session_ledger(config)
    if not path:
        return
    terminalreporter.section("engine starts")
    for line in ledger.summary(ledger.read(path)):
        terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = session_ledger(config)
    if path is not None and config.stash.get(OWN_LEDGER, False):  # not a file a caller named
        os.environ.pop(ledger.ENV, None)
        try:
            os.unlink(path)
        except OSError:
            pass


def _share_cores() -> None:
    """Under pytest-xdist, give each worker its share of the cores for torch's threads (set before
    torch is imported): N workers each spinning up every core's worth of threads only contend."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and workers.isdigit() and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(workers)))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if parent.config.stash.get(MATRIX, None) == file_path:
        return MatrixFile.from_parent(parent, path=file_path)
    return None


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    return config.stash.get(SELECTION, None)


class EntryFailed(Exception):
    """An entry's gate did not come out as the matrix expects (the message is the whole report)."""


class ExpectedOutcome(Exception):
    """An entry the matrix expects to fail (or be refused) did exactly that: reported as xfail."""


class MatrixFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        from harness.fleet.machine import this_machine
        from harness.fleet.plan import describe, make_plan
        from harness.fleet.shard import ShardError
        from harness.fleet.spec import MatrixError

        config = self.config
        device = config.getoption("--harness-device")
        if device == "auto":
            device = this_machine().kind
        shard = config.getoption("--harness-shard")
        try:
            plan = make_plan(self.path, _workspace(config).root)
            chosen = plan.entries(device, shard)
        except (MatrixError, ShardError) as e:
            raise self.CollectError(str(e)) from None
        config.stash[SELECTION] = (f"harness matrix {self.path.name}: {describe(plan, device, chosen)}"
                                   + (f", shard {shard}" if shard else ""))
        for p in sorted(chosen, key=lambda p: (-p.estimate.seconds, p.entry.id)):  # longest first
            yield MatrixItem.from_parent(self, name=p.entry.id, planned=p)


class MatrixItem(pytest.Item):
    def __init__(self, *, planned: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.planned = planned
        e = planned.entry
        self.extra_keyword_matches.update({e.device, e.kind, e.group})
        if e.expect != "pass":
            self.add_marker(pytest.mark.xfail(raises=ExpectedOutcome, strict=True,
                                              reason=f"expected {e.expect}: {e.because}"))

    def runtest(self) -> None:
        from harness.fleet.machine import this_machine
        from harness.fleet.run import run_entry

        e = self.planned.entry
        self.user_properties += [("estimate_s", self.planned.estimate.seconds),
                                 ("estimate_from", self.planned.estimate.source),
                                 ("shard", f"{self.planned.shard[0]}/{self.planned.shard[1]}")]
        why = this_machine().lacks(e.gpus, e.gpu_memory_gib)
        if why:
            raise EntryFailed(f"{e.id}: {why}")
        ws = _workspace(self.config)
        res = run_entry(ws, e, auto_record=not self.config.getoption("--parity-no-record"))
        rec = res.record
        self.user_properties += [("record", res.line(ws.root)["record"]), ("outcome", rec.outcome),
                                 ("wall_s", round(res.wall_s, 2)), ("goldens", res.goldens)]
        where = f"record: {res.line(ws.root)['record']}"
        if rec.outcome == e.expect != "pass":
            raise ExpectedOutcome(f"{rec.outcome}, as the matrix expects ({e.because}): {rec.summary}")
        if rec.outcome != "pass":
            head = f"expected {e.expect} ({e.because}), got " if e.expect != "pass" else ""
            raise EntryFailed(f"{e.id}: {head}{failure_report(rec)}\n{where}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from harness.cli import BAD_INPUT

        if isinstance(excinfo.value, (EntryFailed, ExpectedOutcome, *BAD_INPUT)):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.planned.entry.id
