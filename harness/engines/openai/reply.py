"""A server's reply -> :class:`~harness.api.Output`: token ids from wherever this server puts them
(a ``token_ids`` field, ``token_id:N`` logprob tokens, or token texts mapped through the model's
tokenizer), the top-k logprob rows checked against what was asked, and the prompt in the form the
server takes (ids, or the text they were made of)."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import Case, EngineRefused, Output
from harness.capabilities import Capabilities
from harness.engines.openai.token_text import UNMAPPED, TokenTexts
from harness.engines.openai.transport import Fault, Reply
from harness.excerpt import INLINE, clip
from harness.models import ModelRef

TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


@dataclass(frozen=True, slots=True)
class ServerProtocol:
    """What the probe found out about the server; every request of the run uses it."""

    extras: Mapping[str, Any]
    logprobs: int
    """k to ask for (0: the server gives none)."""
    ids_from: str | None
    """``token_ids`` (a response field), ``logprob_tokens`` (``token_id:N`` strings),
    ``token_text`` (logprob token texts mapped through the model's tokenizer) or None."""
    top_ids: bool
    """Top-logprob entries are keyed by ``token_id:N`` (else by token text)."""
    capabilities: Capabilities
    stream: bool
    prompts: str = "ids"
    """``ids`` or ``text``: what the prompt field carries."""
    top_from_text: bool = False
    """Top-logprob entries are keyed by token text and mapped to ids through the model's tokenizer."""

    def to_json(self) -> dict[str, Any]:
        """For the record (``environment.protocol``)."""
        return {"logprobs": self.logprobs, "ids_from": self.ids_from, "top_ids": self.top_ids,
                "stream": self.stream, "extras": sorted(self.extras), "prompts": self.prompts,
                "top_from_text": self.top_from_text}


class ReplyDecoder:
    """Replies of one run -> outputs; counts the token texts no single id renders as (thread-safe)."""

    def __init__(self, name: str, model: ModelRef | None) -> None:
        self.name = name
        self.model = model
        """The model under test: its tokenizer turns text prompts and token texts into ids."""
        self.unmapped: Counter[str] = Counter()
        self._texts: TokenTexts | None = None
        self._lock = threading.Lock()

    def need_model(self, why: str) -> ModelRef:
        if self.model is None:
            raise EngineRefused(f"{self.name}: {why} needs the model's tokenizer (run it through the gate)")
        return self.model

    def prompt(self, case: Case, proto: ServerProtocol | None, n: int | None = None) -> list[int] | str:
        """The case's prompt as this server takes it: its ids, or the text those ids were made of."""
        ids = list(case.prompt_ids[:n] if n is not None else case.prompt_ids)
        if proto is None or proto.prompts == "ids":
            return ids
        model = self.need_model("sending text prompts")
        if n is None and case.prompt_text and list(model.encode(case.prompt_text)) == ids:
            return case.prompt_text
        return model.decode(ids)

    def token_texts(self) -> TokenTexts:
        if self._texts is None:
            model = self.need_model("mapping token texts to ids")
            tok = model._tokenizer
            size = (tok.get_vocab_size(with_added_tokens=True) if hasattr(tok, "get_vocab_size")
                    else len(tok))
            self._texts = TokenTexts.for_tokenizer(tok, model.decode, size)
        return self._texts

    def mappable(self, reply: Reply) -> str | None:
        """None when the reply's token texts can be mapped to ids through the model's tokenizer, else
        why not (no model, no token texts, or texts no id of this tokenizer renders as)."""
        if self.model is None:
            return "the model's tokenizer is not at hand"
        if not reply.lp_tokens:
            return "no logprob tokens came back"
        texts = self.token_texts()
        strange = [t for t in reply.lp_tokens if t not in texts.by_text]
        return f"e.g. {strange[0]!r}" if strange else None

    def ambiguity_note(self) -> tuple[str, ...]:
        u = self.unmapped
        resolved = (f"; {u['resolved']} generated texts that several ids share resolved by retokenizing "
                    f"the completion" if u["resolved"] else "")
        if u["ended_unnamed"]:
            resolved += (f"; {u['ended_unnamed']} cases ended on an end-of-generation token the server does "
                         f"not return (one token shorter than an oracle output that includes it)")
        if not (u["generated"] or u["top"] or u["missing"]):
            return ("token texts mapped to ids through the model's tokenizer: every text accounted for"
                    + resolved,)
        shared = ", ".join(f"{t!r} ({n} ids)" for t, n in list(self.token_texts().examples.items())[:5])
        return (f"token texts mapped to ids through the model's tokenizer: {u['generated']} generated and "
                f"{u['top']} top-k texts matched no single id (id {UNMAPPED}: {shared}); {u['missing']} "
                f"top-k entries lost to texts that collided in the server's answer" + resolved,)

    def to_output(self, case_id: str, r: Reply, proto: ServerProtocol) -> Output:
        text = "".join(r.text)
        excerpt = clip(text, INLINE)
        if proto.ids_from == "token_ids":
            if r.token_ids is None:
                raise Fault("response has no token_ids (the probe's had)", excerpt=excerpt)
            ids = r.token_ids
        elif proto.ids_from == "logprob_tokens":
            ids = []
            for p, tok in enumerate(r.lp_tokens):
                m = TOKEN_ID.match(tok)
                if not m:
                    raise Fault(f"logprob token {p} is {tok!r}, not 'token_id:N'", excerpt=excerpt)
                ids.append(int(m.group(1)))
        elif proto.ids_from == "token_text":
            texts = self.token_texts()
            with self._lock:
                ids = [texts.lookup(tok) for tok in r.lp_tokens]
                if UNMAPPED in ids:
                    ids, resolved = self.retokenized(ids, r.lp_tokens, text)
                    self.unmapped["resolved"] += resolved
                self.unmapped["generated"] += sum(t == UNMAPPED for t in ids)
                # stopped, its last token no special one: the end-of-generation token was not shown
                self.unmapped["ended_unnamed"] += (r.finish_reason == "stop"
                                                   and (not ids or ids[-1] not in texts.special))
        else:
            return Output(case_id, (), text, finish_reason=r.finish_reason or "")
        k = proto.logprobs
        if k == 0:
            return Output(case_id, tuple(ids), text, finish_reason=r.finish_reason or "")
        n = len(ids)
        if len(r.lp_top) != n or len(r.lp_chosen) != n:
            raise Fault(f"wrong number of logprobs: {len(r.lp_top)} top-logprob rows and "
                        f"{len(r.lp_chosen)} token logprobs for {n} generated tokens",
                        excerpt=clip(json.dumps(r.lp_top[:2])))
        if proto.ids_from == "token_ids" and r.lp_tokens and proto.top_ids:
            for p, (tid, tok) in enumerate(zip(ids, r.lp_tokens, strict=False)):
                m = TOKEN_ID.match(tok)
                if m and int(m.group(1)) != tid:
                    raise Fault(f"token_ids and logprobs disagree at position {p}: {tid} vs {tok!r}")
        chosen = np.array([np.nan if v is None else float(v) for v in r.lp_chosen], np.float32)
        if proto.top_from_text:
            return self._text_keyed(case_id, ids, text, chosen, r, k)
        if not proto.top_ids:
            return Output(case_id, tuple(ids), text, chosen_logprobs=chosen,
                          finish_reason=r.finish_reason or "")
        top_ids = np.zeros((n, k), np.int32)
        top_lps = np.zeros((n, k), np.float32)
        for p, row in enumerate(r.lp_top):
            # OpenAI's rule: the top k, plus the chosen token when it is not among them.
            if not isinstance(row, Mapping) or not (k <= len(row) <= k + 1):
                got = len(row) if isinstance(row, Mapping) else row
                raise Fault(f"wrong number of logprobs at position {p}: got {got}, asked {k}",
                            excerpt=clip(json.dumps(row)))
            items = []
            for key, lp in row.items():
                m = TOKEN_ID.match(key)
                if not m or not isinstance(lp, (int, float)):
                    raise Fault(f"top logprob at position {p} is {key!r}: {lp!r}",
                                excerpt=clip(json.dumps(row)))
                items.append((int(m.group(1)), float(lp)))
            items.sort(key=lambda x: (-x[1], x[0]))
            top_ids[p] = [t for t, _ in items[:k]]
            top_lps[p] = [v for _, v in items[:k]]
        return Output(case_id, tuple(ids), text, top_ids, top_lps, chosen, r.finish_reason or "")

    def retokenized(self, ids: list[int], shown: Sequence[str], text: str) -> tuple[list[int], int]:
        """Generated tokens whose text several ids share, resolved where the model's tokenizer makes
        of the completion's text exactly as many tokens, each rendering as the server showed it and
        each agreeing with every id already known: then those ids are the ones the texts spell
        (the tokenizer's, verified identical to the server's on the prompts). Returns (ids, resolved)."""
        if not text:
            return ids, 0
        texts = self.token_texts()
        again = list(self.need_model("mapping token texts").encode(text))
        if len(again) != len(ids) or any(
                (t != UNMAPPED and t != a) or shown[p] not in texts.renders(a) for p, (t, a) in
                enumerate(zip(ids, again, strict=True))):
            return ids, 0
        return again, sum(t == UNMAPPED for t in ids)

    def _text_keyed(self, case_id: str, ids: Sequence[int], text: str, chosen: np.ndarray, r: Reply,
                    k: int) -> Output:
        """Top-k rows keyed by token text -> ids through the model's tokenizer (see token_text)."""
        texts = self.token_texts()
        n = len(ids)
        top_ids = np.full((n, k), UNMAPPED, np.int32)
        top_lps = np.full((n, k), -np.inf, np.float32)
        with self._lock:
            for p, row in enumerate(r.lp_top):
                # k entries, k + 1 with the chosen token, fewer where texts collided
                if not isinstance(row, Mapping) or not (1 <= len(row) <= k + 1) or not all(
                        isinstance(v, (int, float)) for v in row.values()):
                    got = len(row) if isinstance(row, Mapping) else row
                    raise Fault(f"wrong number of logprobs at position {p}: got {got}, asked {k}",
                                excerpt=clip(json.dumps(row)))
                known = None
                if p < len(r.lp_tokens) and np.isfinite(chosen[p]):
                    known = (r.lp_tokens[p], float(r.lp_chosen[p]), int(ids[p]))  # type: ignore[arg-type]
                m = texts.map_row(row, k, known)
                top_ids[p], top_lps[p] = m.ids, m.logprobs
                self.unmapped["top"] += m.ambiguous
                self.unmapped["missing"] += m.missing
        return Output(case_id, tuple(ids), text, top_ids, top_lps, chosen, r.finish_reason or "")
