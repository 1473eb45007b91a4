"""``vllmcpp-server``: vllm.cpp's own OpenAI server, built from the user's source, started on
127.0.0.1 and a free port and stopped with the run.

The build and the weights are the ``vllmcpp`` candidate's (:mod:`harness.engines.vllmcpp.runner`: the same
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.api import Case, EngineInfo, EngineRefused, Output, Sampling
from harness.engines.base import ENGINES, RunnerContext, parse_options
from harness.engines.launch.loopback import LoopbackServer
from harness.engines.openai import OpenAIOptions
from harness.engines.openai.managed import ManagedServerRunner
from harness.engines.vllmcpp.runner import ENGINE_OPTIONS, VllmCppRunner
from harness.models import ModelRef

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


class VllmCppServerRunner(ManagedServerRunner):
    """vllm.cpp's server as a candidate (see module doc)."""

    tensors_why_not = "vllm.cpp's server answers text over HTTP, never its hidden states"

    def __init__(self, model: ModelRef, options: Mapping[str, str], name: str,
                 run_dir: Path | None = None, concurrency: int = 1) -> None:
        super().__init__(model, options, name, run_dir, concurrency)
        opts = self.options
        self.prompts = opts.pop("prompts", "text")
        if self.prompts not in ("text", "auto"):
            raise EngineRefused(f"candidate {name!r}: prompts={self.prompts!r}; valid: text (default: the "
                                f"server takes string prompts only), auto (try token ids first, as "
                                f"openai: does; it stops vllm.cpp's engine at d85906ae)")
        self.engine = VllmCppRunner(model, opts, name, run_dir=run_dir)

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
        flags = {k: v for k, v in self.engine.engine_opts.items() if k in ENGINE_OPTIONS}
        self.start_server(VllmCppServer(self.engine.build.server, self.engine.model_path, self.model.name,
                                        flags, log_path=self.server_log("vllmcpp-server-")))

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        assert self.server is not None, "start() first"
        served = self._tokenizations(cases)
        by_text = {self.engine.prompt_text(c): served[c.id] for c in cases if c.id in served}

        def tokenize(text: str) -> list[int]:
            if text not in by_text:
                raise ValueError("the worker returned no tokenization of this text")
            return list(by_text[text])

        opts = OpenAIOptions(self.base_url, self.concurrency, model=self.model.name, prompts=self.prompts)
        self.connect(opts, tokenize=(TOKENIZED_BY, tokenize))
        return super().run(cases, sampling)

    def _tokenizations(self, cases: Sequence[Case]) -> dict[str, tuple[int, ...]]:
        """case id -> the prompt ids the engine makes of the case's text (one worker run, 1 token)."""
        self.engine.run(cases, Sampling(max_tokens=1, logprobs=0))
        return dict(self.engine.served)



@ENGINES.register("vllmcpp-server", help="vllm.cpp's OpenAI server, built from its source on first use, "
                                         "started and stopped by the harness (vllmcpp-server:src=PATH)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> VllmCppServerRunner:
    return VllmCppServerRunner(model, parse_options(arg, spec), ctx.name or spec, run_dir=ctx.run_dir,
                               concurrency=ctx.concurrency or 1)
