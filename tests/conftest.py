"""Shared fixtures: synthetic outputs for unit tests, a private copy of the workspace, and the
session's engine pool."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from harness.api import Case, Output
from harness.engines.vllm.pool import EnginePool, pooled
from harness.workspace import REPO_ROOT, Workspace

# No per-example deadline: on a 2-core runner shared with engine starts an example that takes 20 ms
# alone takes 500 ms, and Hypothesis reports that as a flaky failure of the property, not of the host.
settings.register_profile("harness", deadline=None)
settings.load_profile("harness")


@pytest.fixture(scope="session", autouse=True)
def engine_pool() -> Iterator[EnginePool]:
    """One live vLLM engine per (interpreter, model, engine settings, environment) for the whole
    session (:mod:`harness.engines.vllm.pool`): any test that runs the pinned vLLM through the harness
    (``run_gate``, ``VLLMRunner``, ``harness.cli.main``) in this process shares it; the first
    workload of a configuration starts it. A test about a fresh engine wraps its run in
    ``harness.engines.vllm.pool.unpooled()``. Engines configured per run (a KV connector's store,
    invariance groups, servers) and harness child processes start their own."""
    with pooled() as pool:
        yield pool


def make_output(case_id: str, tokens: list[int], k: int = 5, gap: float = 2.0,
                seed: int = 0) -> Output:
    """An oracle-like output: at each position the chosen token is top-1, the runner-up is
    ``gap`` nats behind, the rest further."""
    rng = np.random.default_rng(seed)
    t = len(tokens)
    top_ids = np.zeros((t, k), np.int32)
    top_lps = np.zeros((t, k), np.float32)
    for i, tok in enumerate(tokens):
        others = [x for x in rng.permutation(500).tolist() if x != tok][: k - 1]
        top_ids[i] = [tok, *others]
        top_lps[i] = [-0.1, -0.1 - gap, *(-0.1 - gap - 1.0 - np.arange(k - 2))]
    return Output(case_id, tuple(tokens), "", top_ids, top_lps, top_lps[:, 0].copy(), "length")


def make_case(case_id: str = "c01") -> Case:
    return Case(case_id, (1, 2, 3), "abc")


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    """A private copy of suites/, models/ and goldens/: tests write records and goldens there."""
    for sub in ("suites", "models", "goldens"):
        shutil.copytree(REPO_ROOT / sub, tmp_path / sub)
    return Workspace(tmp_path)
