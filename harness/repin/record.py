"""The ``repin`` records: one per model and suite of a re-pin, what-if or accepted.

Each holds the verdicts of the committed goldens (oracle) against the release's (candidate) — strict,
near-tie, KL, with their controls — the FEATURES.md cells of that model and suite that would turn ⌛
(or did), and the run they belong to (``extra.repin.run``: every set of the run, how many cells in
all, the estimate of a full re-record). ``extra.repin.what_if`` is true unless the pin was moved.

Its ``oracle`` is the goldens it stands beside: the committed ones for a what-if (so it goes stale as
soon as they are re-recorded or the pin moves: it then no longer describes the tree), the ones it
moved in for an accepted re-pin (its summary kind's rule, :mod:`harness.kinds.summary`). It judges
no engine run, so the pages never show it (:func:`harness.kinds.is_summary`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.api import EngineInfo
from harness.goldens import Golden
from harness.pipeline import golden_provenance, model_entry, suite_entry
from harness.provenance import device_facts, now_utc, platform_facts
from harness.records import Record, new_record_id
from harness.repin.stale import StaleCell
from harness.repin.whatif import Compared
from harness.workspace import Workspace


def _class(g: Golden) -> str:
    return str((g.manifest.get("device") or {}).get("class") or "unknown")


def _timings(prefix: str, g: Golden) -> dict[str, float]:
    """The goldens' recorded timings (the oracle's engine start, generation, whole recording)."""
    timings = g.manifest.get("timings") or {}
    return {prefix + k: float(v) for k, v in timings.items() if isinstance(v, int | float)}


def repin_record(ws: Workspace, c: Compared, *, release: str, pin_from: str, pin_to: str, accepted: bool,
                 beside: Golden, cells: Sequence[StaleCell], run: Mapping[str, Any],
                 harness: Mapping[str, Any], created: str | None = None) -> Record:
    """``beside``: the goldens the record stands beside (see the module doc). ``harness``: the tree
    the comparison ran on (SHA, dirty), taken before an accepted re-pin changed it: the only changes
    since are the re-pin this record describes."""
    created = created or now_utc()
    sha = harness.get("sha")
    what = "re-pin" if accepted else "what-if re-pin (the pin did not move)"
    classes = f"goldens recorded on {_class(c.old)} and {_class(c.new)}"
    return Record(
        id=new_record_id(created, sha, f"repin-vllm@{release}"), kind="repin", created=created,
        model=model_entry(c.model), suite=suite_entry(c.suite, c.suite.kind),
        oracle=golden_provenance(beside),
        candidate=EngineInfo(f"repin:vllm@{release}", "vllm", release, settings=dict(c.new.oracle.settings),
                             environment={"scratch": c.new.folder.relative_to(ws.root).as_posix()
                                          if c.new.folder.is_relative_to(ws.root) else c.new.folder.name}),
        harness=dict(harness), outcome=c.outcome,  # type: ignore[arg-type]
        summary=f"{what} {pin_from} -> {pin_to}: {c.summary}; {len(cells)} FEATURES.md cells of "
                f"{c.model.name}/{c.suite.name} {'turned' if accepted else 'would turn'} ⌛; {classes}",
        verdicts=c.verdicts, gates=c.gates, controls=c.controls,
        timings={"record_s": c.record_s, **_timings("old_", c.old), **_timings("new_", c.new)},
        platform=platform_facts(), device=device_facts(),
        extra={"repin": {
            "from": pin_from, "to": pin_to, "what_if": not accepted, "accepted": accepted,
            "recorded_now": c.recorded_now, "old_goldens": golden_provenance(c.old),
            "new_goldens": golden_provenance(c.new), "stale_cells": [x.to_json() for x in cells],
            "run": dict(run)}})
