"""The probe: the first case sent as a short request (2 tokens), re-shaped until the server accepts
it, to find out what this server returns (:class:`~harness.engines.openai.reply.ServerProtocol`):
token ids or text only, top-k logprobs keyed by id or by text, a logprobs cap, ids or text prompts."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.api import Case, EngineFailed, EngineRefused, Sampling
from harness.capabilities import Capabilities
from harness.engines.openai.options import OpenAIOptions
from harness.engines.openai.reply import TOKEN_ID, ReplyDecoder, ServerProtocol
from harness.engines.openai.server_text import left_to_server, sampling_defaults
from harness.engines.openai.transport import Fault, Reply, Transport
from harness.excerpt import INLINE, clip, first_line

# Request fields only vLLM (and servers copying it) understand; dropped if a server rejects them.
VLLM_EXTRAS = {"return_token_ids": True, "return_tokens_as_token_ids": True}


@dataclass(frozen=True, slots=True)
class Prober:
    """Everything the probe talks through; ``served`` is the model name requests carry."""

    name: str
    options: OpenAIOptions
    http: Transport
    decoder: ReplyDecoder
    served: str | None

    def probe(self, cases: Sequence[Case], sampling: Sampling) -> ServerProtocol:
        """Find out what this server returns, with the first case that gets an answer (2 tokens)."""
        problems = []
        for case in cases[:3]:
            try:
                return self._probe_one(case, sampling)
            except Fault as f:
                problems.append(f"{case.id}: {self.http.redact(f.describe())}")
        raise EngineFailed(f"{self.name}: no usable answer from {self.options.base_url} to the probe "
                           f"request:\n  " + "\n  ".join(problems))

    def _probe_one(self, case: Case, sampling: Sampling) -> ServerProtocol:
        k, extras = sampling.logprobs, dict(VLLM_EXTRAS)
        notes: list[str] = []
        reasons: dict[str, str] = {}
        prompts = "text" if self.options.prompts == "text" else "ids"
        shape = ServerProtocol({}, 0, None, False, Capabilities(), False, prompts)
        canary = self._canary(case, shape, sampling) if self._may_try_ids(prompts) else None
        for _ in range(7):
            # A short prefix: the probe must not leave full KV blocks for the real request to hit.
            prompt = self.decoder.prompt(case, replace(shape, prompts=prompts), 8)
            body = self.options.completion_body(self.served, prompt, min(2, sampling.max_tokens), k, extras,
                                                stream=False)
            try:
                reply = self.http.with_retries(lambda b=body: self.http.complete(b, False))
                break
            except Fault as f:
                text = f.excerpt or f.what
                if canary is not None and prompts == "ids" and f.status >= 500 \
                        and "validation error" not in text:  # llama-cpp-python's refusal is a 500 too
                    why = first_line(self.http.redact(f.describe()))
                    self._still_alive(canary, case, why)
                    notes.append(f"server answers token-id prompts with an error ({why}) and stays up: "
                                 f"prompts sent as text, the server's tokenization verified per case")
                    prompts = "text"
                    continue
                # llama-cpp-python answers a request it cannot validate with HTTP 500
                if f.status not in (400, 422) and not (f.status == 500 and "validation error" in text):
                    raise
                cap = re.search(r"max(?:imum)? allowed:?\s*(\d+)", text)
                if k > 0 and cap and int(cap.group(1)) < k:
                    notes.append(f"server caps logprobs at {cap.group(1)} (asked {k}; vLLM: --max-logprobs)")
                    k = int(cap.group(1))
                elif extras and any(x in text for x in extras):
                    notes.append(f"server rejects {', '.join(sorted(extras))}: sent without them")
                    extras = {}
                elif k > 0 and "logprobs" in text:
                    reasons["top_logprobs"] = f"server refuses logprobs ({clip(text, INLINE)!r})"
                    k = 0
                elif prompts == "ids" and self.options.prompts == "auto" and self.decoder.model is not None:
                    why = first_line(self.http.redact(f.describe()))
                    notes.append(f"server refuses token-id prompts ({why}): prompts sent as text, the "
                                 f"server's tokenization verified per case")
                    prompts = "text"
                else:
                    as_what = "token ids" if prompts == "ids" else "text"
                    hint = ""
                    if prompts == "ids":
                        hint = (". Text prompts (verified tokenization) need prompts=auto or prompts=text"
                                if self.options.prompts == "ids" else
                                ". Text prompts need the model's tokenizer (a gate run has it)")
                    raise EngineRefused(
                        f"{self.name}: the server refused the probe request ({case.id} as {as_what}, "
                        f"temperature 0, logprobs={k}): {self.http.redact(f.describe())}{hint}") from None
        else:
            raise EngineRefused(f"{self.name}: could not agree on a request shape: {'; '.join(notes)}")
        return self._found(reply, k, extras, prompts, sampling, notes, reasons)

    def _may_try_ids(self, prompts: str) -> bool:
        """Whether the probe will try token ids where text would also do (``prompts=auto`` with the
        model's tokenizer at hand): then it first sends the same request as text, the canary."""
        return prompts == "ids" and self.options.prompts == "auto" and self.decoder.model is not None

    def _canary(self, case: Case, shape: ServerProtocol, sampling: Sampling) -> dict[str, Any] | None:
        """A text request (2 tokens, no logprobs) sent once before the first token-id prompt: that
        the server answers it is what later shows a token-id prompt killed it. None when the server
        does not take it (a server may take token ids only); the probe then goes on without."""
        text = self.decoder.prompt(case, replace(shape, prompts="text"), 8)
        body = self.options.completion_body(self.served, text, min(2, sampling.max_tokens), 0, {},
                                            stream=False)
        try:
            self.http.with_retries(lambda: self.http.complete(body, False))
        except Fault:
            return None
        return body

    def _still_alive(self, canary: Mapping[str, Any], case: Case, why: str) -> None:
        """After a token-id prompt failed: the canary again. A server that answered it before and
        fails it now died on the token-id prompt, and every later answer would come from a dead
        server: say so, naming the request, instead of gating its error pages."""
        try:
            self.http.complete(dict(canary), False)
        except Fault as f:
            raise EngineFailed(
                f"{self.name}: the server died on a token-id prompt: {case.id} sent as token ids "
                f"(\"prompt\": [...], a form the OpenAI API allows) answered {why}, and the text "
                f"request it had answered just before now answers "
                f"{first_line(self.http.redact(f.describe()))}. Every later answer would come from "
                f"a dead server. Restart it and gate it with prompts=text (or report the crash to "
                f"the engine)") from None

    def _found(self, reply: Reply, k: int, extras: Mapping[str, Any], prompts: str, sampling: Sampling,
               notes: list[str], reasons: dict[str, str]) -> ServerProtocol:
        """What the accepted probe's reply says about the server."""
        lp_ids = [TOKEN_ID.match(t) for t in reply.lp_tokens]
        top_ids = bool(reply.lp_top) and all(
            isinstance(row, Mapping) and all(TOKEN_ID.match(key) for key in row) for row in reply.lp_top)
        mappable = self.decoder.mappable(reply)
        if reply.token_ids is not None:
            ids_from: str | None = "token_ids"
        elif reply.lp_tokens and all(lp_ids):
            ids_from = "logprob_tokens"
        elif mappable is None:
            ids_from = "token_text"
        else:
            ids_from = None
            reasons["token_ids"] = ("server returns text only: no token_ids field and no "
                                    "'token_id:N' logprob tokens (vLLM: return_token_ids)"
                                    + (f"; not mapped to ids: {mappable}" if mappable else ""))
        top_from_text = k > 0 and reply.has_logprobs and not top_ids and mappable is None
        if k > 0 and not reply.has_logprobs:
            reasons.setdefault("top_logprobs", "server ignores logprobs: none came back")
            k = 0
        elif k > 0 and not top_ids and not top_from_text:
            reasons.setdefault("top_logprobs", "server keys top logprobs by token text, not id "
                                               "(vLLM: return_tokens_as_token_ids)")
        sent = self.options.request_fields()
        has_top = k > 0 and (top_ids or top_from_text)
        caps = Capabilities(token_ids=ids_from is not None, top_logprobs=has_top,
                            logprobs_served=k, logprobs_asked=sampling.logprobs, reasons=reasons,
                            notes=tuple(notes), prompts="text" if prompts == "text" else "ids",
                            ids_from_text=ids_from == "token_text" or top_from_text,
                            request=sent, left_to_server=left_to_server(sent, self._sampling_defaults()))
        return ServerProtocol(extras, k, ids_from, top_ids, caps, self.options.stream, prompts, top_from_text)

    def _sampling_defaults(self) -> dict[str, Any] | None:
        """The completion request's sampling defaults, when the server publishes its schema."""
        try:
            return sampling_defaults(self.http.get_json("/openapi.json", prefix=self.http.root()))
        except Fault:
            return None
