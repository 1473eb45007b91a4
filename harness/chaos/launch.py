"""Running the harness as a user would, in a private workspace, and injecting a fault mid-run.

A :class:`Sandbox` is a folder with copies of ``suites/``, ``models/tiny-llama`` and
``goldens/tiny-llama`` (and whatever a scenario adds) and an empty ``reports/``; the harness runs
there as ``python -m harness.cli ...`` with ``HARNESS_ROOT`` pointing at it, in its own session, its
process tree watched (:class:`~harness.chaos.watch.TreeWatch`). A trigger says when the run is far
enough along (an engine's core process is up) and the injection happens then.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.chaos.watch import TreeWatch
from harness.excerpt import NOTE, clip
from harness.workspace import REPO_ROOT

MODEL = "tiny-llama"
ENGINE_CORE = "EngineCore"
"""vLLM's engine-core process names itself ``VLLM::EngineCore``: the engine is fully up."""


@dataclass(frozen=True, slots=True)
class Sandbox:
    root: Path

    @classmethod
    def make(cls, parent: Path, name: str, extra: Sequence[str] = ()) -> Sandbox:
        root = parent / name
        for rel in ("suites", f"models/{MODEL}", f"goldens/{MODEL}", *extra):
            src = REPO_ROOT / rel
            if src.is_dir():
                shutil.copytree(src, root / rel)
            else:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, root / rel)
        (root / "reports" / "records").mkdir(parents=True, exist_ok=True)
        return cls(root)

    @property
    def records(self) -> Path:
        return self.root / "reports" / "records"

    @property
    def goldens(self) -> Path:
        return self.root / "goldens"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "HARNESS_ROOT": str(self.root), "PYTHONUNBUFFERED": "1", **(extra or {})}


def harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli", *args]


@dataclass
class Ran:
    rc: int
    output: str
    wall_s: float
    injected: str | None
    """What was done, or None when the trigger never came (the run ended first)."""
    after_s: float | None
    """Seconds from the injection to the process's exit."""
    watch: TreeWatch


Trigger = Callable[[TreeWatch], bool]
Inject = Callable[[subprocess.Popen[bytes], TreeWatch], str]


def engine_up(*needles: str) -> Trigger:
    """An engine's core process is running (below a process whose command line holds ``needles``)."""
    return lambda w: bool(w.matching(ENGINE_CORE)) and all(w.matching(n) for n in needles)


def _signals_as_at_a_terminal() -> None:
    """In the child before exec: SIGINT as a terminal delivers it. A table run in the background of
    a non-interactive shell (``make chaos &``, a CI step) ignores SIGINT, and an ignored signal stays
    ignored across exec: the SIGINT rows would then measure nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(sandbox: Sandbox, argv: Sequence[str], *, trigger: Trigger | None = None,
        inject: Inject | None = None, timeout_s: float = 1800, env: Mapping[str, str] | None = None,
        log: Path | None = None) -> Ran:
    """Run ``argv`` in ``sandbox`` (own session, so signals reach only what we send them to)."""
    log = log or sandbox.root / "harness.log"
    t0 = time.monotonic()
    with log.open("wb") as fh:
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=sandbox.root, env=sandbox.env(env), start_new_session=True,
                                preexec_fn=_signals_as_at_a_terminal)
        watch = TreeWatch(proc.pid)
        injected, t_inj = None, None
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    proc.kill()
                    injected = injected or f"nothing: the run did not reach its trigger in {timeout_s:.0f} s"
                    break
                if inject is not None and injected is None and trigger is not None and trigger(watch):
                    injected, t_inj = inject(proc, watch), time.monotonic()
                time.sleep(0.1)
            proc.wait()
        finally:
            watch.poll()
    t1 = time.monotonic()
    return Ran(proc.returncode, log.read_text(errors="replace"), t1 - t0, injected,
               (t1 - t_inj) if t_inj is not None else None, watch)


def signal_harness(sig: int) -> Inject:
    def inject(proc: subprocess.Popen[bytes], watch: TreeWatch) -> str:
        n = len(watch.left())
        os.kill(proc.pid, sig)
        return f"signal {sig} to the harness (pid {proc.pid}) with {n} processes below it"
    return inject


def unwrapped(output: str) -> str:
    """The output without line breaks: a console without a terminal wraps at 80 columns, mid-word."""
    return output.replace("\n", "")


def last_error(output: str, root: Path | None = None) -> str:
    """The harness's last ``error:`` message (unwrapped, the workspace's path shortened to ``…``),
    else its last line."""
    if root is not None:
        output = unwrapped(output).replace(str(root), "…")
    at = output.rfind("error:")
    if at >= 0:
        return clip(" ".join(unwrapped(output[at:]).split()), NOTE)
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return clip((lines or ["(no output)"])[-1], NOTE)
