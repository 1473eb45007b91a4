"""Every test here is an ``integration`` test (real engines: minutes, not seconds), whether or not its
module says so: ``-m "not integration"`` and ``make test-unit`` (tests/unit) leave the same tests out.

The modules that share a pooled engine run next to each other (:data:`SHARED_ENGINE_ORDER`), the rest
after them in their usual order. The session's engine pool keeps ``free memory / 3 GiB`` engines (one
on a 7 GiB CI runner), least recently used out first: in alphabetical order a test between two users
of one configuration pushed its engine out, and the second user started it again.

Under pytest-xdist (``make test`` runs this tier with ``-n auto --dist loadfile``) a module is one
unit of work, so its module-scoped engines start once, and the pool's users sharing an engine are one unit
(:data:`POOL_GROUPS`), in that order, on one worker with one pool. An engine start is mostly one
thread's work (imports, tracing, loading), so two workers on two cores overlap their starts."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

SHARED_ENGINE_ORDER = (
    # tiny-llama, every logprob allowed (max_logprobs=-1): whole distributions, then ab_smoke's arm A
    "test_full_vocab_vllm.py",
    "test_ab.py",
    # tiny-llama, default settings; test_gate_smoke last: its refused configuration's start pushes
    # the default engine out of a one-engine pool
    "test_engine_pool.py",
    "test_engine_conformance.py",
    "test_openai_vllm_server.py",
    "test_speed.py",
    "test_gate_smoke.py",
    # tiny-llama, default settings, through `harness matrix` in this process
    "test_matrix.py",
)
POOL_GROUPS = {"test_full_vocab_vllm.py": "full-vocab", "test_ab.py": "full-vocab"}
"""The pool's users in two units of work: the full-vocabulary engine's and the default engine's
(every other module of :data:`SHARED_ENGINE_ORDER`); the two share no engine, so each worker can
take one."""


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the pool's users grouped: a module is one unit of work (its
    module-scoped engines start once), and the modules of :data:`SHARED_ENGINE_ORDER` that share an
    engine are one unit (:data:`POOL_GROUPS`), in that order, on one worker with one engine pool."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            name = Path(path).name
            if name in SHARED_ENGINE_ORDER:
                return POOL_GROUPS.get(name, "default-engine")
            return path

    return ByModule(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in item.path.parents]
    for item in ours:
        item.add_marker(pytest.mark.integration)
    rank = {name: i for i, name in enumerate(SHARED_ENGINE_ORDER)}
    ordered = iter(sorted(ours, key=lambda item: rank.get(item.path.name, len(rank))))  # stable
    items[:] = [next(ordered) if HERE in item.path.parents else item for item in items]
