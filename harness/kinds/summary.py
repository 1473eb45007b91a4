"""Record kinds that judge no engine run: summaries of other records (``bisect``, ``repin``).

A summary is written beside the records it stands for, atomically like any record, and FEATURES.md
and SUPPORTED_MODELS.md never show it (:func:`is_summary`). Like a gate kind it carries its own
staleness rule (:func:`harness.kinds.staleness` applies it after the rules every record has); a
summary kind without one is refused by :func:`register_summary`.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.records import Record
from harness.registry import Registry
from harness.staleness import Rule, oracle_reasons


@dataclass(frozen=True, slots=True)
class SummaryKind:
    name: str
    stale: Rule
    """Why a record of this kind no longer describes the tree, by the kind's own rule."""


SUMMARIES: Registry[SummaryKind] = Registry("summary record kind")
"""Record kind -> the summary kind it is (add one with :func:`register_summary`)."""


def register_summary(name: str, stale: Rule, help: str) -> SummaryKind:  # noqa: A002
    if not callable(stale):
        raise TypeError(f"summary record kind {name!r} needs a staleness rule, got {stale!r}")
    return SUMMARIES.register(name, help=help)(SummaryKind(name, stale))


def is_summary(rec: Record) -> bool:
    return SUMMARIES.find(rec.kind) is not None


register_summary("bisect", oracle_reasons, help=(
    "since when a vLLM release or a cmd: engine's commit changed (harness.bisect): its oracle is the "
    "goldens every step was judged against, so it goes stale exactly when they would"))
register_summary("repin", oracle_reasons, help=(
    "what moving the oracle pin changes, or did (harness.repin): its oracle is the goldens it stands "
    "beside (what-if) or moved in (accepted)"))
