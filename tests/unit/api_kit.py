"""What the API gate's unit tests share: the context of suite api_smoke on a committed tiny model."""

from __future__ import annotations

from harness.kinds.api.facets import FACETS, Context
from harness.kinds.api.reference import Reference
from harness.kinds.api.settings import api_settings
from harness.suites import find_suite
from harness.workspace import REPO_ROOT

SUITE = "api_smoke"


def context(model: str = "tiny-qwen3", max_len: int = 4096) -> Context:
    suite = find_suite(REPO_ROOT / "suites", SUITE)
    return Context(
        api_settings(suite, FACETS.names()),
        {c.id: c.text or "" for c in suite.cases},
        Reference(REPO_ROOT / "models" / model),
        {},
        max_len,
    )
