"""Gate kinds, registered by suite kind: ``parity``, ``kv_roundtrip``, ``ab``, ``invariance``,
``sampling``, ``api``; and ``localize``, which runs on a parity suite (``run_gate(..., kind="localize")``).

Each is a prepare -> run -> judge, plus its staleness rule (:class:`~harness.kinds.base.GateKind`);
the pipeline (:mod:`harness.pipeline`) runs them and builds the one record. A new kind is one module
that registers itself with :func:`~harness.kinds.base.register_kind` and one import below.
"""

from harness.kinds import ab, api, invariance, kv_roundtrip, localize, parity, rl, sampling  # noqa: F401 - they register
from harness.kinds.base import KINDS, GateKind, GateRequest, Judgement, register_kind
from harness.kinds.summary import SUMMARIES, is_summary
from harness.records import Record
from harness.staleness import Current, common_reasons

__all__ = ["KINDS", "SUMMARIES", "GateKind", "GateRequest", "Judgement", "is_summary", "register_kind",
           "staleness"]


def staleness(rec: Record, cur: Current) -> list[str]:
    """Why ``rec`` no longer describes the tree (empty: it still does): the rules every record has,
    then its gate kind's (or summary kind's, :mod:`harness.kinds.summary`) own."""
    kind = KINDS.find(rec.kind) or SUMMARIES.find(rec.kind)
    own = kind.stale(rec, cur) if kind is not None else [
        f"record kind {rec.kind!r} is no gate or summary kind of this tree: nothing can say whether it "
        "still holds"]
    return common_reasons(rec, cur) + own
