"""``vllmcpp-server``: vllm.cpp's own OpenAI server, built from the user's source, started on
127.0.0.1 and a free port and stopped with the run.

The build and the weights are the ``vllmcpp`` candidate's (:mod:`harness.engines.vllmcpp`: the same
cache, the same BF16 copy or GGUF); the server is ``build/examples/server``. What it takes and
returns at the source this was written for, and what the harness does about it:

* ``/v1/completions`` takes a **string prompt only**, and a token-id prompt stops its engine (every
  later request answers HTTP 500): the harness declares the server text-only, so no token-id
  prompt is ever sent to it (``openai:`` pointed at such a server finds out the hard way, and says
  which request killed it: :mod:`harness.engines.openai.probe`);
* it returns text only (no ``token_ids``, no logprobs, ``echo`` ignored) and has no tokenize
  endpoint: strict compares text (:mod:`harness.compare.strict_text`), and the server's
  tokenization is read through the harness's worker on the same build — the engine's own input
  processor, the code path the server's requests take — and the record says so.

Options: those of ``vllmcpp`` (``src``, ``gguf``, ``dtype``, ``num_blocks``, ``max_num_seqs``,
``block_size``), ``c=N`` (requests in flight) and ``prompts=auto`` (send token ids first, as a
generic OpenAI client would: the record then names the request that killed the engine).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.abilities import Endpoint
from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.device import device_block
from harness.engines.base import ENGINES, NoTensors, RunnerContext, parse_options
from harness.engines.loopback import LoopbackServer
from harness.engines.openai import OpenAIOptions, OpenAIRunner
from harness.engines.vllmcpp import ENGINE_OPTIONS, VllmCppRunner
from harness.models import ModelRef
from harness.speed import Speed

START_TIMEOUT_S = float(os.environ.get("HARNESS_VLLMCPP_START_TIMEOUT_S", "600"))
TOKENIZED_BY = ("the engine's input processor, read through the harness's worker on the same build "
                "(the server has no tokenize endpoint and ignores echo)")
SERVER_FLAGS = {"num_blocks": "--num-blocks", "max_num_seqs": "--max-num-seqs", "block_size": "--block-size"}


class VllmCppServer(LoopbackServer):
    label = "vllm.cpp server"
    kind = "vllmcpp-server"
    health_path = "/health"

    def __init__(self, binary: Path, model_path: Path, served_name: str, flags: Mapping[str, int],
                 log_path: Path | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        super().__init__(log_path=log_path, start_timeout_s=start_timeout_s)
        self.binary, self.model_path, self.model_name = binary, model_path, served_name
        self.flags = dict(flags)

    def command(self) -> list[str]:
        out = [str(self.binary), "--model", str(self.model_path), "--served-model-name", self.model_name,
               "--host", self.host, "--port", str(self.port)]
        for key, value in self.flags.items():
            out += [SERVER_FLAGS[key], str(value)]
        return out


class VllmCppServerRunner(NoTensors):
    """vllm.cpp's server as a candidate (see module doc)."""

    tensors_why_not = "vllm.cpp's server answers text over HTTP, never its hidden states"

    def __init__(self, model: ModelRef, options: Mapping[str, str], name: str,
                 run_dir: Path | None = None, concurrency: int = 1) -> None:
        opts = dict(options)
        try:
            self.concurrency = int(opts.pop("c", concurrency))
        except ValueError:
            raise EngineRefused(f"candidate {name!r}: c must be a whole number") from None
        self.prompts = opts.pop("prompts", "text")
        if self.prompts not in ("text", "auto"):
            raise EngineRefused(f"candidate {name!r}: prompts={self.prompts!r}; valid: text (default: the "
                                f"server takes string prompts only), auto (try token ids first, as "
                                f"openai: does; it stops vllm.cpp's engine at d85906ae)")
        self.engine = VllmCppRunner(model, opts, name, run_dir=run_dir)
        self.name, self.model, self.run_dir = name, model, run_dir
        self.server: VllmCppServer | None = None
        self.client: OpenAIRunner | None = None
        self.timings: dict[str, float] = {}

    def endpoint(self) -> Endpoint:
        """The ServesOpenAI ability (``make api CANDIDATE=vllmcpp-server``): the server this runner
        started, so the API gate may send it requests that might kill it."""
        assert self.server is not None, "start() first"
        return Endpoint(self.server.base_url + "/v1", self.model.name, managed=True)

    def preflight(self) -> None:
        """The Preflight ability: the engine's own (the source exists)."""
        self.engine.preflight()

    def info(self) -> EngineInfo:
        inner = self.engine.info()
        settings: dict[str, Any] = {**inner.settings, "route": "/v1/completions",
                                    "concurrency": self.concurrency, "prompts": self.prompts}
        return EngineInfo(self.name, "vllm.cpp server", inner.version, settings=settings,
                          environment=inner.environment)

    def start(self) -> None:
        self.engine.start()
        assert self.engine.build is not None
        log = Path(tempfile.mkdtemp(prefix="vllmcpp-server-", dir=self.run_dir)) / "server.log" \
            if self.run_dir is not None else None
        flags = {k: v for k, v in self.engine.engine_opts.items() if k in ENGINE_OPTIONS}
        self.server = VllmCppServer(self.engine.build.server, self.engine.model_path, self.model.name, flags,
                                    log_path=log)
        try:
            self.server.start()
        except EngineFailed:
            self.server.stop()
            raise
        self.timings["server_start_s"] = float(self.server.start_s or 0.0)

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        assert self.server is not None, "start() first"
        served = self._tokenizations(cases)
        by_text = {self.engine.prompt_text(c): served[c.id] for c in cases if c.id in served}

        def tokenize(text: str) -> list[int]:
            if text not in by_text:
                raise ValueError("the worker returned no tokenization of this text")
            return list(by_text[text])

        opts = OpenAIOptions(self.server.base_url + "/v1", self.concurrency, model=self.model.name,
                             prompts=self.prompts)
        self.client = OpenAIRunner(opts, name=self.name, watch=self.server.exited, model=self.model,
                                   tokenize=(TOKENIZED_BY, tokenize))
        self.client.start()
        outs = self.client.run(cases, sampling)
        self.timings.update(self.client.timings)
        return outs

    def _tokenizations(self, cases: Sequence[Case]) -> dict[str, tuple[int, ...]]:
        """case id -> the prompt ids the engine makes of the case's text (one worker run, 1 token)."""
        self.engine.run(cases, Sampling(max_tokens=1, logprobs=0))
        return dict(self.engine.served)

    def facts(self) -> RunFacts:
        client = self.client.facts() if self.client else RunFacts()
        speed: Speed | None = client.speed
        return RunFacts(timings=dict(self.timings), speed=speed, capabilities=client.capabilities,
                        device=device_block("cpu") if self.client else {})

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


@ENGINES.register("vllmcpp-server", help="vllm.cpp's OpenAI server, built from its source on first use, "
                                         "started and stopped by the harness (vllmcpp-server:src=PATH)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> VllmCppServerRunner:
    return VllmCppServerRunner(model, parse_options(arg, spec), ctx.name or spec, run_dir=ctx.run_dir,
                               concurrency=ctx.concurrency or 1)
