"""A whole re-pin: the what-if, the cells, the estimate, the records; with ``accept``, the switch."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.goldens import golden_dir, read_golden
from harness.provenance import git_dirty, git_sha
from harness.records import Record, write_record
from harness.repin import RepinError
from harness.repin.accept import Switched, switch
from harness.repin.cost import full_rerecord
from harness.repin.record import repin_record
from harness.repin.stale import StaleCell, would_go_stale
from harness.repin.whatif import Compared, Recorder, choose, record_release, what_if
from harness.staleness import PIN_FILE, read_pin
from harness.workspace import Workspace


@dataclass(frozen=True, slots=True, eq=False)
class Repinned:
    release: str
    pin_from: str
    pin_to: str
    compared: tuple[Compared, ...]
    cells: tuple[StaleCell, ...]
    already_stale: int
    estimate: dict
    records: tuple[tuple[Record, Path], ...]
    switched: Switched | None
    pages: tuple[Path, ...] = ()


def repin(ws: Workspace, release: str, *, models: Sequence[str] = (), suites: Sequence[str] = (),
          accept: bool = False, partial: bool = False, fresh: bool = False,
          recorder: Recorder = record_release, progress: Callable[[str], None] = lambda s: None) -> Repinned:
    """What moving the oracle pin to ``release`` changes; with ``accept``, make the change."""
    harness = {"sha": git_sha(ws.root), "dirty": git_dirty(ws.root)}  # before anything is switched
    pairs = choose(ws, models, suites)
    pin_from = read_pin(ws.root / PIN_FILE)
    if pin_from is None:
        raise RepinError(f"{PIN_FILE}: no 'vllm...==VERSION' line: there is no pin to move")
    pin_to = f"{pin_from.partition('==')[0]}=={release}"
    compared = what_if(ws, release, pairs, fresh=fresh, recorder=recorder, progress=progress)
    regoldened = {(c.model.name, c.suite.name): c.new.manifest for c in compared}
    cells, already = would_go_stale(ws, pin_to, regoldened)
    estimate = full_rerecord(ws, release, compared)
    run = {"id": secrets.token_hex(4), "release": release, "from": pin_from, "to": pin_to,
           "sets": [f"{c.model.name}/{c.suite.name}" for c in compared], "stale_cells": len(cells),
           "already_stale": already, "estimate": estimate}
    switched, pages = None, ()
    if accept:
        switched = switch(ws, release, compared, partial=partial)
        run["left_at_old_pin"] = list(switched.left)
        run["notes"] = list(switched.notes)
    written = []
    for c in compared:
        mine = [x for x in cells if x.model == c.model.name and x.suite == c.suite.name]
        beside = (read_golden(golden_dir(ws.goldens, c.model, c.suite.name), model_name=c.model.name,
                              suite_name=c.suite.name) if accept else c.old)
        rec = repin_record(ws, c, release=release, pin_from=pin_from, pin_to=pin_to, accepted=accept,
                           beside=beside, cells=mine, run=run, harness=harness)
        written.append((rec, write_record(ws.records, rec)))
    if accept:
        from harness.features import generate, write_pages

        pages = tuple(write_pages(ws, generate(ws)))
    return Repinned(release, pin_from, pin_to, tuple(compared), tuple(cells), already, estimate,
                    tuple(written), switched, pages)
