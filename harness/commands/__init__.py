"""Every ``harness <verb>``, above everything it calls; :mod:`harness.cli` only parses and dispatches.

Each module parses its arguments, calls into the pipeline or a feature package and prints; it
declares its subcommands as ``SUBCOMMANDS`` (name, help, arguments, function), and
:mod:`harness.cli` registers them all. Feature packages hold the logic and never import a command or
the pipeline that uses them.

* :mod:`.gate`            ``harness gate``, ``ab``, ``invariance``, ``record``, ``matrix``
* :mod:`.records`         ``harness venvs``, ``show``, ``list``, ``export``
* :mod:`.pages`           ``harness features``, ``history``, ``trend``
* :mod:`.speed`           ``harness speed``
* :mod:`.localize`        ``harness localize RECORD``, ``harness plant``, and the diagnosis that
                          follows a failing ``harness gate``
* :mod:`.localize_sweep`  the planted proof as a sweep (``benchmarks/localize_sweep.py``)
* :mod:`.sampling`        ``harness sampling``
* :mod:`.rl`              ``harness rl`` (the RL weight-sync gate, its planted controls)
* :mod:`.spec`            ``harness spec`` (the speculative-decoding gate, its planted controls)
* :mod:`.bisect`          ``harness bisect``
* :mod:`.repin`           ``harness repin``
* :mod:`.fleet`           ``harness plan``, ``harness pin``, ``harness merge`` (the fleet)
* :mod:`.site`            ``harness site`` (the static results site)
"""

from __future__ import annotations

from harness.commands import (
    bisect,
    fleet,
    gate,
    localize,
    pages,
    records,
    repin,
    rl,
    sampling,
    site,
    spec,
    speed,
)

SUBCOMMANDS = (*gate.SUBCOMMANDS, *records.SUBCOMMANDS, *pages.SUBCOMMANDS, *speed.SUBCOMMANDS,
               *localize.SUBCOMMANDS, *bisect.SUBCOMMANDS, *repin.SUBCOMMANDS, *sampling.SUBCOMMANDS,
               *rl.SUBCOMMANDS, *spec.SUBCOMMANDS, *fleet.SUBCOMMANDS, *site.SUBCOMMANDS)
"""Every subcommand these modules declare, in the order ``harness --help`` lists them."""
