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
=================  ===========================================================================

**Text prompts.** A server that refuses token-id prompts gets each case's text instead, and the
ids it makes of that text are read back (its tokenize endpoint, else an echo of the prompt with
logprobs; :mod:`harness.engines.server_text`): a case tokenized differently is not sent, and its
``tokenizer`` verdict names the first differing prompt token. A server that keys logprobs by token
text gets its tokens and top-k mapped back to ids through the model's tokenizer where exactly one
id renders as that text, and flagged where not (:mod:`harness.engines.token_text`).

Servers differ, so the first case is first sent as a probe that detects, and the record keeps:
whether token ids come back (vLLM's ``return_token_ids``, or logprob tokens as ``token_id:123``
with ``return_tokens_as_token_ids``), whether top-k logprobs come back keyed by id, and whether
``logprobs`` is capped (vLLM ``--max-logprobs``, 20 by default): a capped server is asked for what
it allows and the record says so. A server without ids is judged by ``strict`` on text only.

A case the server fails (hang, HTTP 5xx after the retries, malformed JSON, a wrong number of
logprobs, a stream cut short) comes back as an ``Output.error`` naming what happened with an
excerpt of the response; the other cases still run.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.capabilities import Capabilities
from harness.engines.base import ENGINES, NoTensors, RunnerContext
from harness.engines.server_text import ids_from_echo, left_to_server, sampling_defaults, tokenize_endpoint
from harness.engines.token_text import UNMAPPED, TokenTexts
from harness.models import ModelRef
from harness.speed import Speed

TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
# Request fields only vLLM (and servers copying it) understand; dropped if a server rejects them.
VLLM_EXTRAS = {"return_token_ids": True, "return_tokens_as_token_ids": True}
EXCERPT = 300
OWNED = frozenset({"model", "prompt", "max_tokens", "logprobs", "stream", "stream_options", "echo", "n",
                   "best_of"})
"""Request fields the harness itself sets for every case; ``body.<field>`` may not replace them."""


@dataclass(frozen=True, slots=True)
class OpenAIOptions:
    """How to talk to one server (parsed from the candidate spec)."""

    base_url: str
    """Ends with ``/v1``."""
    concurrency: int = 1
    model: str | None = None
    key_env: str = "OPENAI_API_KEY"
    key_required: bool = False
    """True when ``key_env`` was named explicitly: then a missing variable is an error."""
    timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    retries: int = 2
    breaker: int = 3
    wait_s: float = 30.0
    stream: bool = True
    prompts: str = "auto"
    """``ids``, ``text`` or ``auto`` (ids; text when the server refuses ids)."""
    body: tuple[tuple[str, Any], ...] = ()
    """Engine-specific request fields (``body.<field>=<value>``), sent with every request."""

    def settings(self) -> dict[str, Any]:
        """For the record: everything but the key itself."""
        return {"base_url": self.base_url, "concurrency": self.concurrency, "model": self.model,
                "api_key_env": self.key_env, "api_key_set": bool(os.environ.get(self.key_env)),
                "timeout_s": self.timeout_s, "request_timeout_s": self.request_timeout_s,
                "retries": self.retries, "breaker": self.breaker, "stream": self.stream,
                "prompts": self.prompts, "body": dict(self.body)}


OPTION_KEYS = ("c", "model", "key_env", "timeout", "request_timeout", "retries", "breaker", "wait",
               "stream", "prompts", "body.<field>")


