"""A server the harness started never outlives the harness: not when the harness gets SIGTERM, not
when it is SIGKILLed. The "server" here is a stand-in that never becomes healthy (VLLMServer runs
``<python> -m vllm.entrypoints.openai.api_server ...``; this python ignores its arguments)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.engines.launch.procs import pid_running
from harness.workspace import REPO_ROOT


def _wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= 2:
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def _start_harness(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    pids = tmp_path / "pids"
    fake = tmp_path / "fake-python"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pids)!r}, "w").write(f"{{__import__('os').getpid()}}\\n{{child.pid}}\\n")
        time.sleep(600)
        """))
    fake.chmod(0o755)
    harness = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        from pathlib import Path
        from harness.engines.vllm.server import VLLMServer
        from harness.models import resolve_model
        from harness.workspace import Workspace
        model = resolve_model("tiny-llama", Workspace(Path({str(REPO_ROOT)!r})))
        VLLMServer(model, python={str(fake)!r}, start_timeout_s=300,
                   log_path=Path({str(tmp_path / "server.log")!r})).start()
        """)], cwd=REPO_ROOT)
    server, child = (int(x) for x in _wait_for(pids).split())
    return harness, server, child


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_running(pid):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_to_the_harness_stops_the_whole_server_group(tmp_path: Path) -> None:
    harness, server, child = _start_harness(tmp_path)
    harness.send_signal(signal.SIGTERM)
    assert harness.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone(server) and _gone(child)


def test_a_killed_harness_takes_the_server_down_with_it(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    harness, server, child = _start_harness(tmp_path)
    harness.kill()
    harness.wait(timeout=10)
    assert _gone(server), "the server outlived a SIGKILLed harness"
    os.kill(child, signal.SIGKILL)  # a real vLLM server stops its own engine processes; this one cannot
