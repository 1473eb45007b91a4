"""How the harness answers SIGTERM: as an exit in a gate, as Ctrl-C in a test run.

A gate that receives SIGTERM must stop the engines it started before it goes (``finally`` blocks,
``atexit``): :func:`exit_on_sigterm` turns the signal into SystemExit once an engine is running. A
test run must stop altogether (a cancelled CI job): :func:`interrupt_on_sigterm`, installed by the
pytest plugin, turns it into :class:`Terminated`, a KeyboardInterrupt, which pytest does not count
as one test's failure but as the end of the session.
"""

from __future__ import annotations

import signal
import threading


def exit_on_sigterm() -> None:
    """SIGTERM -> SystemExit in the main thread (only where nobody handles SIGTERM yet), so that
    ``finally`` blocks and ``atexit`` stop the engines this process started."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_now)


def _exit_now(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: the whole program stops, running its cleanups on the way."""


def interrupt_on_sigterm() -> None:
    """SIGTERM -> :class:`Terminated` in the main thread (where nobody handles SIGTERM yet).

    For a test runner: :func:`exit_on_sigterm`'s SystemExit inside a test is that test's failure,
    and pytest goes on with the next one (a cancelled CI job keeps running); a KeyboardInterrupt
    stops the session, tears its fixtures down and lets ``finally`` blocks stop the engines. A
    second SIGTERM kills at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt_now)


def _interrupt_now(signum: int, frame: object) -> None:
    signal.signal(signum, signal.SIG_DFL)
    raise Terminated("SIGTERM: the run was stopped (engines are stopped on the way out)")
