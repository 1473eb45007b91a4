"""The ``harness`` subcommands that live in modules of their own, above everything they call.

Each module parses its arguments, calls into a feature package and prints; it declares its
subcommands as ``SUBCOMMANDS`` (name, help, arguments, function), and :mod:`harness.cli` registers
them all. Feature packages (:mod:`harness.localize`, :mod:`harness.sampling`, :mod:`harness.bisect`,
:mod:`harness.repin`, :mod:`harness.fleet`) hold the logic and never import a command or the
pipeline that uses them.

* :mod:`.localize`        ``harness localize RECORD``, ``harness plant``, and the diagnosis that
                          follows a failing ``harness gate``
* :mod:`.localize_sweep`  the planted proof as a sweep (``benchmarks/localize_sweep.py``)
* :mod:`.sampling`        ``harness sampling``
* :mod:`.rl`              ``harness rl`` (the RL weight-sync gate, its planted controls)
* :mod:`.bisect`          ``harness bisect``
* :mod:`.repin`           ``harness repin``
* :mod:`.fleet`           ``harness plan``, ``harness pin``, ``harness merge`` (the fleet)
"""

from __future__ import annotations

from harness.commands import bisect, fleet, localize, repin, rl, sampling

SUBCOMMANDS = (*localize.SUBCOMMANDS, *bisect.SUBCOMMANDS, *repin.SUBCOMMANDS, *sampling.SUBCOMMANDS,
               *rl.SUBCOMMANDS, *fleet.SUBCOMMANDS)
"""Every subcommand these modules declare, in the order ``harness --help`` lists them."""
