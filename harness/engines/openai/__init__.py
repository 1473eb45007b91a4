"""``openai:<base-url>``: any OpenAI-compatible server as a candidate (vLLM, SGLang, llama.cpp, ...).

Every case goes to ``POST <base>/v1/completions`` with the prompt as a *list of token ids* (so the
server's tokenizer cannot drift), ``temperature=0``, ``max_tokens`` and ``logprobs=k`` from the
suite, streamed so that time to first token can be measured. Options follow the URL, comma-separated:

    openai:http://127.0.0.1:8000,c=8,model=tiny,key_env=MY_KEY,timeout=30,retries=2

=================  ===========================================================================
``c``              requests in flight (1, 4, 8, ...); the CLI's ``--concurrency`` by default
``model``          the served model name (default: the first one ``/v1/models`` lists)
``key_env``        environment variable holding the API key (default ``OPENAI_API_KEY``, optional
                   then); the key is sent as a Bearer token and never written anywhere
``timeout``        seconds a server may stay silent before the request counts as hung (60)
``request_timeout``seconds one whole request may take (600)
``retries``        extra attempts after a timeout, a dropped connection or HTTP 5xx (2)
``breaker``        after this many cases in a row fail to reach the server, the rest are not sent (3)
``wait``           seconds to wait for ``/v1/models`` to answer at start (30)
``stream``         ``false`` for servers that cannot stream (then TTFT is not measured)
``prompts``        ``ids`` (refuse a server that cannot take them), ``text``, or ``auto`` (ids, and
                   text when the server refuses ids; the default)
``body.<field>``   an engine-specific request field sent with every request, e.g.
                   ``body.repeat_penalty=1.0`` (JSON values; the record keeps them)
``chain``          the sampling gate: the sampler chain the server documents (``vllm``, the
                   default; ``llama.cpp``, ``transformers``)
``logprobs_mode``  the sampling gate: which logprobs its draws carry (``raw_logprobs``, the default)
``probe``          the API gate (``make api``): ``yes`` lets it send requests that might kill the
                   server (empty prompts, malformed JSON, ...); ``no`` (the default) leaves them out
=================  ===========================================================================

**Text prompts.** A server that refuses token-id prompts gets each case's text instead, and the
ids it makes of that text are read back (its tokenize endpoint, else an echo of the prompt with
logprobs; :mod:`harness.engines.openai.server_text`): a case tokenized differently is not sent, and its
``tokenizer`` verdict names the first differing prompt token. A server that keys logprobs by token
text gets its tokens and top-k mapped back to ids through the model's tokenizer where exactly one
id renders as that text, and flagged where not (:mod:`harness.engines.openai.token_text`).

Servers differ, so the first case is first sent as a probe that detects, and the record keeps:
whether token ids come back (vLLM's ``return_token_ids``, or logprob tokens as ``token_id:123``
with ``return_tokens_as_token_ids``), whether top-k logprobs come back keyed by id, and whether
``logprobs`` is capped (vLLM ``--max-logprobs``, 20 by default): a capped server is asked for what
it allows and the record says so. A server without ids is judged by ``strict`` on text only.

A case the server fails (hang, HTTP 5xx after the retries, malformed JSON, a wrong number of
logprobs, a stream cut short) comes back as an ``Output.error`` naming what happened with an
excerpt of the response; the other cases still run.

The jobs, one module each: :mod:`.options` (the spec and the request body), :mod:`.transport`
(HTTP, streams, faults), :mod:`.probe` (what this server returns), :mod:`.reply` (a reply ->
an :class:`~harness.api.Output`), :mod:`.runner` (the :class:`~harness.api.Runner`) and
:mod:`.sampler` (its :class:`~harness.abilities.Sampler` ability: seeded draws for the sampling gate).
"""

from __future__ import annotations

from harness.engines.base import ENGINES, RunnerContext
from harness.engines.openai.options import OWNED, OpenAIOptions, body_value, parse_openai_spec
from harness.engines.openai.runner import OpenAIRunner
from harness.models import ModelRef

__all__ = ["OWNED", "OpenAIOptions", "OpenAIRunner", "body_value", "parse_openai_spec"]


@ENGINES.register("openai", help="an OpenAI-compatible server "
                           "(openai:http://127.0.0.1:8000,c=8,key_env=MY_KEY)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> OpenAIRunner:
    return OpenAIRunner(parse_openai_spec(spec, arg, ctx.concurrency or 1), name=ctx.name or spec,
                        model=model)
