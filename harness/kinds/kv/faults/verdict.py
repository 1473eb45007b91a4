"""What a connector did under one storage fault: the facts of one row, and its verdict.

Per (connector, fault, release) one of:

* ``wrong`` (❌ served wrong bytes): a page the consumer loaded differs from the page the producer
  wrote, or a request's tokens differ from the same request run alone without any cache, even when
  the text looks fine;
* ``engine_error`` (❌ engine error): the producer or the consumer crashed or hung; its words;
* ``refused`` (◐): the request was refused with an error and no wrong byte was served, the engine
  lived on, every other request came out right;
* ``recomputed`` (✅): the connector served none of what the fault damaged, the engine computed it,
  every output is right;
* ``intact`` (✅): every page it served is byte-equal and every output right (the cycle row, where
  nothing is damaged: the store must give back what it stored, round after round);
* ``vacuous`` (never passed): the fault did not reach the consumer (nothing of the request was
  stored, the damaged file was never opened, the store-time fault changed nothing, no onboard
  after an eviction): the row says nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from harness.api import Verdict
from harness.records import Control

Outcome = Literal["wrong", "engine_error", "refused", "recomputed", "intact", "vacuous"]
SYMBOL: Mapping[str, str] = {"wrong": "❌", "engine_error": "❌", "refused": "◐", "recomputed": "✅",
                             "intact": "✅", "vacuous": "∅"}
WORDS: Mapping[str, str] = {"wrong": "served wrong bytes", "engine_error": "engine error",
                            "refused": "refused with an error, output correct",
                            "recomputed": "recomputed, output correct",
                            "intact": "served byte-equal, output correct", "vacuous": "VACUOUS"}
STATUS: Mapping[str, str] = {"wrong": "fail", "engine_error": "fail", "refused": "pass",
                             "recomputed": "pass", "intact": "pass", "vacuous": "skip"}
COMPARATOR = "kv_fault"


def comparator(fault: str) -> str:
    """The verdicts (and controls) of one fault's row: ``kv_fault.<fault>`` (one FEATURES.md row each)."""
    return f"{COMPARATOR}.{fault}"


@dataclass(frozen=True, slots=True)
class RowFacts:
    """What one fault row established (engine rows and the connector doubles alike)."""

    fault: str
    applied: bool
    """The damage reached the consumer (see the module doc)."""
    applied_how: str
    """The evidence: the shim's log of opens, the sizes before and after, the store difference."""
    pages_served: int = 0
    """Pages of the faulted request the consumer loaded (read back through the tap/capture)."""
    pages_wrong: int = 0
    """Of those, pages whose bytes differ from what the producer wrote."""
    tokens_wrong: tuple[str, ...] = ()
    """``case: why`` for each request whose tokens differ from the request run alone."""
    engine_error: str | None = None
    """``producer: ...`` / ``consumer: ...``: the engine's own words when one crashed or hung."""
    refused: str | None = None
    """The faulted request's error, when the engine refused it and lived on."""
    named: tuple[str, ...] = ()
    """What the connector said about the damage (its named problems), for the record."""
    extra: Mapping[str, Any] = field(default_factory=dict)


def classify(f: RowFacts) -> Outcome:
    if not f.applied:
        return "vacuous"
    if f.pages_wrong or f.tokens_wrong:
        return "wrong"
    if f.engine_error:
        return "engine_error"
    if f.refused:
        return "refused"
    return "intact" if f.pages_served and f.fault == "evict_cycles" else "recomputed"


def explain(f: RowFacts, outcome: Outcome) -> str:
    """One line: symbol, words, and the facts behind them."""
    head = f"{f.fault}: {SYMBOL[outcome]} {WORDS[outcome]}"
    if outcome == "vacuous":
        return f"{head} — the fault did not reach the consumer ({f.applied_how})"
    bits = [f"{f.pages_served} pages loaded, {f.pages_wrong} differ"]
    if f.tokens_wrong:
        bits.append(f"tokens differ: {'; '.join(f.tokens_wrong)}")
    if f.engine_error:
        bits.append(f.engine_error)
    if f.refused:
        bits.append(f"refused: {f.refused}")
    if f.named and outcome != "wrong":
        more = f" (+{len(f.named) - 1})" if len(f.named) > 1 else ""
        bits.append(f"connector named it: {f.named[0]}{more}")
    return f"{head} — {'; '.join(bits)}"


def verdict(f: RowFacts, how: str) -> Verdict:
    outcome = classify(f)
    return Verdict(f.fault, comparator(f.fault), STATUS[outcome], explain(f, outcome),  # type: ignore[arg-type]
                   evidence={"outcome": outcome, "symbol": SYMBOL[outcome], "applied": f.applied,
                             "applied_how": f.applied_how, "how": how, "pages_served": f.pages_served,
                             "pages_wrong": f.pages_wrong, "tokens_wrong": list(f.tokens_wrong),
                             "engine_error": f.engine_error, "refused": f.refused,
                             "named": list(f.named[:5]), **dict(f.extra)})


def vacuity_controls(verdicts: Sequence[Verdict]) -> list[Control]:
    """A row whose fault never reached the consumer could not have failed: the run is vacuous."""
    return [Control(v.comparator, f"{v.case_id}: the fault reached the consumer", "fail",
                    "not applied", False, str(v.evidence.get("applied_how", "")))
            for v in verdicts if v.evidence.get("outcome") == "vacuous"]


def planted_wrong_page(f: RowFacts) -> Control:
    """In memory, over a row's real facts: one more loaded page that differs must make it ❌."""
    o = classify(replace(f, pages_served=f.pages_served + 1, pages_wrong=f.pages_wrong + 1))
    return Control(comparator(f.fault), "one loaded page differs from the written one", "fail",
                   f"{SYMBOL[o]} {WORDS[o]}", o == "wrong" or (o == "vacuous" and not f.applied))


def double_controls(rows: Mapping[str, Mapping[str, RowFacts]]) -> list[Control]:
    """The connector doubles as controls: double -> fault -> facts. The digest-checking double must
    come through every row (✅/◐), the I/O-error-ignoring one must be caught on every row (❌); a row
    whose fault never reached the double is a vacuous control, never a passed one."""
    out = []
    for double, by_fault in rows.items():
        good = double == "digest"
        for name, f in by_fault.items():
            o = classify(f)
            ok = (o in ("recomputed", "refused", "intact")) if good else (o in ("wrong", "engine_error"))
            what = ("digest-checking double" if good else "I/O-error-ignoring double") + f" under {name}"
            out.append(Control(comparator(name), what, "pass" if good else "fail",
                               f"{SYMBOL[o]} {WORDS[o]}", ok and o != "vacuous", explain(f, o)))
    return out
