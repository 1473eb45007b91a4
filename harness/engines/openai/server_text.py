"""What a server does with *text*: how it tokenizes a prompt, and what it samples with by default.

For servers that refuse token-id prompts (llama-cpp-python: HTTP 422 "prompt: Input should be a
valid string") the harness sends the case's text, and must then read back the ids the server made
of it. In order of preference:

=========================  =====================================================================
``POST /extras/tokenize``  llama-cpp-python: ``{"input": text}`` -> ``{"tokens": [...]}``
``POST /tokenize``         llama.cpp's server (``content``, ``add_special``) and vLLM's (``prompt``,
                           ``add_special_tokens``); one body carries both spellings
echo                       ``/v1/completions`` with ``echo`` and ``logprobs``: the prompt's tokens
                           come back as texts, checked one by one against the oracle ids' texts
=========================  =====================================================================

Special tokens are asked for as the completion path adds them (a BOS the GGUF adds but the HF
tokenizer does not is exactly the kind of mismatch this must show).

``/openapi.json`` (FastAPI servers: vLLM, llama-cpp-python) publishes the completion request's
fields with their defaults; the sampling fields a request leaves out are then named with the value
the server will use for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.engines.openai.token_text import TokenTexts

SAMPLING_FIELDS = ("top_k", "top_p", "min_p", "typical_p", "tfs_z", "repeat_penalty", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "penalty_last_n", "repeat_last_n",
                   "mirostat_mode", "mirostat", "dynatemp_range", "xtc_probability", "dry_multiplier",
                   "temperature", "seed")
"""Request fields that change which token a sampler picks (whatever a server calls them)."""
OPENAI_SAMPLING = ("top_p", "presence_penalty", "frequency_penalty")
"""The OpenAI API's own, assumed present when a server does not publish its schema."""

PostJson = Callable[[str, Mapping[str, Any], str], Any]
"""(path, body, prefix) -> parsed JSON; raises on HTTP errors."""


def _tokens(body: Any) -> list[int] | None:
    toks = body.get("tokens") if isinstance(body, Mapping) else None
    if isinstance(toks, list) and all(isinstance(t, int) for t in toks):
        return [int(t) for t in toks]
    # llama.cpp with with_pieces: [{"id": 1, "piece": "x"}, ...]
    if isinstance(toks, list) and all(isinstance(t, Mapping) and isinstance(t.get("id"), int) for t in toks):
        return [int(t["id"]) for t in toks]
    return None


def tokenize_endpoint(post: PostJson, root: str, model: str | None, probe_text: str
                      ) -> tuple[str, Callable[[str], list[int]]] | None:
    """The first tokenize endpoint that answers ``probe_text`` with ids: (its name, a tokenize
    function), or None."""
    def extras(text: str) -> list[int]:
        got = _tokens(post("/extras/tokenize", {"input": text, **({"model": model} if model else {})}, root))
        if got is None:
            raise ValueError("POST /extras/tokenize: no 'tokens' list in the answer")
        return got

    def generic(text: str) -> list[int]:
        body = {"content": text, "add_special": True, "prompt": text, "add_special_tokens": True}
        got = _tokens(post("/tokenize", {**body, **({"model": model} if model else {})}, root))
        if got is None:
            raise ValueError("POST /tokenize: no 'tokens' list in the answer")
        return got

    for name, fn in (("POST /extras/tokenize", extras), ("POST /tokenize", generic)):
        try:
            fn(probe_text)
        except Exception:  # noqa: BLE001 - any failure means: not this endpoint
            continue
        return name, fn
    return None


def ids_from_echo(text: str, echoed: Sequence[str], expected: Sequence[int], texts: TokenTexts,
                  renders: Callable[[int], frozenset[str]]) -> list[int]:
    """The prompt ids an echo shows, read token text by token text: position ``p`` is the oracle's
    id when its text is one the oracle's id renders as, else whatever single id the text maps to
    (:data:`UNMAPPED` if none). The echo also carries the generated token(s): only as many tokens
    as spell out ``text`` are the prompt's."""
    out: list[int] = []
    spelled = ""
    for p, tok in enumerate(echoed):
        if len(spelled) >= len(text):
            break
        spelled += tok
        want = expected[p] if p < len(expected) else None
        out.append(want if want is not None and tok in renders(want) else texts.lookup(tok))
    return out


def sampling_defaults(openapi: Any) -> dict[str, Any] | None:
    """The completion request's sampling fields -> defaults, from a FastAPI ``/openapi.json``
    (None when the document has no completion request schema)."""
    if not isinstance(openapi, Mapping):
        return None
    try:
        post = openapi["paths"]["/v1/completions"]["post"]
        schema = post["requestBody"]["content"]["application/json"]["schema"]
    except (KeyError, TypeError):
        return None
    comps = openapi.get("components", {}).get("schemas", {})
    seen = 0
    while isinstance(schema, Mapping) and "$ref" in schema and seen < 5:
        schema = comps.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
        seen += 1
    if isinstance(schema, Mapping) and "anyOf" in schema:  # vLLM: Union[CompletionRequest, ...]
        refs = [s for s in schema["anyOf"] if isinstance(s, Mapping) and "$ref" in s]
        schema = comps.get(str(refs[0]["$ref"]).rsplit("/", 1)[-1], {}) if refs else {}
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping):
        return None
    return {k: (v.get("default") if isinstance(v, Mapping) else None)
            for k, v in props.items() if k in SAMPLING_FIELDS}


def left_to_server(sent: Mapping[str, Any], defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """Sampling fields the request did not send -> the server's default (None: not published)."""
    known = defaults if defaults is not None else {k: None for k in OPENAI_SAMPLING}
    return {k: v for k, v in known.items() if k not in sent}

