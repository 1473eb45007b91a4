"""mistral.rs worker (runs in ``.venvs/mistralrs-<version>/``; protocol: ``worker_protocol.py``).

No conversion: mistral.rs loads the model folder's own safetensors, config and ``tokenizer.json``
(``Which.Plain(model_id=<folder>, dtype=ModelDType.F32)``), its architecture detected from
``config.json``.

Its Python API takes prompts as **text** only, and only chat requests return logprobs
(``CompletionRequest`` has no ``logprobs`` field). A chat request needs a chat template (a model
without one answers "Received messages for a model which does not have a chat template"), so the
worker gives mistral.rs one that renders the single user message verbatim (:data:`VERBATIM`: no
roles, no special tokens). Each case's ids are turned into text with mistral.rs's own detokenizer
and sent as that one message; what mistral.rs makes of the text is read back with its own
``tokenize_text``, checked against the prompt token count of the chat request's usage, and judged
by the harness's tokenizer verdict against the oracle's ids.

mistral.rs keeps an **f16 KV cache on CPU** by default, whatever the model dtype ("Using f16 KV
cache on CPU (set MISTRALRS_CPU_KV_F32=1 for f32)"); the harness sets ``MISTRALRS_CPU_KV_F32=1``
in the worker's environment (``mistralrs:kv=f16`` keeps the default, to measure it). A ``seed``
for the runner fails on CPU ("cannot seed the CPU rng with set_seed"): greedy needs none, so none
is given. Greedy:
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

VERBATIM = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""A chat template that renders the one user message as it is."""

REFUSAL_MARKERS = ("not supported", "Unsupported", "unsupported", "Unknown architecture", "unknown variant",
                   "not yet supported", "Could not determine")


class MistralRS(Engine):
    def version(self) -> str:
        import importlib.metadata as md

        return md.version("mistralrs")

    def start(self) -> None:
        import mistralrs as m

        path = self.req["model"]
        kv = self.options.get("kv", "f32")
        if kv not in ("f32", "f16"):
            raise Refused(f"kv={kv!r}: f32 (the default here) or f16 (mistral.rs's CPU default)")
        if kv == "f32":
            os.environ["MISTRALRS_CPU_KV_F32"] = "1"
        else:
            os.environ.pop("MISTRALRS_CPU_KV_F32", None)
        template = os.path.join(os.path.dirname(self.req.get("result", "")) or ".", "verbatim.jinja")
        with open(template, "w") as fh:
            fh.write(VERBATIM)
        self.notes.append("chat template: the one user message verbatim (" + VERBATIM + ")")
        self.notes.append("KV cache: " + ("f32 (MISTRALRS_CPU_KV_F32=1)" if kv == "f32"
                                          else "mistral.rs's CPU default, f16"))
        try:
            self.runner = m.Runner(which=m.Which.Plain(model_id=path, dtype=m.ModelDType.F32,
                                                       tokenizer_json=os.path.join(path, "tokenizer.json")),
                                   max_seqs=1, prefix_cache_n=0, token_source="none", jinja_explicit=template)
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
        req = self.m.ChatCompletionRequest(messages=[{"role": "user", "content": text}], model="default",
                                           max_tokens=max_tokens, logprobs=True, top_logprobs=k, **GREEDY)
        res = self.runner.send_chat_completion_request(req)
        choice = res.choices[0]
        content = choice.logprobs.content if choice.logprobs is not None else None
        counted = getattr(res.usage, "prompt_tokens", None)
        extra: dict[str, Any] = {"engine_prompt_tokens": counted}
        if counted is not None and counted != len(served):
            extra["tokenize_error"] = (f"the chat request counted {counted} prompt tokens, tokenize_text "
                                       f"gave {len(served)}: the ids it really ran on are unknown")
        g = Generated([], choice.message.content or "", _finish(choice.finish_reason),
                      served_prompt_ids=None if "tokenize_error" in extra else served, extra=extra)
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
