"""Every gate kind, registered: importing this module imports each kind, which registers itself with
:func:`~harness.kinds.base.register_kind`; a new kind is one import below. The pipeline, the pages and
the staleness rules read :data:`KINDS` from here.
"""

from harness.kinds.ab import kind as ab  # noqa: F401 - it registers
from harness.kinds.api import kind as api  # noqa: F401 - it registers
from harness.kinds.base import KINDS, GateKind, GateRequest, Judgement, register_kind
from harness.kinds.invariance import kind as invariance  # noqa: F401 - it registers
from harness.kinds.kv import kind as kv_roundtrip  # noqa: F401 - it registers
from harness.kinds.localize import kind as localize  # noqa: F401 - it registers
from harness.kinds.parity import kind as parity  # noqa: F401 - it registers
from harness.kinds.rl import kind as rl  # noqa: F401 - it registers
from harness.kinds.sampling import kind as sampling  # noqa: F401 - it registers
from harness.kinds.spec import kind as spec  # noqa: F401 - it registers
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