def body_value(text: str) -> Any:
    """``body.<field>=<value>``: a JSON value (``1.0``, ``true``, ``null``, ``"x"``, ``[1, 2]``),
    else the text as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_openai_spec(spec: str, arg: str | None, concurrency: int = 1) -> OpenAIOptions:
    """``openai:<url>[,key=value...]`` -> options; every mistake names the spec and the option."""
    if not arg:
        raise EngineRefused(f"candidate {spec!r}: give the server's base URL, "
                            f"e.g. openai:http://127.0.0.1:8000")
    url, *rest = arg.split(",")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineRefused(f"candidate {spec!r}: {url!r} is not an http(s) URL")
    if parts.username or parts.password:
        raise EngineRefused(f"candidate {spec!r}: put credentials in an environment variable "
                            f"(key_env=NAME), not in the URL: specs are written into records")
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    opts: dict[str, Any] = {"base_url": base, "concurrency": concurrency}
    body: dict[str, Any] = {}
    for part in rest:
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if eq and key.startswith("body.") and len(key) > 5:
            field_name = key[5:]
            if field_name in OWNED:
                raise EngineRefused(f"candidate {spec!r}: body.{field_name} is set by the harness for every "
                                    f"case; it cannot be replaced")
            body[field_name] = body_value(value)
            continue
        if not eq or key not in OPTION_KEYS:
            raise EngineRefused(f"candidate {spec!r}: option {part!r} is not one of "
                                f"{', '.join(k + '=' for k in OPTION_KEYS)}")
        try:
            if key == "c":
                opts["concurrency"] = int(value)
            elif key in ("timeout", "request_timeout", "wait"):
                opts[{"timeout": "timeout_s", "request_timeout": "request_timeout_s",
                      "wait": "wait_s"}[key]] = float(value)
            elif key in ("retries", "breaker"):
                opts[key] = int(value)
            elif key == "stream":
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                opts["stream"] = value.lower() == "true"
            elif key == "key_env":
                opts["key_env"], opts["key_required"] = value, True
            elif key == "prompts":
                if value not in ("ids", "text", "auto"):
                    raise ValueError(value)
                opts["prompts"] = value
            else:
                opts[key] = value
        except ValueError:
            raise EngineRefused(f"candidate {spec!r}: option {key}={value!r} is not a valid value") from None
    o = OpenAIOptions(**opts, body=tuple(body.items()))
    if o.concurrency < 1 or o.retries < 0 or o.breaker < 1 or o.timeout_s <= 0:
        raise EngineRefused(f"candidate {spec!r}: c and breaker must be >= 1, retries >= 0, timeout > 0")
    return o


class Fault(Exception):
    """One failed exchange with the server. ``retryable``: a timeout, dropped connection or 5xx."""

    def __init__(self, what: str, excerpt: str = "", retryable: bool = False, status: int = 0,
                 transport: bool = False) -> None:
        super().__init__(what)
        self.what = what
        self.excerpt = excerpt
        self.retryable = retryable
        self.status = status
        self.transport = transport
        """The server could not be reached or went silent (counts towards the breaker)."""

    def describe(self) -> str:
        return self.what + (f"; response: {self.excerpt!r}" if self.excerpt else "")


@dataclass(frozen=True, slots=True)
class Protocol:
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


@dataclass(slots=True)
class _Reply:
    """One completion, accumulated over stream chunks (or from one JSON body)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    lp_tokens: list[str] = field(default_factory=list)
    lp_chosen: list[float | None] = field(default_factory=list)
    lp_top: list[dict[str, float] | None] = field(default_factory=list)
    has_logprobs: bool = False
    finish_reason: str | None = None
    usage_tokens: int | None = None
    ttft_s: float | None = None

    def feed(self, chunk: Mapping[str, Any], t_sent: float) -> None:
        if isinstance(chunk.get("usage"), Mapping):
            self.usage_tokens = chunk["usage"].get("completion_tokens", self.usage_tokens)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise Fault("response has no 'choices' list", excerpt=json.dumps(chunk)[:EXCERPT])
        for ch in choices:
            if not isinstance(ch, Mapping) or ch.get("index", 0) != 0:
                continue
            got_token = False
            if isinstance(ch.get("text"), str):
                self.text.append(ch["text"])
                got_token |= bool(ch["text"])
            if isinstance(ch.get("token_ids"), list):
                self.token_ids = (self.token_ids or []) + [int(t) for t in ch["token_ids"]]
                got_token |= bool(ch["token_ids"])
            lp = ch.get("logprobs")
            if isinstance(lp, Mapping):
                self.has_logprobs = True
                toks = lp.get("tokens") or []
                self.lp_tokens += [str(t) for t in toks]
                self.lp_chosen += list(lp.get("token_logprobs") or [])
                self.lp_top += list(lp.get("top_logprobs") or [])
                got_token |= bool(toks)
            if ch.get("finish_reason"):
                self.finish_reason = str(ch["finish_reason"])
            if got_token and self.ttft_s is None:
                self.ttft_s = time.perf_counter() - t_sent


