"""Token text -> token id, for servers that key logprobs by token *text* (llama-cpp-python, vLLM
without ``return_tokens_as_token_ids``).

Such a server names each generated token and each top-logprob entry by the text of that one token.
The model's own tokenizer maps the text back to an id where exactly one id could have produced it;
where several could (partial UTF-8 byte tokens, which servers render as ``''`` or ``'\\ufffd'``,
special tokens rendered as ``''``, two tokens with the same text), the entry is **ambiguous**: it
gets the id :data:`UNMAPPED` and is counted, never guessed.

A top-logprob row of k entries can also come back with fewer: two tokens with the same text share
one JSON key, so the server's dict keeps only one of them. The row is padded with
(:data:`UNMAPPED`, -inf) and the shortfall is counted as well.

Distribution comparators treat an unmapped entry as an id neither side shares (its mass goes to the
"rest" cell of a top-k KL, which stays a lower bound); ``strict`` and ``near_tie`` see the unmapped
id as a token the oracle did not choose, and the record says how many there were.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

UNMAPPED = -1
"""The id of a token text that no single vocabulary entry accounts for."""


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte, inverted."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def token_bytes(tokenizer: object, vocab_size: int) -> list[bytes | None]:
    """The raw bytes of every id, for byte-level BPE tokenizers (``tokenizers.Tokenizer`` with a
    ByteLevel decoder); None for ids that are not plain byte strings (added/special tokens)."""
    table = byte_decoder()
    out: list[bytes | None] = []
    for i in range(vocab_size):
        piece = tokenizer.id_to_token(i)  # type: ignore[attr-defined]
        if piece is None or not all(ch in table for ch in piece):
            out.append(None)
        else:
            out.append(bytes(table[ch] for ch in piece))
    return out


def is_byte_level(tokenizer: object) -> bool:
    dec = getattr(tokenizer, "decoder", None)
    return type(dec).__name__ == "ByteLevel" and hasattr(tokenizer, "id_to_token")


@dataclass(frozen=True, slots=True)
class RowMap:
    """One top-logprob row, mapped."""

    ids: np.ndarray
    logprobs: np.ndarray
    ambiguous: int
    """Entries whose text several ids share (mapped to :data:`UNMAPPED`)."""
    missing: int
    """Entries the server could not return because their text collided with another's."""


@dataclass(slots=True)
class TokenTexts:
    """text -> ids that render as that text, built once per model."""

    by_text: Mapping[str, tuple[int, ...]]
    by_id: Sequence[frozenset[str]] = ()
    """id -> every text it may render as."""
    special: frozenset[int] = frozenset()
    examples: dict[str, int] = field(default_factory=dict)
    """Ambiguous texts met so far -> how many ids share them (for the record)."""

    @classmethod
    def from_pieces(cls, pieces: Sequence[Sequence[str]],
                    special: frozenset[int] = frozenset()) -> TokenTexts:
        """``pieces[i]``: every text a server might show for id ``i`` (its conventions differ)."""
        table: dict[str, set[int]] = defaultdict(set)
        for i, texts in enumerate(pieces):
            for t in set(texts):
                table[t].add(i)
        return cls({t: tuple(sorted(ids)) for t, ids in table.items()}, [frozenset(t) for t in pieces],
                   special)

    @classmethod
    def for_tokenizer(cls, tokenizer: object, decode: Callable[[Sequence[int]], str],
                      vocab_size: int) -> TokenTexts:
        """The renderings a server may use for each id:

        * the bytes decoded with invalid UTF-8 dropped (llama-cpp-python) or replaced by U+FFFD
          (transformers, vLLM), for byte-level BPE; ``decode([id])`` otherwise;
        * ``''`` for special tokens (llama.cpp renders control tokens as nothing by default) and
          their literal text (servers that show them).
        """
        raw = token_bytes(tokenizer, vocab_size) if is_byte_level(tokenizer) else [None] * vocab_size
        special: set[int] = set()
        added = getattr(tokenizer, "get_added_tokens_decoder", None)
        if callable(added):
            special = {int(i) for i, t in added().items() if getattr(t, "special", False)}
        pieces: list[list[str]] = []
        for i in range(vocab_size):
            b = raw[i]
            if b is not None:
                texts = [b.decode("utf-8", errors="ignore"), b.decode("utf-8", errors="replace")]
            else:
                text = decode([i])
                texts = [text, text.replace("\ufffd", "")]
            if i in special:
                texts.append("")
            pieces.append(texts)
        return cls.from_pieces(pieces, frozenset(special))

    def renders(self, tid: int) -> frozenset[str]:
        """The texts id ``tid`` may be shown as (empty for an id outside the vocabulary)."""
        return self.by_id[tid] if 0 <= tid < len(self.by_id) else frozenset()

    def lookup(self, text: str) -> int:
        """The one id that renders as ``text``, else :data:`UNMAPPED` (and the text is noted)."""
        ids = self.by_text.get(text, ())
        if len(ids) == 1:
            return ids[0]
        if len(self.examples) < 20 or text in self.examples:
            self.examples[text] = len(ids)
        return UNMAPPED

    def map_row(self, row: Mapping[str, float], k: int,
                chosen: tuple[str, float, int] | None = None) -> RowMap:
        """A text-keyed top-logprob row -> its top ``k`` as (ids, logprobs), best first.

        The server may add the chosen token to the top k (OpenAI's rule: k or k + 1 entries) and
        may return fewer than k when texts collided; missing entries are padded, never invented.
        ``chosen`` (text, logprob, id) of the generated token, when its id is known: the entry with
        that text *and* that logprob is that token (an ambiguous text is resolved by it).
        """
        items = sorted(((float(lp), text) for text, lp in row.items()), key=lambda x: -x[0])[:k]
        ids = np.full(k, UNMAPPED, np.int32)
        lps = np.full(k, -np.inf, np.float32)
        ambiguous = 0
        for j, (lp, text) in enumerate(items):
            known = chosen is not None and chosen[2] >= 0 and text == chosen[0] and lp == chosen[1]
            tid = chosen[2] if known and chosen is not None else self.lookup(text)
            ambiguous += tid == UNMAPPED
            ids[j], lps[j] = tid, lp
        return RowMap(ids, lps, ambiguous, max(0, k - len(items)))
