"""The engine launcher's guarantees, with stand-in engines (a python that forks a child, as vLLM's
frontend forks its engine-core process): no engine process outlives the harness, however the
harness ends, and the engine's exit status comes through the guard unchanged. About 10 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.engines.launch.procs import group_members, pid_running, run_engine
from tests.unit.child_pytest import NO_HYPOTHESIS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A stand-in engine: forks a child that would run for ten minutes (vLLM's engine core), writes both
# pids, then does what argv[2] says.
ENGINE = textwrap.dedent("""\
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}\\n")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    if sys.argv[2] == "leave":
        os._exit(3)        # leaves its child behind, as vLLM's frontend does after its results
    time.sleep(600)
    """)


def _gone(pids: list[int], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _pids(path: Path, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"the stand-in engine never wrote {path}")


def test_an_engine_that_exits_leaving_a_child_is_cleaned_up_and_its_status_kept(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text(ENGINE)
    pids = tmp_path / "pids"
    done = run_engine([sys.executable, str(tmp_path / "engine.py"), str(pids), "leave"], tmp_path / "log", 60, label="leave")
    assert done.returncode == 3 and not done.timed_out
    assert _gone(_pids(pids), timeout=1.0), "the engine's child outlived it"


def test_a_timeout_stops_the_whole_group(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text(ENGINE)
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    done = run_engine([sys.executable, str(tmp_path / "engine.py"), str(pids), "hang"], tmp_path / "log", 3, label="hang")
    assert done.timed_out and done.returncode == -9
    assert time.monotonic() - t0 < 30
    assert _gone(_pids(pids), timeout=1.0)


def _sigint_as_at_a_terminal() -> None:
    """A test run in the background of a non-interactive shell ignores SIGINT, and an ignored signal
    stays ignored across exec: the harness under test gets it as a terminal delivers it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_no_engine_process_outlives_a_harness_stopped_by_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGKILL is the case the kernel's parent-death signal alone missed: it reaches the direct
    child, never the processes that child forked (vLLM's engine core), which were left running."""
    (tmp_path / "engine.py").write_text(ENGINE)
    pids = tmp_path / "pids"
    harness = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        from pathlib import Path
        from harness.engines.launch.procs import run_engine
        run_engine([{sys.executable!r}, {str(tmp_path / "engine.py")!r}, {str(pids)!r}, "hang"],
                   Path({str(tmp_path / "log")!r}), 600, label="hang")
        """)], preexec_fn=_sigint_as_at_a_terminal)
    engine = _pids(pids)
    group = group_members(os.getpgid(engine[0]))  # the engine, its child, and the guard
    assert set(engine) <= set(group)
    os.kill(harness.pid, sig)
    harness.wait(timeout=30)
    assert _gone(group), f"after {sig.name} to the harness, engine processes are left: " + ", ".join(
        f"{p} {Path(f'/proc/{p}/cmdline').read_bytes()[:80]!r}" for p in group if pid_running(p))


def test_sigterm_stops_a_whole_pytest_run_and_its_engines(tmp_path: Path) -> None:
    """SIGTERM during a test used to become SystemExit, which pytest records as that test's
    failure before going on with the next test: a cancelled CI job kept running."""
    (tmp_path / "engine.py").write_text(ENGINE)
    pids = tmp_path / "pids"
    (tmp_path / "test_long.py").write_text(textwrap.dedent(f"""\
        from pathlib import Path
        from harness.engines.launch.procs import run_engine

        def test_one():
            run_engine([{sys.executable!r}, {str(tmp_path / "engine.py")!r}, {str(pids)!r}, "hang"],
                       Path({str(tmp_path / "log")!r}), 600, label="hang")

        def test_two():
            Path({str(tmp_path / "two-ran")!r}).write_text("yes")
        """))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NO_HYPOTHESIS,
                            str(tmp_path / "test_long.py")], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    engine = _pids(pids)
    run.send_signal(signal.SIGTERM)
    out, _ = run.communicate(timeout=60)
    text = out.decode(errors="replace")
    assert run.returncode == 2, text  # pytest's "interrupted"
    assert "SIGTERM" in text, text
    assert not (tmp_path / "two-ran").exists(), "pytest went on with the next test after SIGTERM"
    assert _gone(engine), "the engine outlived the stopped test run"


def test_a_passed_descriptor_reaches_the_engine_through_the_guard_and_no_other_does() -> None:
    """spawn(pass_fds=...) hands the engine a pipe of its own (the engine pool's acknowledgements);
    a descriptor not named stays closed in the engine."""
    from harness.engines.launch.procs import kill_group, spawn

    r, w = os.pipe()
    r2, w2 = os.pipe()
    code = (f"import os\nos.write({w}, b'ack')\n"
            f"try:\n    os.write({w2}, b'x')\nexcept OSError:\n    os.write({w}, b' closed')\n")
    try:
        proc = spawn([sys.executable, "-c", code], stdout=subprocess.DEVNULL, pass_fds=(w,))
    finally:
        os.close(w)
    try:
        assert proc.wait(timeout=60) == 0
        assert os.read(r, 100) == b"ack closed"
    finally:
        kill_group(proc)
        for fd in (r, r2, w2):
            os.close(fd)


def test_the_guard_refuses_a_malformed_command_line() -> None:
    guard = Path(__file__).resolve().parents[2] / "harness" / "engines" / "launch" / "guard.py"
    for args in (["3"], ["3", "--"], ["3", "--keep=x", "--", "true"], ["3", "true"]):
        p = subprocess.run([sys.executable, str(guard), *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "usage: guard.py FD [--keep=N ...] -- ARGV" in p.stderr, (args, p)
