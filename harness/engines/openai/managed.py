"""An OpenAI-compatible server the harness starts itself, on loopback, and always stops: what the
managed-server engines share (``vllm-server``, ``llamacpp``, ``vllmcpp-server``).

A subclass brings its :class:`~harness.engines.launch.loopback.LoopbackServer` (the command line),
its settings and its :meth:`info`; :class:`ManagedServerRunner` starts the server (a server that
fails to start is stopped, whole group, before the failure goes on), connects one
:class:`~harness.engines.openai.runner.OpenAIRunner` to it, runs cases and speed levels through
that client, hands the API gate its endpoint and stops the server on ``close``. A server that
can replay a workload at several concurrencies adds :class:`ServerSpeedLevels` (the
:class:`~harness.abilities.SpeedLevels` ability, which the pipeline asks with ``isinstance``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.abilities import Endpoint
from harness.api import Case, EngineFailed, EngineRefused, Output, RunFacts, Sampling
from harness.device import device_block
from harness.engines.base import NoTensors
from harness.engines.launch.loopback import LoopbackServer
from harness.engines.openai.options import OpenAIOptions
from harness.engines.openai.runner import OpenAIRunner
from harness.models import ModelRef
from harness.speed import Speed


class ManagedServerRunner(NoTensors):
    """A candidate served by a server this runner starts and stops (see module doc)."""

    body: Mapping[str, Any] = MappingProxyType({})
    """Request fields the engine needs on every request (named in the endpoint)."""

    def __init__(self, model: ModelRef, options: Mapping[str, str], name: str, run_dir: Path | None,
                 concurrency: int) -> None:
        """``options`` loses ``c`` (requests in flight; ``concurrency`` when absent): the rest is the
        subclass's, in :attr:`options`."""
        self.name, self.model, self.run_dir = name, model, run_dir
        self.options = dict(options)
        try:
            self.concurrency = int(self.options.pop("c", concurrency))
        except ValueError:
            raise EngineRefused(f"candidate {name!r}: c must be a whole number") from None
        self.server: LoopbackServer | None = None
        self.client: OpenAIRunner | None = None
        self.timings: dict[str, float] = {}

    def server_log(self, prefix: str) -> Path | None:
        """Where the server writes its log: a fresh folder in the run folder (None: no run folder)."""
        if self.run_dir is None:
            return None
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.run_dir)) / "server.log"

    def start_server(self, server: LoopbackServer) -> None:
        """Start ``server``; one that fails is stopped before the failure goes on."""
        self.server = server
        try:
            server.start()
        except EngineFailed:
            server.stop()
            raise
        self.timings["server_start_s"] = float(server.start_s or 0.0)

    def connect(self, options: OpenAIOptions,
                tokenize: tuple[str, Callable[[str], Sequence[int]]] | None = None) -> OpenAIRunner:
        """The client of the started server, started (it waits for the server's model list)."""
        assert self.server is not None, "start_server() first"
        self.client = OpenAIRunner(options, name=self.name, watch=self.server.exited, model=self.model,
                                   tokenize=tokenize)
        self.client.start()
        return self.client

    @property
    def base_url(self) -> str:
        assert self.server is not None, "start() first"
        return self.server.base_url + "/v1"

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        assert self.client is not None, "start() first"
        outs = self.client.run(cases, sampling)
        self.timings.update(self.client.timings)
        return outs

    def endpoint(self) -> Endpoint:
        """The ServesOpenAI ability: the server this runner started (``start`` first), so the API
        gate may send it requests that might kill it."""
        return Endpoint(self.base_url, self.model.name, managed=True, body=tuple(self.body.items()))

    def device(self) -> dict[str, Any]:
        """The device block of the record (empty before the client ran)."""
        return device_block("cpu") if self.client else {}

    def facts(self) -> RunFacts:
        client = self.client.facts() if self.client else RunFacts()
        return RunFacts(timings=dict(self.timings), speed=client.speed, capabilities=client.capabilities,
                        device=self.device())

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


class ServerSpeedLevels:
    """The SpeedLevels ability of a managed server, through its client (mixed in before
    :class:`ManagedServerRunner`)."""

    client: OpenAIRunner | None

    def measure_speeds(self, cases: Sequence[Case], sampling: Sampling,
                       levels: Sequence[int]) -> dict[int, Speed]:
        assert self.client is not None, "start() first"
        return self.client.measure_speeds(cases, sampling, levels)
