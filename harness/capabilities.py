"""What a candidate engine can return (which comparators that makes impossible is
:mod:`harness.compare.judgeable`).

Python engines return everything. Servers and CLIs differ: some return no token ids (text only),
some no logprobs, some cap how many. A runner states it in a :class:`Capabilities` (its optional
``capabilities`` attribute); the gate then judges what can be judged and the record says which
comparators were impossible and why, instead of failing a candidate for a question it was never
able to answer (:mod:`harness.compare.judgeable`):

* no token ids      -> ``strict`` compares text (see :mod:`harness.compare.strict_text`); every
                       other comparator is impossible;
* no top-k logprobs -> comparators of distributions (``kl``, ``nmse``, ``drift``) are impossible;
                       ``strict`` and ``near_tie`` only need the candidate's ids.

A runner also says how it asked (``prompts``: ids or text; ``request``: the sampling fields it sent;
``left_to_server``: those it did not) and, for text prompts, what the server made of them
(``served_prompt_ids``): the candidate's self-checks (:mod:`harness.kinds.parity.checks`) judge these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What one engine returned for a workload (detected, not configured)."""

    token_ids: bool = True
    """Generated token ids come back (else only text)."""
    top_logprobs: bool = True
    """Per-position top-k (id, logprob) pairs come back."""
    logprobs_served: int | None = None
    """k the engine actually returned per position (a server may cap it below what was asked)."""
    logprobs_asked: int | None = None
    reasons: Mapping[str, str] = field(default_factory=dict)
    """Why a capability is missing, keyed ``token_ids`` / ``top_logprobs``."""
    notes: tuple[str, ...] = ()
    """Other findings worth a line in the record (e.g. ``server caps logprobs at 20``)."""
    prompts: Literal["ids", "text"] = "ids"
    """How prompts reached the engine: as the oracle's token ids, or as text it tokenized itself."""
    tokenized_by: str | None = None
    """With text prompts: how the server's tokenization was read (``POST /extras/tokenize``, ``POST
    /tokenize``, ``echo``)."""
    served_prompt_ids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """With text prompts: case id -> the prompt ids the server makes of the case's text."""
    tokenize_errors: Mapping[str, str] = field(default_factory=dict)
    """With text prompts: case id -> why its tokenization could not be read."""
    ids_from_text: bool = False
    """Generated ids and top-k ids were mapped from token *texts* through the model's tokenizer."""
    unmapped: Mapping[str, int] = field(default_factory=dict)
    """With ``ids_from_text``: how many token texts no single id accounts for (``generated``,
    ``top``) and how many top-k entries the server could not return because texts collided
    (``missing``)."""
    request: Mapping[str, Any] = field(default_factory=dict)
    """The sampling fields every request carried (``temperature``, ``seed``, engine-specific ones)."""
    left_to_server: Mapping[str, Any] = field(default_factory=dict)
    """Sampling fields the requests left to the server's defaults -> that default (None: unknown)."""

    def missing(self) -> dict[str, str]:
        out = {}
        if not self.token_ids:
            out["token_ids"] = self.reasons.get("token_ids", "the engine returns no token ids")
        if not self.top_logprobs:
            out["top_logprobs"] = self.reasons.get("top_logprobs", "the engine returns no top-k logprobs")
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "token_ids": self.token_ids, "top_logprobs": self.top_logprobs,
            "logprobs_served": self.logprobs_served, "logprobs_asked": self.logprobs_asked,
            "reasons": dict(self.reasons), "notes": list(self.notes), "prompts": self.prompts}
        if self.prompts == "text":
            out.update({"tokenized_by": self.tokenized_by, "tokenize_errors": dict(self.tokenize_errors)})
        if self.ids_from_text:
            out.update({"ids_from_text": True, "unmapped": dict(self.unmapped)})
        if self.request or self.left_to_server:
            out.update({"request": dict(self.request), "left_to_server": dict(self.left_to_server)})
        return out
