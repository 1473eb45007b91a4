"""The grammar at every step of a constrained output, on the host: each token the server generated is
fed to a matcher of the request's grammar (xgrammar, the backend the pinned vLLM uses, compiled here
for the model's own tokenizer), and the first token the grammar does not allow at its step is named.
The facet's validity check reads only the finished text; this reads the path the tokens took to it (a
JSON text can be valid while a token on the way broke the schema's grammar, e.g. its key order)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.kinds.api.reference import Reference


@dataclass(frozen=True, slots=True)
class Broken:
    """The first step whose token (or, for a server that returns no ids, character) the grammar did
    not allow."""

    step: int
    token: int | None
    """None: judged on the text, character by character."""
    piece: str
    before: str
    """The output's text up to that step (what the grammar had accepted)."""

    def words(self) -> str:
        if self.token is None:
            return f"character {self.step}: {self.piece!r} not allowed after {self.before!r}"
        return f"step {self.step}: token {self.token} {self.piece!r} not allowed after {self.before!r}"


def grammar_source(kind: str, spec: Any) -> tuple[str, str]:
    """(how xgrammar compiles it, its source) for a structured probe's kind and its constraint."""
    if kind == "json_schema":
        return "json_schema", json.dumps(spec, sort_keys=False)
    if kind == "json_object":
        return "json", ""
    if kind == "regex":
        return "regex", str(spec)
    if kind == "choice":
        return "ebnf", "root ::= " + " | ".join(json.dumps(str(c), ensure_ascii=False) for c in spec)
    raise ValueError(f"no grammar for structured-output kind {kind!r}")


def _stop_ids(folder: Path, tokenizer: Any) -> list[int]:
    """The ids that end a generation: the tokenizer's EOS and generation_config.json's."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids |= {int(t) for t in (eos if isinstance(eos, list) else [eos]) if t is not None}
    return sorted(ids)


def _vocab_size(folder: Path, tokenizer: Any) -> int:
    cfg = json.loads((folder / "config.json").read_text())
    size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(size) if size else len(tokenizer)


_COMPILERS: dict[str, Any] = {}


def _compiler(ref: Reference) -> Any:
    import xgrammar as xgr

    key = str(ref.folder)
    if key not in _COMPILERS:
        info = xgr.TokenizerInfo.from_huggingface(
            ref.tokenizer,
            vocab_size=_vocab_size(ref.folder, ref.tokenizer),
            stop_token_ids=_stop_ids(ref.folder, ref.tokenizer) or None,
        )
        _COMPILERS[key] = xgr.GrammarCompiler(info, cache_enabled=True)
    return _COMPILERS[key]


def _matcher(ref: Reference, kind: str, spec: Any) -> Any:
    import xgrammar as xgr

    how, source = grammar_source(kind, spec)
    comp = _compiler(ref)
    compiled = {
        "json_schema": lambda: comp.compile_json_schema(source),
        "json": comp.compile_builtin_json_grammar,
        "regex": lambda: comp.compile_regex(source),
        "ebnf": lambda: comp.compile_grammar(source),
    }[how]()
    return xgr.GrammarMatcher(compiled)


def first_forbidden_text(ref: Reference, kind: str, spec: Any, text: str) -> Broken | None:
    """For a server that returns no token ids: feed the text character by character; the first
    character the grammar does not allow, else None (the text may stop where the grammar has not)."""
    matcher = _matcher(ref, kind, spec)
    for i, ch in enumerate(text):
        if not matcher.accept_string(ch):
            return Broken(i, None, ch, text[:i])
    return None


def first_forbidden(ref: Reference, kind: str, spec: Any, ids: Sequence[int]) -> Broken | None:
    """Feed ``ids`` to the grammar one by one; the first token it does not allow, else None. A stop
    token is allowed only where the grammar may end."""
    matcher = _matcher(ref, kind, spec)
    for i, t in enumerate(ids):
        if matcher.is_terminated() or not matcher.accept_token(int(t)):
            return Broken(i, int(t), ref.piece(int(t)), ref.decode(list(ids[:i]), skip_special_tokens=False))
    return None


def constraint(kind: str, body: Mapping[str, Any]) -> Any:
    """The constraint a structured probe's request carries (what :func:`grammar_source` compiles)."""
    if kind == "json_schema":
        return body["response_format"]["json_schema"]["schema"]
    if kind == "json_object":
        return None
    return body["structured_outputs"][kind]
