"""Wire schema: every reply and every stream event the other facets' probes received, from both
servers, validated against the OpenAI API's published types (:mod:`harness.kinds.api.wire`: the
``openai`` package's pydantic models, strict). The facet sends nothing itself.

A deviation the candidate shares with the oracle on the same probe (the same path, indices left out,
and expected type) is the oracle's own: reported in the verdict and the record, and not held against
the candidate; a deviation the oracle does not show fails the probe, naming the path and the type."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import FACETS, NEXT, Context, Observed, Probe, verdict
from harness.kinds.api.wire import Deviation, deviations


def found(probes: Sequence[Probe], obs: Observed) -> dict[str, list[Deviation] | None]:
    """Probe id (and ``<id>#next``) -> its deviations; None: nothing came back to validate."""
    out: dict[str, list[Deviation] | None] = {}
    for p in probes:
        for pid, path in ((p.id, p.path), (p.id + NEXT, "/completions")):
            if pid in obs:
                out[pid] = deviations(path, obs[pid])
    return out


def findings(probes: Sequence[Probe], obs: Observed) -> list[dict[str, Any]]:
    """Every deviation of one server, for the record: probe, path, expected type, what came."""
    return [{"probe": pid, **d.to_json()} for pid, ds in found(probes, obs).items() for d in ds or []]


@dataclass(frozen=True, slots=True)
class Schema:
    key: ClassVar[str] = "schema"
    every_exchange: ClassVar[bool] = True
    title: ClassVar[str] = (
        "Wire schema: every reply and stream event valid under the openai package's types (strict)"
    )
    rule: ClassVar[str] = (
        "every reply and stream event, of every probe, validates strictly against the OpenAI API's "
        "published types (the openai package's pydantic models; fields beyond them allowed; a tool "
        "call's arguments a string holding JSON), or deviates only where the oracle's own reply does"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        return []

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        mine, theirs = found(probes, candidate), found(probes, oracle)
        out = []
        for p in probes:
            ids = [pid for pid in (p.id, p.id + NEXT) if pid in mine]
            if not ids:
                continue
            got = [(pid, d) for pid in ids for d in mine[pid] or []]
            shared = {d.key for pid in ids for d in theirs.get(pid) or []}
            own = [(pid, d) for pid, d in got if d.key not in shared]
            also = sorted({d.key for _, d in got if d.key in shared})
            if all(mine[pid] is None for pid in ids):
                out.append(verdict(self.key, p.id, "skip", "no answer came back: nothing to validate"))
                continue
            facts: Mapping[str, Any] = {
                "deviations": [{"exchange": pid, **d.to_json()} for pid, d in got],
                "oracle_too": also,
            }
            if own:
                pid, first = own[0]
                more = f" (+{len(own) - 1} more)" if len(own) > 1 else ""
                where = "" if pid == p.id else "the request after it: "
                out.append(verdict(self.key, p.id, False, f"{where}{first.words()}{more}", **facts))
                continue
            words = "valid under the published types (strict)"
            if also:
                words += "; deviates only as the oracle does: " + "; ".join(also)
            out.append(verdict(self.key, p.id, True, words, **facts))
        return out


FACETS.register(Schema.key, help=Schema.title)(Schema())
