"""The vacuous-gate guard: run the planted mutations that prove a comparator can fail.

A gate that passes says little unless it *could* have failed. Beside every comparator of a suite the
gate plants mutations in memory, against the very goldens (or KV pages) it judged, and checks the
comparator's answer:

* a **must-fail** mutation (a flipped decisive token, a swap beyond the near-tie bar, a distribution
  perturbed above the KL/NMSE bar, a flipped byte of a KV page) must be judged ``fail``;
* a **positive control** (a swap within the near-tie bar, an unperturbed copy) must be judged ``pass``;
* a **golden check** looks for degenerate goldens a comparator cannot bite on: empty or constant
  generations, missing logprobs, top-k logprobs that are not a distribution (an all-zero array),
  all-zero top-1/top-2 gaps, a k smaller than the comparator needs, KV pages all zero or all alike.

Each comparator declares its mutations in its own unit (:mod:`harness.compare.unit`); this module
runs them. A must-fail mutation that passes, one that cannot be planted at all (nothing in the
goldens to plant it on), or a fatal golden check makes a *gated* comparator **vacuous** (see
:meth:`harness.records.Control.vacuates` and :func:`harness.records.guard`): the record's outcome is
``vacuous`` and the gate does not count as passed. A positive control that fails does not make the
gate vacuous (it can still fail) but FEATURES.md shows the row as partial.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from harness import compare
from harness.api import Case, Output, Verdict
from harness.compare.judgeable import comparator_for
from harness.compare.kernels.full import FULL_MASS_TOL, row_lse
from harness.compare.kernels.planting import top_rows
from harness.compare.unit import ControlSet, Mutation, Needs, Planted, PlantedEvidence
from harness.excerpt import NOTE, clip
from harness.kv_pages.evidence import CaptureError
from harness.records import GOLDEN_CHECK, Control


def run_controls(comparator: Any, controls: ControlSet, cases: Sequence[Case],
                 subjects: Mapping[str, Any], key: str | None = None) -> list[Control]:
    """Every golden check and planted mutation of ``controls`` for ``comparator``, over ``cases``.

    ``subjects``: case id -> what the comparator judged for that case (the oracle's :class:`Output`,
    or the case's KV evidence for a page comparator). ``key``: the name its verdicts go by, when
    not the comparator's own (an invariance variant's tier)."""
    key = key or str(comparator.key)
    outs = [(c, subjects[c.id]) for c in cases if c.id in subjects]
    found = golden_checks(key, controls.needs, [s for _, s in outs])
    return found + [_run_mutation(comparator, key, m, outs) for m in controls.mutations]


def suite_controls(suite: Any, golden: Any, decode: Callable[[Sequence[int]], str] | None = None,
                   capabilities: Any = None) -> list[Control]:
    """The controls of every comparator of ``suite`` (a :class:`~harness.suites.Suite`) against
    ``golden`` (a :class:`~harness.goldens.Golden`).

    ``capabilities`` (the candidate's, see :mod:`harness.compare.judgeable`): guard the comparator the
    gate actually judged with (``strict`` on text for a candidate without ids); a comparator the
    candidate makes impossible judged nothing and gets no controls.
    """
    out: list[Control] = []
    for spec in suite.comparators:
        comp = comparator_for(spec.name, spec.params, decode, capabilities)
        if isinstance(comp, str):
            continue
        out += run_controls(comp, compare.unit(spec.name).controls, golden.cases, golden.outputs)
    return out


def _short(ids: Sequence[str], n: int = 4) -> str:
    return ", ".join(ids[:n]) + (f" +{len(ids) - n}" if len(ids) > n else "")


def _judge(comparator: Any, case: Case, planted: Planted | PlantedEvidence) -> Verdict:
    if isinstance(planted, Planted):
        return comparator.compare(planted.oracle, planted.candidate, case)  # type: ignore[no-any-return]
    return comparator.judge_kv(case, planted.evidence)  # type: ignore[no-any-return]


def _run_mutation(comparator: Any, key: str, m: Mutation, outs: Sequence[tuple[Case, Any]]) -> Control:
    got: dict[str, str] = {}
    skipped: dict[str, str] = {}
    notes: list[str] = []
    for case, subject in outs:
        p = m.plant(comparator, case, subject)
        if isinstance(p, str):
            skipped[case.id] = p
            continue
        got[case.id] = _judge(comparator, case, p).status
        if p.note and p.note not in notes:
            notes.append(p.note)
    if not got:
        why = sorted(set(skipped.values()))
        return Control(key, m.name, m.expect, "unplantable", False,
                       clip("nothing to plant it on: " + "; ".join(why)))
    wrong = [cid for cid, s in got.items() if s != m.expect]
    counts = Counter(got.values())
    if wrong:
        text = f"{got[wrong[0]]} {len(wrong)}/{len(got)} ({_short(wrong)})"
    else:
        text = f"{m.expect} {counts[m.expect]}/{len(got)}"
    note = []
    if skipped:
        note.append(f"not plantable in {_short(sorted(skipped))}: {sorted(set(skipped.values()))[0]}")
    note += notes[:2]
    return Control(key, m.name, m.expect, text, not wrong, clip("; ".join(note), NOTE))


# ---------------------------------------------------------------------------------------------
# golden checks


def golden_checks(key: str, needs: Needs, subjects: Sequence[Any]) -> list[Control]:
    """Degenerate goldens (or pages) ``key`` cannot bite on. ``ok`` is False only when it is fatal."""
    if needs.pages:
        return [_page_check(key, subjects)]
    oracles: Sequence[Output] = subjects
    out = []
    n = len(oracles)
    empty = [o.case_id for o in oracles if len(o.token_ids) == 0]
    const = [o.case_id for o in oracles if len(o.token_ids) > 1 and len(set(o.token_ids)) == 1]
    seqs = {o.token_ids for o in oracles}
    fatal = []
    if n == 0:
        fatal.append("no golden outputs")
    if n and len(empty) == n:
        fatal.append("every generation is empty")
    if n > 1 and len(const) == n:
        fatal.append("every generation repeats one token")
    if n > 1 and len(seqs) == 1:
        fatal.append("every case generated the same tokens")
    flags = []
    if empty and len(empty) < n:
        flags.append(f"empty in {_short(empty)}")
    if const and len(const) < n:
        flags.append(f"constant in {_short(const)}")
    out.append(Control(key, GOLDEN_CHECK + " generations", "pass",
                       "degenerate" if fatal else "ok", not fatal, "; ".join(fatal + flags)))

    if not (needs.logprobs or needs.min_k or needs.full_vocab or needs.gaps):
        return out
    rows = {o.case_id: top_rows(o) for o in oracles}
    missing = [cid for cid, r in rows.items() if r is None]
    have = {cid: r for cid, r in rows.items() if r is not None}
    fatal, flags = [], []
    if missing and not have:
        fatal.append("no case has logprobs")
    elif missing:
        flags.append(f"no logprobs in {_short(missing)}")
    ks = sorted({r[0].shape[1] for r in have.values()})
    if have and needs.min_k and ks[0] < needs.min_k:
        fatal.append(f"k={ks[0]}, {key} needs k >= {needs.min_k}")
    if have:
        mass = np.concatenate([np.exp(r[1]).sum(axis=1) for r in have.values()])
        full = [o for o in oracles if o.full_logprobs is not None]
        if mass.size and float(mass.max()) > 1.0 + 1e-3:
            fatal.append(f"top-{ks[-1]} probabilities sum to {float(mass.max()):.3g} > 1: "
                         "not a distribution (an all-zero logprob array?)")
        elif full:
            lse = np.concatenate([row_lse(o.full_logprobs[: len(o.token_ids)]) for o in full])
            lacking = [o.case_id for o in oracles if o.full_logprobs is None and o.case_id in have]
            if lse.size and not float(np.abs(np.expm1(lse)).max()) <= FULL_MASS_TOL:
                fatal.append(f"full-vocab rows are not distributions: mass {float(np.exp(lse.min())):.6g}"
                             f"..{float(np.exp(lse.max())):.6g} (rows never written?)")
            elif needs.full_vocab and lacking:
                fatal.append(f"{key} needs full-vocab logprobs; {_short(lacking)} hold top-{ks[-1]} only")
            else:
                flags.append(f"full-vocab rows: {full[0].full_logprobs.shape[1]} ids")
        elif needs.full_vocab and mass.size and float(np.abs(mass - 1).max()) > 1e-4:
            fatal.append(f"{key} needs full-vocab logprobs; the goldens hold top-{ks[-1]} "
                         f"(mass {float(mass.min()):.3g}..{float(mass.max()):.3g})")
    if have and needs.gaps and ks[-1] >= 2:
        gaps = np.concatenate([np.sort(r[1], axis=1)[:, -1] - np.sort(r[1], axis=1)[:, -2]
                               for r in have.values() if r[1].shape[1] >= 2 and len(r[1])])
        if gaps.size and not np.any(np.abs(gaps) > 0):
            fatal.append("every top-1/top-2 logprob gap is zero")
        elif gaps.size:
            flags.append(f"gaps {float(gaps.min()):.3g}..{float(gaps.max()):.3g} nats")
    out.append(Control(key, GOLDEN_CHECK + " logprobs", "pass", "degenerate" if fatal else "ok",
                       not fatal, "; ".join(fatal + flags)))
    return out


def _page_check(key: str, evidence: Sequence[Any]) -> Control:
    """The pages the engine wrote, over every case's KV evidence: a capture that is empty, all zero
    bytes or one page repeated cannot show a restore wrong."""
    pages: dict[Any, bytes] = {}
    unreadable = 0
    for ev in evidence:
        for ref in ev.expected:
            w = ev.written.get(ref.id)
            if w is None or ref.id in pages:
                continue
            try:
                pages[ref.id] = bytes(w.read())
            except CaptureError:
                unreadable += 1
    fatal, flags = [], []
    if not pages:
        fatal.append("no pages were captured")
    elif all(not any(v) for v in pages.values()):
        fatal.append(f"all {len(pages)} captured pages are zero bytes (an unused buffer?)")
    elif len(pages) > 1 and len(set(pages.values())) == 1:
        fatal.append(f"all {len(pages)} captured pages hold the same bytes")
    elif any(not v for v in pages.values()):
        flags.append("some pages are empty")
    if unreadable:
        flags.append(f"{unreadable} page(s) unreadable")
    return Control(key, GOLDEN_CHECK + " pages", "pass", "degenerate" if fatal else "ok", not fatal,
                   "; ".join(fatal + flags))
