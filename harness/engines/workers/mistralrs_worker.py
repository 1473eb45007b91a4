"""mistral.rs worker (runs in ``.venvs/mistralrs-<version>/``; protocol: ``worker_protocol.py``).

No conversion: mistral.rs loads the model folder's own safetensors, config and ``tokenizer.json``
(``Which.Plain(model_id=<folder>, dtype=ModelDType.F32)``), its architecture detected from
``config.json``.

Its Python API takes prompts as **text** only (``CompletionRequest.prompt`` and the chat request's
pre-templated ``messages`` are strings), and returns logprobs only for chat requests. So each case's
ids are turned into text with mistral.rs's own detokenizer, sent as a pre-templated chat request
(no template applied), and what mistral.rs makes of that text is read back with its own
``tokenize_text`` (the harness's tokenizer verdict judges it against the oracle's ids). Greedy:
``temperature=0``, ``top_p=1``, ``repetition_penalty=1``, no presence or frequency penalty, set
explicitly. The top logprobs come back with token ids; the generated token comes back as text and
bytes, and its id is the top entry with the same bytes and logprob (it is the top-1 of a greedy
decode), else unmapped (-1, counted in the record).
"""

from __future__ import annotations

import os
from typing import Any

from worker_protocol import Engine, Generated, Refused, main

GREEDY = {"temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
          "frequency_penalty": 0.0}
"""Every sampling field that could change a greedy decode, set explicitly."""

REFUSAL_MARKERS = ("not supported", "Unsupported", "unsupported", "Unknown architecture", "unknown variant",
                   "not yet supported", "Could not determine")


class MistralRS(Engine):
    def version(self) -> str:
        import importlib.metadata as md

        return md.version("mistralrs")

    def start(self) -> None:
        import mistralrs as m

        path = self.req["model"]
        try:
            self.runner = m.Runner(which=m.Which.Plain(model_id=path, dtype=m.ModelDType.F32,
                                                       tokenizer_json=os.path.join(path, "tokenizer.json")),
                                   max_seqs=1, prefix_cache_n=0, token_source="none", seed=0)
        except Exception as e:  # noqa: BLE001 - an architecture it lacks is a refusal
            text = f"{type(e).__name__}: {e}"
            if any(k in text for k in REFUSAL_MARKERS):
                raise Refused(f"mistral.rs cannot load {os.path.basename(path)}: {text[:600]}") from None
            raise
        self.m = m
        self.mapped = {"resolved": 0, "unmapped": 0}

    def generate(self, prompt_ids: list[int], max_tokens: int, k: int) -> Generated:
        text = self.runner.detokenize_text(prompt_ids, False)
        served = [int(t) for t in self.runner.tokenize_text(text, True, None)]
        req = self.m.ChatCompletionRequest(messages=text, model="default", max_tokens=max_tokens,
                                           logprobs=True, top_logprobs=k, **GREEDY)
        res = self.runner.send_chat_completion_request(req)
        choice = res.choices[0]
        content = choice.logprobs.content if choice.logprobs is not None else None
        g = Generated([], choice.message.content or "", _finish(choice.finish_reason),
                      served_prompt_ids=served,
                      extra={"engine_prompt_tokens": getattr(res.usage, "prompt_tokens", None)})
        if not content:
            return g
        ids, top_ids, top_lps, chosen = [], [], [], []
        for step in content:
            row = list(step.top_logprobs)[:k]
            tid = next((int(t.token) for t in row if t.logprob == step.logprob and _same_bytes(t, step)), -1)
            self.mapped["resolved" if tid >= 0 else "unmapped"] += 1
            ids.append(tid)
            top_ids.append([int(t.token) for t in row])
            top_lps.append([float(t.logprob) for t in row])
            chosen.append(float(step.logprob))
        g.token_ids = ids
        g.top = (top_ids, top_lps, chosen)
        if self.mapped["unmapped"]:
            g.notes.append(f"{self.mapped['unmapped']} generated tokens matched no top-k entry (id -1)")
        return g


def _same_bytes(top: Any, step: Any) -> bool:
    if step.bytes is None or top.bytes is None:
        return True
    mine = bytes(step.bytes)
    return mine.decode("utf-8", errors="replace") == top.bytes or top.bytes.encode() == mine


def _finish(reason: str) -> str:
    return {"eos": "stop", "stop": "stop", "length": "length"}.get(str(reason).lower(), str(reason))


if __name__ == "__main__":
    main(MistralRS)
