"""The :class:`~harness.api.Runner` over HTTP: wait for the server, probe it, send every case (``c`` in
flight, retries, a breaker when the server stops answering), and keep what the record needs."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from harness.abilities import Endpoint
from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.capabilities import Capabilities
from harness.engines.base import NoTensors
from harness.engines.openai.options import OpenAIOptions
from harness.engines.openai.probe import Prober
from harness.engines.openai.reply import ReplyDecoder, ServerProtocol
from harness.engines.openai.sampler import OpenAISampling
from harness.engines.openai.server_text import ids_from_echo, tokenize_endpoint
from harness.engines.openai.transport import Fault, Transport
from harness.excerpt import clip
from harness.models import ModelRef
from harness.speed import Speed

PREFLIGHT_S = 5.0
"""Seconds the preflight waits for ``/v1/models`` (a refused connection fails at once)."""


class OpenAIRunner(NoTensors, OpenAISampling):
    """A candidate reached over HTTP. ``watch`` (optional) says why the server died, if it did.
    It also draws samples with the server's own sampler (:mod:`.sampler`)."""

    tensors_why_not = "an OpenAI-compatible server answers tokens and logprobs, never its hidden states"

    def __init__(self, options: OpenAIOptions, name: str = "openai",
                 watch: Callable[[], str | None] | None = None, model: ModelRef | None = None,
                 tokenize: tuple[str, Callable[[str], Sequence[int]]] | None = None) -> None:
        self.name = name
        self.tokenize = tokenize
        """(how, text -> ids): where the server's tokenization is read when the runner that started
        it knows better than the server's endpoints (a server without a tokenize endpoint)."""
        self.options = options
        self.watch = watch
        self.model = model
        """The model under test: its tokenizer turns text prompts and token texts into ids."""
        self.http = Transport(options)
        self.decoder = ReplyDecoder(name, model)
        self.timings: dict[str, float] = {}
        self.speed: Speed | None = None
        self.capabilities: Capabilities | None = None
        self.protocol: ServerProtocol | None = None
        self._served: dict[str, Any] = {}
        self._version = "unknown"
        self._lock = threading.Lock()
        self._failed_in_a_row = 0
        self._broken: str | None = None

    # -- contract ----------------------------------------------------------------------------
    def info(self) -> EngineInfo:
        env = self.options.settings()
        settings = {"model": self._served.get("id", self.options.model),
                    "concurrency": env.pop("concurrency"), "stream": env.pop("stream"),
                    "prompts": env.pop("prompts"), "body": env.pop("body")}
        env.pop("model", None)
        if self.http.fingerprint:
            env["system_fingerprint"] = self.http.fingerprint
        if self.protocol is not None:
            env["protocol"] = self.protocol.to_json()
        return EngineInfo(self.name, str(self._served.get("owned_by") or "openai-compatible"),
                          self._version, settings=settings, environment=env)

    def facts(self) -> RunFacts:
        return RunFacts(timings=dict(self.timings), speed=self.speed, capabilities=self.capabilities)

    def endpoint(self) -> Endpoint:
        """The ServesOpenAI ability: the user's server, probed with requests that might kill it only
        with ``probe=yes``."""
        return Endpoint(self.options.base_url, self._served.get("id", self.options.model),
                        managed=self.options.probe, key_env=self.options.key_env, body=self.options.body)

    def preflight(self) -> None:
        """The Preflight ability: the key variable when named, and one ``/v1/models`` request with a
        short timeout — a refused connection or an unknown host is refused now (a server that answers
        anything, even an error, is left to ``start`` and its ``wait``)."""
        o = self.options
        if o.key_required and not os.environ.get(o.key_env):
            raise EngineRefused(f"{self.name}: environment variable {o.key_env} (key_env) is not set")
        quick = Transport(replace(o, timeout_s=min(o.timeout_s, PREFLIGHT_S), retries=0))
        try:
            quick.get_json("/models")
        except Fault as f:
            if f.transport:
                raise EngineRefused(f"{self.name}: nothing answers at {o.base_url}/models "
                                    f"({quick.redact(f.describe())}); start the server or fix the URL"
                                    ) from None

    def start(self) -> None:
        """Wait for ``/v1/models`` (``wait`` seconds), pick the served model, read the version."""
        o = self.options
        if o.key_required and not os.environ.get(o.key_env):
            raise EngineRefused(f"{self.name}: environment variable {o.key_env} (key_env) is not set")
        t0 = time.perf_counter()
        deadline = time.monotonic() + o.wait_s
        while True:
            try:
                body = self.http.get_json("/models")
                break
            except Fault as f:
                if not f.retryable:
                    raise EngineFailed(f"{self.name}: {o.base_url}/models answered "
                                       f"{self.http.redact(f.describe())}") from None
                if time.monotonic() > deadline:
                    raise EngineFailed(f"{self.name}: {o.base_url}/models did not answer within "
                                       f"{o.wait_s:.0f} s: {self.http.redact(f.describe())}") from None
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
            v = self.http.get_json("/version", prefix=self.http.root())
            self._version = str(v.get("version", "unknown")) if isinstance(v, Mapping) else "unknown"
        except Fault:
            pass
        self.timings["wait_s"] = time.perf_counter() - t0

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        if not cases:
            return []
        t0 = time.perf_counter()
        prober = Prober(self.name, self.options, self.http, self.decoder, self._model_id())
        self.protocol = prober.probe(cases, sampling)
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
            self._set_capabilities(unmapped={k: self.decoder.unmapped[k] for k in keys},
                                   notes=self.capabilities.notes + self.decoder.ambiguity_note())
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

    def request_fields(self) -> dict[str, Any]:
        """The sampling fields every request carries (the engine-specific ``body`` ones included)."""
        return self.options.request_fields()

    # -- requests ----------------------------------------------------------------------------
    def _model_id(self) -> str | None:
        return self._served.get("id", self.options.model)

    def _body(self, prompt: Sequence[int] | str, max_tokens: int, proto: ServerProtocol,
              logprobs: int | None = None, stream: bool | None = None) -> dict[str, Any]:
        k = proto.logprobs if logprobs is None else logprobs
        return self.options.completion_body(self._model_id(), prompt, max_tokens, k, proto.extras,
                                            proto.stream if stream is None else stream)

    def _warm_up(self, case: Case) -> None:
        """One short request per slot before the clock starts, as the offline side does: shorter
        than a KV block, so nothing of it is served from the prefix cache later."""
        assert self.protocol is not None
        try:
            self.http.complete(self._body(self.decoder.prompt(case, self.protocol, 8), 2, self.protocol),
                               self.protocol.stream)
        except Fault:
            pass  # the timed request will meet (and report) the same problem

    def _set_capabilities(self, **changes: Any) -> None:
        assert self.protocol is not None and self.capabilities is not None
        self.capabilities = replace(self.capabilities, **changes)
        self.protocol = replace(self.protocol, capabilities=self.capabilities)

    def _verify_tokenization(self, cases: Sequence[Case]) -> dict[str, str]:
        """Read the ids the server makes of every case's text; returns the cases not to send."""
        assert self.protocol is not None
        first = self.decoder.prompt(cases[0], self.protocol)
        assert isinstance(first, str)
        endpoint = self.tokenize or tokenize_endpoint(self.http.post_json, self.http.root(),
                                                      self._served.get("id"), first)
        how = endpoint[0] if endpoint else "echo (token texts)"
        served: dict[str, tuple[int, ...]] = {}
        errors: dict[str, str] = {}
        for case in cases:
            text = self.decoder.prompt(case, self.protocol)
            assert isinstance(text, str)
            try:
                ids = endpoint[1](text) if endpoint else self._echo_ids(case, text)
            except Fault as f:
                errors[case.id] = self.http.redact(f.describe())
            except (ValueError, TypeError, KeyError) as e:
                errors[case.id] = clip(f"{type(e).__name__}: {e}")
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
        reply = self.http.with_retries(lambda: self.http.complete(body, False))
        if not reply.lp_tokens:
            raise ValueError("the echo carried no logprob tokens")
        texts = self.decoder.token_texts()
        return ids_from_echo(text, reply.lp_tokens, case.prompt_ids, texts, texts.renders)

    # -- one case ----------------------------------------------------------------------------
    def _case(self, case: Case, sampling: Sampling, unsent: str | None = None
              ) -> tuple[Output, float | None, int]:
        assert self.protocol is not None
        if unsent:
            return Output(case.id, (), error=f"not sent: {unsent}"), None, 0
        if self._broken:
            return Output(case.id, (), error=f"not sent: {self._broken}"), None, 0
        body = self._body(self.decoder.prompt(case, self.protocol), sampling.max_tokens, self.protocol)
        tries = self.options.retries + 1
        last: Fault | None = None
        for attempt in range(tries):
            try:
                reply = self.http.complete(body, self.protocol.stream)
                out = self.decoder.to_output(case.id, reply, self.protocol)
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
        return Output(case.id, (), error=self.http.redact(msg)), None, 0
