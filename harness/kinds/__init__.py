"""Gate kinds, registered by suite kind: ``parity``, ``kv_roundtrip``, ``ab``, ``invariance``,
``sampling``.

Each is a prepare -> run -> judge (:class:`~harness.kinds.base.GateKind`); the pipeline
(:mod:`harness.pipeline`) runs them and builds the one record. A new kind is one module that
registers itself in :data:`~harness.kinds.base.KINDS` and one import below.
"""

from harness.kinds import ab, invariance, kv_roundtrip, parity, sampling  # noqa: F401 - they register
from harness.kinds.base import KINDS, GateKind, GateRequest, Judgement

__all__ = ["KINDS", "GateKind", "GateRequest", "Judgement"]
