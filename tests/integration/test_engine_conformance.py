"""The started half of the engine conformance kit (:func:`harness.engines.conformance.full`) on every
registered engine: the ones installed in the project's venv start, answer two cases of tiny-llama's
smoke suite, report their device, stop twice and leave no process; every other engine is a skip that
says why. tests/unit/test_engine_conformance.py runs the contract half on all of them, and proves on
planted doubles that both halves bite.

The pinned vLLM runs pooled (tests/conftest.py): it shares tiny-llama's default engine with the
tests beside it in SHARED_ENGINE_ORDER, so the kit adds no engine start of its own; the pool's
engines are the processes a runner may leave behind by design."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import ENGINES, RunnerContext
from harness.engines.conformance import full
from harness.engines.vllm.pool import EnginePool
from harness.models import resolve_model
from harness.suites import find_suite
from harness.workspace import Workspace

STARTED = {"vllm": "vllm", "hf": "hf"}
"""Engine -> the spec the kit starts: the engines the project's venv holds, cheap to start."""
NOT_STARTED = {
    "vllm-server": "a second vLLM start (its OpenAI server, about a minute on 2 cores); "
                   "tests/integration/test_openai_vllm_server.py starts it",
    "vllm-server@": "another vLLM release's venv (3.3 GiB, installed on first use): -m vllm_matrix",
    "vllm@": "another vLLM release's venv (3.3 GiB, installed on first use): -m vllm_matrix",
    "llamacpp": "llama.cpp compiled from source on first use (minutes): tests/integration/test_llamacpp.py",
    "ct2": "its venv is installed from PyPI on first use: -m cpu_engines",
    "ortgenai": "its venv is installed from PyPI on first use: -m cpu_engines",
    "openvino": "its venv is installed from PyPI on first use: -m cpu_engines",
    "mistralrs": "its venv is installed from PyPI on first use: -m cpu_engines",
    "vllmcpp": "needs vllm.cpp's source (HARNESS_VLLMCPP_SRC): tests/integration/test_vllmcpp.py",
    "vllmcpp-server": "needs vllm.cpp's source (HARNESS_VLLMCPP_SRC): tests/integration/test_vllmcpp.py",
    "openai": "needs a server's URL: the vllm-server and llamacpp candidates run through it",
    "cmd": "needs a program: tests/unit/test_cmd_runner.py runs examples/cmd_engine.py",
}


@pytest.mark.parametrize("name", ENGINES.names())
def test_every_installed_engine_starts_answers_and_stops_clean(name: str, engine_pool: EnginePool,
                                                             tmp_path: Path) -> None:
    if name not in STARTED:
        pytest.skip(NOT_STARTED.get(name, f"{name} is new: add it to STARTED (installed in the project's "
                                          f"venv and cheap to start) or NOT_STARTED (why not) here"))
    ws = Workspace.default()
    model = resolve_model("tiny-llama", ws)
    suite = find_suite(ws.suites, "smoke")
    cases = suite.build_cases(model.encode, model.limits)[:2]
    out = full(STARTED[name], model, cases, suite.sampling, RunnerContext(run_dir=tmp_path),
               spared=lambda: [e.proc.pid for e in engine_pool.engines.values()])
    assert out.refused is None, f"{name} did not run on tiny-llama: {out.refused}"
    assert out.problems == []
    assert [o.error for o in out.outputs] == [None, None]