class OpenAIRunner(NoTensors):
    """A candidate reached over HTTP. ``watch`` (optional) says why the server died, if it did."""

    tensors_why_not = "an OpenAI-compatible server answers tokens and logprobs, never its hidden states"

    def __init__(self, options: OpenAIOptions, name: str = "openai",
                 watch: Callable[[], str | None] | None = None, model: ModelRef | None = None) -> None:
        self.name = name
        self.options = options
        self.watch = watch
        self.model = model
        """The model under test: its tokenizer turns text prompts and token texts into ids."""
        self._texts: TokenTexts | None = None
        self._unmapped: Counter[str] = Counter()
        self.timings: dict[str, float] = {}
        self.speed: Speed | None = None
        self.capabilities: Capabilities | None = None
        self.protocol: Protocol | None = None
        self._served: dict[str, Any] = {}
        self._version = "unknown"
        self._fingerprint: str | None = None
        self._lock = threading.Lock()
        self._failed_in_a_row = 0
        self._broken: str | None = None
        parts = urlsplit(options.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")

    # -- contract ----------------------------------------------------------------------------
    def info(self) -> EngineInfo:
        env = self.options.settings()
        settings = {"model": self._served.get("id", self.options.model),
                    "concurrency": env.pop("concurrency"), "stream": env.pop("stream"),
                    "prompts": env.pop("prompts"), "body": env.pop("body")}
        env.pop("model", None)
        if self._fingerprint:
            env["system_fingerprint"] = self._fingerprint
        if self.protocol is not None:
            env["protocol"] = {"logprobs": self.protocol.logprobs, "ids_from": self.protocol.ids_from,
                               "top_ids": self.protocol.top_ids, "stream": self.protocol.stream,
                               "extras": sorted(self.protocol.extras), "prompts": self.protocol.prompts,
                               "top_from_text": self.protocol.top_from_text}
        return EngineInfo(self.name, str(self._served.get("owned_by") or "openai-compatible"),
                          self._version, settings=settings, environment=env)

    def facts(self) -> RunFacts:
        return RunFacts(timings=dict(self.timings), speed=self.speed, capabilities=self.capabilities)

    def start(self) -> None:
        """Wait for ``/v1/models`` (``wait`` seconds), pick the served model, read the version."""
        o = self.options
        if o.key_required and not os.environ.get(o.key_env):
            raise EngineRefused(f"{self.name}: environment variable {o.key_env} (key_env) is not set")
        t0 = time.perf_counter()
        deadline = time.monotonic() + o.wait_s
        while True:
            try:
                body = self._get_json("/models")
                break
            except Fault as f:
                if not f.retryable:
                    raise EngineFailed(f"{self.name}: {o.base_url}/models answered "
                                       f"{self._redact(f.describe())}") from None
                if time.monotonic() > deadline:
                    raise EngineFailed(f"{self.name}: {o.base_url}/models did not answer within "
                                       f"{o.wait_s:.0f} s: {self._redact(f.describe())}") from None
                if (why := self.watch and self.watch()):
                    raise EngineFailed(f"{self.name}: the server exited before answering: {why}") from None
                time.sleep(0.5)
        data = body.get("data", []) if isinstance(body, Mapping) else []
        models = [m for m in data if isinstance(m, Mapping)] if isinstance(data, list) else []
        if o.model is not None:
            self._served = next((m for m in models if m.get("id") == o.model), {"id": o.model})
        elif models:
            self._served = models[0]
        else:
            raise EngineFailed(f"{self.name}: {o.base_url}/models lists no model; name one with model=")
        try:
            v = self._get_json("/version", prefix=self._root())
            self._version = str(v.get("version", "unknown")) if isinstance(v, Mapping) else "unknown"
        except Fault:
            pass
        self.timings["wait_s"] = time.perf_counter() - t0

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        if not cases:
            return []
        t0 = time.perf_counter()
        self.protocol = self._probe(cases, sampling)
        self.capabilities = self.protocol.capabilities
        self.timings["probe_s"] = time.perf_counter() - t0
        unsent: dict[str, str] = {}
        if self.protocol.prompts == "text":
            t0 = time.perf_counter()
            unsent = self._verify_tokenization(cases)
            self.timings["tokenize_s"] = time.perf_counter() - t0
        c = self.options.concurrency
        with ThreadPoolExecutor(max_workers=c, thread_name_prefix="openai") as pool:
            list(pool.map(self._warm_up, cases[:c]))
            t1 = time.perf_counter()
            results = list(pool.map(lambda case: self._case(case, sampling, unsent.get(case.id)), cases))
        wall = time.perf_counter() - t1
        outs = [r[0] for r in results]
        ttfts = tuple(r[1] for r in results if r[1] is not None)
        n_tok = sum(r[2] for r in results)
        self.timings.update({"generate_s": wall, "output_tokens": float(n_tok)})
        self.speed = Speed(c, len(cases), n_tok, wall, ttfts,
                           "http-stream" if self.protocol.stream else "http")
        if self.protocol.ids_from == "token_text" or self.protocol.top_from_text:
            keys = ("generated", "resolved", "top", "missing", "ended_unnamed")
            self._set_capabilities(unmapped={k: self._unmapped[k] for k in keys},
                                   notes=self.capabilities.notes + self._ambiguity_note())
        return outs

    def measure_speeds(self, cases: Sequence[Case], sampling: Sampling,
                       levels: Sequence[int]) -> dict[int, Speed]:
        """The workload at each concurrency in turn, against the same running server."""
        base, out = self.options, {}
        try:
            for c in levels:
                self.options = replace(base, concurrency=int(c))
                self.run(cases, sampling)
                assert self.speed is not None
                out[int(c)] = self.speed
        finally:
            self.options = base
        return out

    def close(self) -> None:
        """Nothing is held between requests (one connection per request)."""

    def _warm_up(self, case: Case) -> None:
        """One short request per slot before the clock starts, as the offline side does: shorter
        than a KV block, so nothing of it is served from the prefix cache later."""
        assert self.protocol is not None
        try:
            self._complete(self._body(self._prompt(case, self.protocol, 8), 2, self.protocol),
                           self.protocol.stream)
        except Fault:
            pass  # the timed request will meet (and report) the same problem

    def _set_capabilities(self, **changes: Any) -> None:
        assert self.protocol is not None and self.capabilities is not None
        self.capabilities = replace(self.capabilities, **changes)
        self.protocol = replace(self.protocol, capabilities=self.capabilities)

    # -- text prompts and token texts --------------------------------------------------------
    def _need_model(self, why: str) -> ModelRef:
        if self.model is None:
            raise EngineRefused(f"{self.name}: {why} needs the model's tokenizer (run it through the gate)")
        return self.model

    def _prompt(self, case: Case, proto: Protocol | None, n: int | None = None) -> list[int] | str:
        """The case's prompt as this server takes it: its ids, or the text those ids were made of."""
        ids = list(case.prompt_ids[:n] if n is not None else case.prompt_ids)
        if proto is None or proto.prompts == "ids":
            return ids
        model = self._need_model("sending text prompts")
        if n is None and case.prompt_text and list(model.encode(case.prompt_text)) == ids:
            return case.prompt_text
        return model.decode(ids)

    def _token_texts(self) -> TokenTexts:
        if self._texts is None:
            model = self._need_model("mapping token texts to ids")
            tok = model._tokenizer
            size = (tok.get_vocab_size(with_added_tokens=True) if hasattr(tok, "get_vocab_size")
                    else len(tok))
            self._texts = TokenTexts.for_tokenizer(tok, model.decode, size)
        return self._texts

    def _ambiguity_note(self) -> tuple[str, ...]:
        u = self._unmapped
        resolved = (f"; {u['resolved']} generated texts that several ids share resolved by retokenizing "
                    f"the completion" if u["resolved"] else "")
        if u["ended_unnamed"]:
            resolved += (f"; {u['ended_unnamed']} cases ended on an end-of-generation token the server does "
                         f"not return (one token shorter than an oracle output that includes it)")
        if not (u["generated"] or u["top"] or u["missing"]):
            return ("token texts mapped to ids through the model's tokenizer: every text accounted for"
                    + resolved,)
        shared = ", ".join(f"{t!r} ({n} ids)" for t, n in list(self._token_texts().examples.items())[:5])
        return (f"token texts mapped to ids through the model's tokenizer: {u['generated']} generated and "
                f"{u['top']} top-k texts matched no single id (id {UNMAPPED}: {shared}); {u['missing']} "
                f"top-k entries lost to texts that collided in the server's answer" + resolved,)

    def _verify_tokenization(self, cases: Sequence[Case]) -> dict[str, str]:
        """Read the ids the server makes of every case's text; returns the cases not to send."""
        assert self.protocol is not None
        root = self._root()
        first = self._prompt(cases[0], self.protocol)
        assert isinstance(first, str)
        endpoint = tokenize_endpoint(self._post_json, root, self._served.get("id"), first)
        how = endpoint[0] if endpoint else "echo (token texts)"
        served: dict[str, tuple[int, ...]] = {}
        errors: dict[str, str] = {}
        for case in cases:
            text = self._prompt(case, self.protocol)
            assert isinstance(text, str)
            try:
                ids = endpoint[1](text) if endpoint else self._echo_ids(case, text)
            except Fault as f:
                errors[case.id] = self._redact(f.describe())
            except (ValueError, TypeError, KeyError) as e:
                errors[case.id] = f"{type(e).__name__}: {e}"[:300]
            else:
                served[case.id] = tuple(ids)
        self._set_capabilities(tokenized_by=how, served_prompt_ids=served, tokenize_errors=errors)
        unsent = {cid: f"its tokenization could not be read ({why})" for cid, why in errors.items()}
        for case in cases:
            if case.id in served and served[case.id] != tuple(case.prompt_ids):
                unsent[case.id] = "the server tokenizes this prompt differently (see its tokenizer verdict)"
        return unsent

    def _echo_ids(self, case: Case, text: str) -> list[int]:
        assert self.protocol is not None
        body = self._body(text, 1, self.protocol, logprobs=1, stream=False)
        body["echo"] = True
        reply = self._with_retries(lambda: self._complete(body, False))
        if not reply.lp_tokens:
            raise ValueError("the echo carried no logprob tokens")
        texts = self._token_texts()
        return ids_from_echo(text, reply.lp_tokens, case.prompt_ids, texts, texts.renders)

    # -- one case ----------------------------------------------------------------------------
    def _case(self, case: Case, sampling: Sampling, unsent: str | None = None
              ) -> tuple[Output, float | None, int]:
        assert self.protocol is not None
        if unsent:
            return Output(case.id, (), error=f"not sent: {unsent}"), None, 0
        if self._broken:
            return Output(case.id, (), error=f"not sent: {self._broken}"), None, 0
        body = self._body(self._prompt(case, self.protocol), sampling.max_tokens, self.protocol)
        tries = self.options.retries + 1
        last: Fault | None = None
        for attempt in range(tries):
            try:
                reply = self._complete(body, self.protocol.stream)
                out = self._to_output(case.id, reply, self.protocol)
            except Fault as f:
                last = f
                if f.retryable and attempt + 1 < tries and not self._broken:
                    if (why := self.watch and self.watch()):
                        last = Fault(f"the server exited: {why}", transport=True)
                        self._broken = last.what
                        break
                    time.sleep(min(0.25 * 2**attempt, 4.0))
                    continue
                break
            with self._lock:
                self._failed_in_a_row = 0
            n = len(out.token_ids) or (reply.usage_tokens or 0)
            return out, reply.ttft_s, n
        assert last is not None
        n_att = attempt + 1
        msg = f"{last.describe()} (case {case.id}, {n_att} attempt{'s' * (n_att > 1)})"
        if last.transport:
            with self._lock:
                self._failed_in_a_row += 1
                if self._failed_in_a_row >= self.options.breaker and not self._broken:
                    self._broken = (f"the server stopped answering ({self._failed_in_a_row} cases in a "
                                    f"row failed; last: {last.what})")
        return Output(case.id, (), error=self._redact(msg)), None, 0

    def request_fields(self) -> dict[str, Any]:
        """The sampling fields every request carries (the engine-specific ``body`` ones included)."""
        return {"temperature": 0.0, "seed": 0, **dict(self.options.body)}

    def _body(self, prompt: Sequence[int] | str, max_tokens: int, proto: Protocol | None,
              logprobs: int | None = None, extras: Mapping[str, Any] | None = None,
              stream: bool | None = None) -> dict[str, Any]:
        k = logprobs if logprobs is not None else (proto.logprobs if proto else 0)
        body: dict[str, Any] = {"model": self._served.get("id", self.options.model),
                                "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
                                "max_tokens": max_tokens}
        if k > 0:
            body["logprobs"] = k
        body.update(extras if extras is not None else (proto.extras if proto else {}))
        body.update(self.request_fields())
        if stream if stream is not None else (proto.stream if proto else False):
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    # -- probe -------------------------------------------------------------------------------
    def _probe(self, cases: Sequence[Case], sampling: Sampling) -> Protocol:
        """Find out what this server returns, with the first case that gets an answer (2 tokens)."""
        problems = []
        for case in cases[:3]:
            try:
                return self._probe_one(case, sampling)
            except Fault as f:
                problems.append(f"{case.id}: {self._redact(f.describe())}")
        raise EngineFailed(f"{self.name}: no usable answer from {self.options.base_url} to the probe "
                           f"request:\n  " + "\n  ".join(problems))

    def _probe_one(self, case: Case, sampling: Sampling) -> Protocol:
        k, extras = sampling.logprobs, dict(VLLM_EXTRAS)
        notes: list[str] = []
        reasons: dict[str, str] = {}
        prompts = "text" if self.options.prompts == "text" else "ids"
        shape = Protocol({}, 0, None, False, Capabilities(), False, prompts)
        for _ in range(7):
            # A short prefix: the probe must not leave full KV blocks for the real request to hit.
            prompt = self._prompt(case, replace(shape, prompts=prompts), 8)
            body = self._body(prompt, min(2, sampling.max_tokens), None, k, extras, stream=False)
            try:
                reply = self._with_retries(lambda b=body: self._complete(b, False))
                break
            except Fault as f:
                text = f.excerpt or f.what
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
                    reasons["top_logprobs"] = f"server refuses logprobs ({text[:120]!r})"
                    k = 0
                elif prompts == "ids" and self.options.prompts == "auto" and self.model is not None:
                    why = self._redact(f.describe())[:160]
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
                        f"temperature 0, logprobs={k}): {self._redact(f.describe())}{hint}") from None
        else:
            raise EngineRefused(f"{self.name}: could not agree on a request shape: {'; '.join(notes)}")

        lp_ids = [TOKEN_ID.match(t) for t in reply.lp_tokens]
        top_ids = bool(reply.lp_top) and all(
            isinstance(row, Mapping) and all(TOKEN_ID.match(key) for key in row) for row in reply.lp_top)
        mappable = self._mappable(reply)
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
        sent = self.request_fields()
        has_top = k > 0 and (top_ids or top_from_text)
        caps = Capabilities(token_ids=ids_from is not None, top_logprobs=has_top,
                            logprobs_served=k, logprobs_asked=sampling.logprobs, reasons=reasons,
                            notes=tuple(notes), prompts="text" if prompts == "text" else "ids",
                            ids_from_text=ids_from == "token_text" or top_from_text,
                            request=sent, left_to_server=left_to_server(sent, self._sampling_defaults()))
        return Protocol(extras, k, ids_from, top_ids, caps, self.options.stream, prompts, top_from_text)

    def _mappable(self, reply: _Reply) -> str | None:
        """None when the reply's token texts can be mapped to ids through the model's tokenizer, else
        why not (no model, no token texts, or texts no id of this tokenizer renders as)."""
        if self.model is None:
            return "the model's tokenizer is not at hand"
        if not reply.lp_tokens:
            return "no logprob tokens came back"
        texts = self._token_texts()
        strange = [t for t in reply.lp_tokens if t not in texts.by_text]
        return f"e.g. {strange[0]!r}" if strange else None

    def _sampling_defaults(self) -> dict[str, Any] | None:
        """The completion request's sampling defaults, when the server publishes its schema."""
        try:
            return sampling_defaults(self._get_json("/openapi.json", prefix=self._root()))
        except Fault:
            return None

    def _with_retries(self, fn: Callable[[], _Reply]) -> _Reply:
        for attempt in range(self.options.retries + 1):
            try:
                return fn()
            except Fault as f:
                if not f.retryable or attempt == self.options.retries:
                    raise
                time.sleep(min(0.25 * 2**attempt, 4.0))
        raise AssertionError("unreachable")

    # -- parsing -----------------------------------------------------------------------------
    def _to_output(self, case_id: str, r: _Reply, proto: Protocol) -> Output:
        text = "".join(r.text)
        excerpt = text[:60]
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
            texts = self._token_texts()
            with self._lock:
                ids = [texts.lookup(tok) for tok in r.lp_tokens]
                if UNMAPPED in ids:
                    ids, resolved = self._retokenized(ids, r.lp_tokens, text)
                    self._unmapped["resolved"] += resolved
                self._unmapped["generated"] += sum(t == UNMAPPED for t in ids)
                # stopped, its last token no special one: the end-of-generation token was not shown
                self._unmapped["ended_unnamed"] += (r.finish_reason == "stop"
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
                        excerpt=json.dumps(r.lp_top[:2])[:EXCERPT])
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
                            excerpt=json.dumps(row)[:EXCERPT])
            items = []
            for key, lp in row.items():
                m = TOKEN_ID.match(key)
                if not m or not isinstance(lp, (int, float)):
                    raise Fault(f"top logprob at position {p} is {key!r}: {lp!r}",
                                excerpt=json.dumps(row)[:EXCERPT])
                items.append((int(m.group(1)), float(lp)))
            items.sort(key=lambda x: (-x[1], x[0]))
            top_ids[p] = [t for t, _ in items[:k]]
            top_lps[p] = [v for _, v in items[:k]]
        return Output(case_id, tuple(ids), text, top_ids, top_lps, chosen, r.finish_reason or "")

    def _retokenized(self, ids: list[int], shown: Sequence[str], text: str) -> tuple[list[int], int]:
        """Generated tokens whose text several ids share, resolved where the model's tokenizer makes
        of the completion's text exactly as many tokens, each rendering as the server showed it and
        each agreeing with every id already known: then those ids are the ones the texts spell
        (the tokenizer's, verified identical to the server's on the prompts). Returns (ids, resolved)."""
        if not text:
            return ids, 0
        texts = self._token_texts()
        again = list(self._need_model("mapping token texts").encode(text))
        if len(again) != len(ids) or any(
                (t != UNMAPPED and t != a) or shown[p] not in texts.renders(a) for p, (t, a) in
                enumerate(zip(ids, again, strict=True))):
            return ids, 0
        return again, sum(t == UNMAPPED for t in ids)

    def _text_keyed(self, case_id: str, ids: Sequence[int], text: str, chosen: np.ndarray, r: _Reply,
                    k: int) -> Output:
        """Top-k rows keyed by token text -> ids through the model's tokenizer (see token_text)."""
        texts = self._token_texts()
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
                                excerpt=json.dumps(row)[:EXCERPT])
                known = None
                if p < len(r.lp_tokens) and np.isfinite(chosen[p]):
                    known = (r.lp_tokens[p], float(r.lp_chosen[p]), int(ids[p]))  # type: ignore[arg-type]
                m = texts.map_row(row, k, known)
                top_ids[p], top_lps[p] = m.ids, m.logprobs
                self._unmapped["top"] += m.ambiguous
                self._unmapped["missing"] += m.missing
        return Output(case_id, tuple(ids), text, top_ids, top_lps, chosen, r.finish_reason or "")

    # -- HTTP --------------------------------------------------------------------------------
    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.options.timeout_s)

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if key := os.environ.get(self.options.key_env):
            h["Authorization"] = f"Bearer {key}"
        return h

    def _open(self, method: str, path: str, body: Mapping[str, Any] | None,
              prefix: str | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connect()
        url = (self._prefix if prefix is None else prefix) + path
        try:
            conn.request(method, url, body=json.dumps(body) if body is not None else None,
                         headers=self._headers())
            resp = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise Fault(f"no answer within {self.options.timeout_s:g} s (server hung?)", retryable=True,
                        transport=True) from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise Fault(f"cannot reach {self._host}:{self._port}: {type(e).__name__}: {e}", retryable=True,
                        transport=True) from None
        if resp.status >= 400:
            try:
                text = resp.read(4096).decode(errors="replace")
            except (OSError, http.client.HTTPException):
                text = ""
            conn.close()
            raise Fault(f"HTTP {resp.status}", excerpt=self._excerpt(text),
                        retryable=resp.status >= 500 or resp.status in (408, 429), status=resp.status)
        return conn, resp

    def _root(self) -> str:
        """The server's root path (the base URL without ``/v1``)."""
        return self._prefix[: -len("/v1")] if self._prefix.endswith("/v1") else self._prefix

    def _post_json(self, path: str, body: Mapping[str, Any], prefix: str | None = None) -> Any:
        conn, resp = self._open("POST", path, body, prefix)
        try:
            raw = self._read(resp)
        finally:
            conn.close()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise Fault(f"POST {path}: malformed JSON", excerpt=self._excerpt(raw)) from None

    def _get_json(self, path: str, prefix: str | None = None) -> Any:
        conn, resp = self._open("GET", path, None, prefix)
        try:
            raw = self._read(resp)
        finally:
            conn.close()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise Fault(f"GET {path}: malformed JSON", excerpt=self._excerpt(raw)) from None

    def _read(self, resp: http.client.HTTPResponse) -> str:
        try:
            return resp.read().decode(errors="replace")
        except TimeoutError:
            raise Fault(f"response stalled for {self.options.timeout_s:g} s (server hung?)",
                        retryable=True, transport=True) from None
        except (OSError, http.client.HTTPException) as e:
            raise Fault(f"connection dropped mid-response: {type(e).__name__}", retryable=True,
                        transport=True) from None

    def _complete(self, body: Mapping[str, Any], stream: bool) -> _Reply:
        t_sent = time.perf_counter()
        deadline = time.monotonic() + self.options.request_timeout_s
        conn, resp = self._open("POST", "/completions", body)
        reply = _Reply()
        try:
            if not stream:
                raw = self._read(resp)
                try:
                    data = json.loads(raw)
                except json.JSONDecodeError:
                    raise Fault("malformed JSON", excerpt=self._excerpt(raw)) from None
                if not isinstance(data, Mapping):
                    raise Fault("response is not a JSON object", excerpt=self._excerpt(raw))
                self._check_error(data)
                self._feed(reply, data, t_sent, raw)
                if reply.ttft_s is not None:
                    reply.ttft_s = None  # not streamed: the first token's time is unknown
                return reply
            done = False
            for payload in self._events(resp, deadline):
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(payload)
                except json.JSONDecodeError:
                    raise Fault("malformed JSON in the stream", excerpt=self._excerpt(payload)) from None
                if not isinstance(chunk, Mapping):
                    raise Fault("stream event is not a JSON object", excerpt=self._excerpt(payload))
                self._check_error(chunk)
                self._feed(reply, chunk, t_sent, payload)
            if not done and reply.finish_reason is None:
                n = len(reply.token_ids or reply.lp_tokens)
                raise Fault(f"the stream ended after {n} tokens without finishing (server died?)",
                            retryable=True, transport=True)
            return reply
        finally:
            conn.close()

    def _events(self, resp: http.client.HTTPResponse, deadline: float) -> Iterator[str]:
        """The ``data:`` payloads of a server-sent-events stream."""
        while True:
            if time.monotonic() > deadline:
                raise Fault(f"request took longer than {self.options.request_timeout_s:g} s",
                            retryable=True, transport=True)
            try:
                line = resp.readline()
            except TimeoutError:
                raise Fault(f"stream stalled for {self.options.timeout_s:g} s (server hung?)",
                            retryable=True, transport=True) from None
            except (OSError, http.client.HTTPException) as e:
                raise Fault(f"connection dropped mid-stream: {type(e).__name__}", retryable=True,
                            transport=True) from None
            if not line:
                return
            text = line.decode(errors="replace").strip()
            if text.startswith("data:"):
                yield text[5:].strip()
            elif text and not text.startswith(":") and not text.startswith(("event:", "id:", "retry:")):
                raise Fault("malformed stream line (not server-sent events)", excerpt=self._excerpt(text))

    def _feed(self, reply: _Reply, obj: Mapping[str, Any], t_sent: float, raw: str) -> None:
        try:
            reply.feed(obj, t_sent)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise Fault(f"unexpected response shape ({type(e).__name__}: {e})",
                        excerpt=self._excerpt(raw)) from None

    def _check_error(self, obj: Mapping[str, Any]) -> None:
        err = obj.get("error")
        if err:
            code = err.get("code") if isinstance(err, Mapping) else None
            status = code if isinstance(code, int) else 0
            raise Fault(f"server error{f' {status}' if status else ''}",
                        excerpt=self._excerpt(json.dumps(err)), retryable=status >= 500, status=status)
        if isinstance(obj.get("system_fingerprint"), str):
            self._fingerprint = obj["system_fingerprint"]

    def _excerpt(self, text: str) -> str:
        return self._redact(text.strip()[:EXCERPT])

    def _redact(self, text: str) -> str:
        key = os.environ.get(self.options.key_env)
        return text.replace(key, "***") if key else text


@ENGINES.register("openai", help="an OpenAI-compatible server "
                           "(openai:http://127.0.0.1:8000,c=8,key_env=MY_KEY)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> OpenAIRunner:
    return OpenAIRunner(parse_openai_spec(spec, arg, ctx.concurrency or 1), name=ctx.name or spec,
                        model=model)
