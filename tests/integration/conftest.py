"""Every test here is an ``integration`` test (real engines: minutes, not seconds), whether or not its
module says so: ``-m "not integration"`` and ``make test-unit`` (tests/unit) leave the same tests out.

The modules that share a pooled engine run next to each other (:data:`SHARED_ENGINE_ORDER`), the rest
after them in their usual order. The session's engine pool keeps ``free memory / 3 GiB`` engines (one
on a 7 GiB CI runner), least recently used out first: in alphabetical order a test between two users
of one configuration pushed its engine out, and the second user started it again."""

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
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in item.path.parents]
    for item in ours:
        item.add_marker(pytest.mark.integration)
    rank = {name: i for i, name in enumerate(SHARED_ENGINE_ORDER)}
    ordered = iter(sorted(ours, key=lambda item: rank.get(item.path.name, len(rank))))  # stable
    items[:] = [next(ordered) if HERE in item.path.parents else item for item in items]
