"""A server process the harness starts on 127.0.0.1 and a free port, and always stops.

The engine server (vLLM's ``api_server``, llama-cpp-python's ``llama_cpp.server``) is launched as
the leader of its own process group with its output in a log file, polled until its health path
answers 200, and stopped — its whole group — however the run ends (:mod:`harness.engines.launch.procs`).
A port taken between probing and binding is retried on another.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness.api import EngineFailed
from harness.engines.launch import ledger
from harness.engines.launch.procs import engine_env, group_alive, kill_group, spawn
from harness.steps import step


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LoopbackServer:
    """One server process group. Subclasses give :meth:`command`; use as a context manager, or
    ``start()`` / ``stop()``."""

    label = "server"
    """How errors name it (``vLLM server``, ``llama.cpp server``)."""
    kind = "server"
    """How the engine-start ledger (:mod:`harness.engines.launch.ledger`) counts it."""
    model_name = ""
    health_path = "/health"

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, log_path: Path | None = None,
                 start_timeout_s: float = 900.0) -> None:
        self.host = host
        self.port = port
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s: float | None = None
        """Seconds from launch to the health path answering 200."""

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return engine_env()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> str:
        """Launch and wait for the health path; returns the base URL. Raises :class:`EngineFailed`."""
        with step(f"{self.label} start"):
            for _attempt in range(3):  # the free port may be taken between probing and binding
                self.port = self.port or free_port(self.host)
                self._launch()
                try:
                    self._wait_healthy()
                    return self.base_url
                except EngineFailed as e:
                    in_use = "address already in use" in (e.log_tail or "").lower()
                    self.stop()
                    if not in_use:
                        raise
                    self.port = None
            raise EngineFailed(f"{self.label}: no free port after 3 attempts")

    def _launch(self) -> None:
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="server-", suffix=".log")[1])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = spawn(self.command(), stdout=log, env=self.env())
        self._t0 = time.perf_counter()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if (why := self.exited()) is not None:
                ledger.record(self.kind, self.model_name, None, ok=False, port=self.port)
                raise EngineFailed(f"{self.label} exited during start-up: {why}", self.log_tail())
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
                conn.request("GET", self.health_path)
                ok = conn.getresponse().status == 200
                conn.close()
                if ok:
                    self.start_s = time.perf_counter() - self._t0
                    ledger.record(self.kind, self.model_name, self.start_s, port=self.port)
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        raise EngineFailed(f"{self.label} did not become healthy within {self.start_timeout_s:.0f} s",
                           self.log_tail())

    def exited(self) -> str | None:
        """None while the server runs; else how it ended (for error messages)."""
        if self.proc is None:
            return "never started"
        code = self.proc.poll()
        return None if code is None else f"exit code {code}; log tail: {self.log_tail(600)!r}"

    def log_tail(self, n: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        """Stop the whole process group. Idempotent."""
        if self.proc is not None:
            kill_group(self.proc)

    def running(self) -> bool:
        return self.proc is not None and group_alive(self.proc.pid)

    def __enter__(self) -> LoopbackServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
