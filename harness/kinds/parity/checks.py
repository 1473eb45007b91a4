"""Checks of the candidate against itself, judged before anything is compared with the oracle.

Two, both gated whenever they apply, whatever the suite configures:

* ``tokenizer`` (:mod:`harness.compare.tokenizer`): a candidate that was fed *text* must have
  tokenized it into the oracle's prompt ids; one verdict per case, first in the record.
* ``greedy`` (:mod:`harness.compare.greedy`): a candidate that returns logprobs must have chosen its
  own top-1 at every position; one verdict per case.

What they need comes from the candidate's :class:`~harness.capabilities.Capabilities`
(``prompts``, ``served_prompt_ids``, ``request``, ``left_to_server``). ``greedy`` carries
planted-mutation controls like every gated comparator (see :mod:`harness.kinds.controls`): a chosen token
moved below its top-1 must fail, the oracle's own greedy outputs must pass; so does ``tokenizer``:
the oracle's prompt ids with one token changed or one prepended must fail, as they are must pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from harness.api import Case, Output, Verdict
from harness.capabilities import Capabilities
from harness.compare import greedy
from harness.compare.greedy import KEY as GREEDY
from harness.compare.greedy import Greedy
from harness.compare.tokenizer import KEY as TOKENIZER
from harness.compare.tokenizer import tokenizer_verdict
from harness.kinds.controls import run_controls
from harness.records import Control

CHECKS = (TOKENIZER, GREEDY)


def greedy_for(capabilities: Capabilities | None, decode: Callable[[Sequence[int]], str] | None) -> Greedy:
    caps = capabilities or Capabilities()
    return Greedy(decode=decode, left=dict(caps.left_to_server), sent=dict(caps.request))


def candidate_checks(cases: Sequence[Case], outputs: Mapping[str, Output], capabilities: Capabilities | None,
                     decode: Callable[[Sequence[int]], str] | None = None) -> list[Verdict]:
    """The ``tokenizer`` verdicts (text prompts only) and the ``greedy`` verdicts (when the candidate
    returned logprobs), one per case each."""
    out: list[Verdict] = []
    caps = capabilities or Capabilities()
    if caps.prompts == "text":
        for c in cases:
            served = caps.served_prompt_ids.get(c.id)
            why = caps.tokenize_errors.get(c.id, "the server did not say")
            out.append(tokenizer_verdict(c, served, caps.tokenized_by or "nothing", decode, why))
    if any(o.top_logprobs is not None and o.chosen_logprobs is not None for o in outputs.values()):
        g = greedy_for(caps, decode)
        for c in cases:
            cand = outputs.get(c.id) or Output(c.id, (), error="candidate returned no output")
            out.append(g.compare(None, cand, c))
    return out


def check_gates(verdicts: Sequence[Verdict]) -> tuple[str, ...]:
    """The checks that judged something in ``verdicts`` (they gate the run)."""
    return tuple(k for k in CHECKS if any(v.comparator == k and v.status != "skip" for v in verdicts))


def checks_summary(verdicts: Sequence[Verdict]) -> str:
    """`` — greedy FAIL 1/8 (c02)`` for the checks that did not pass everywhere (empty otherwise)."""
    parts = []
    for key in CHECKS:
        vs = [v for v in verdicts if v.comparator == key and v.status != "skip"]
        bad = [v.case_id for v in vs if v.status in ("fail", "error")]
        if bad:
            word = "FAIL" if any(v.status == "fail" for v in vs) else "ERROR"
            parts.append(f"{key} {word} {len(bad)}/{len(vs)} ({', '.join(bad[:4])}{' …' * (len(bad) > 4)})")
    return "".join(f" — {p}" for p in parts)


def check_controls(verdicts: Sequence[Verdict], cases: Sequence[Case], oracles: Mapping[str, Output],
                   capabilities: Capabilities | None,
                   decode: Callable[[Sequence[int]], str] | None = None) -> list[Control]:
    """The planted-mutation controls of the checks that ran: greedy's planted in the oracle's
    outputs, tokenizer's in the oracle's prompt ids (as if the server had made them)."""
    ran = check_gates(verdicts)
    out: list[Control] = []
    if TOKENIZER in ran:
        out += tokenizer_controls(cases, decode)
    if GREEDY in ran:
        out += run_controls(greedy_for(capabilities, decode), greedy.CONTROLS, cases, oracles)
    return out


def tokenizer_controls(cases: Sequence[Case], decode: Callable[[Sequence[int]], str] | None = None
                       ) -> list[Control]:
    """The tokenizer verdict, given the oracle's own prompt ids as the server's, must pass; given
    them with one token changed, or with a token more, it must fail."""
    def changed(ids: list[int]) -> list[int]:
        p = len(ids) // 2
        return ids[:p] + [ids[p] + 1 if ids[p] > 0 else 1] + ids[p + 1:]

    plants: list[tuple[str, Literal["fail", "pass"], Callable[[list[int]], list[int]]]] = [
        ("one prompt token changed in the server's ids", "fail", changed),
        ("a token prepended (a BOS the oracle's tokenizer does not add)", "fail", lambda ids: [ids[0], *ids]),
        ("the oracle's own prompt ids", "pass", lambda ids: ids),
    ]
    out = []
    for name, expect, plant in plants:
        got = Counter(tokenizer_verdict(c, plant(list(c.prompt_ids)), "planted", decode).status
                      for c in cases)
        wrong = sum(n for s, n in got.items() if s != expect)
        text = f"{expect} {got[expect]}/{len(cases)}" if not wrong else f"{wrong}/{len(cases)} not {expect}"
        out.append(Control(TOKENIZER, name, expect, text, bool(cases) and not wrong,
                           "" if cases else "no cases"))
    return out
