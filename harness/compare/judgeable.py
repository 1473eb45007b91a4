"""Which comparators can judge a candidate, given what it can return (its
:class:`~harness.capabilities.Capabilities`), and the comparator to judge with.

* no token ids      -> ``strict`` compares text (:mod:`harness.compare.strict_text`); every other
                       comparator is impossible;
* no top-k logprobs -> comparators of distributions (``kl``, ``nmse``, ``drift``) are impossible.

An impossible comparator is a ``skip`` verdict that says why, and the record lists it; a candidate
is never failed for a question it was never able to answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from harness import compare
from harness.api import Case, Comparator, Verdict
from harness.capabilities import Capabilities
from harness.compare.strict_text import StrictText
from harness.compare.unit import LOGPROBS, Need
from harness.excerpt import first_line


def needs(name: str) -> frozenset[Need]:
    """What comparator ``name`` needs from the *candidate*, as its unit declares it; a name that is
    not a registered comparator needs everything (skipped as impossible rather than fed half an
    output)."""
    found = compare.COMPARATORS.find(name)
    return found.needs if found is not None else LOGPROBS


def impossible(capabilities: Capabilities, comparators: Iterable[str]) -> dict[str, str]:
    """comparator -> why it cannot judge this engine (``strict`` falls back to text instead)."""
    missing = capabilities.missing()
    out = {}
    for name in comparators:
        lacking = [m for m in sorted(needs(name)) if m in missing]
        if name == "strict" and lacking == ["token_ids"]:
            continue  # judged on text
        if lacking:
            out[name] = "; ".join(missing[m] for m in lacking)
    return out


def comparator_for(name: str, params: Mapping[str, Any], decode: Callable[[Sequence[int]], str] | None,
                   capabilities: Capabilities | None) -> Comparator | str:
    """The comparator to judge with, or the reason it cannot judge this candidate at all."""
    if capabilities is not None:
        if (why := impossible(capabilities, [name]).get(name)) is not None:
            return why
        if name == "strict" and not capabilities.token_ids:
            return StrictText()
    return compare.build(name, params, decode)


def impossible_verdict(case: Case, comparator: str, why: str) -> Verdict:
    return Verdict(case.id, comparator, "skip", first_line(f"impossible: {why}"),
                   detail=f"{case.id}: {comparator} cannot judge this candidate: {why}",
                   evidence={"impossible": why})


def capability_extra(capabilities: Capabilities | None, comparators: Iterable[str]) -> dict[str, Any]:
    """The record's ``capabilities`` / ``impossible`` entries (nothing for a runner that has none)."""
    if capabilities is None:
        return {}
    return {"capabilities": capabilities.to_json(),
            "impossible": impossible(capabilities, list(comparators))}
