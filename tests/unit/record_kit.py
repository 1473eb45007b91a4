"""The one builder of the records tests make: a passing gate record of tiny-llama / smoke, ``hf``
against the pinned vLLM, with one strict verdict. Every field can be given; ``sha`` and ``dirty``
fill ``harness`` and the id (when no ``id`` is given)."""

from __future__ import annotations

from typing import Any

from harness.api import EngineInfo, Verdict
from harness.records import Record, new_record_id
from tests.pins import PIN


def make_record(*, created: str = "2026-11-30T00:00:00Z", sha: str | None = "abc123", dirty: bool = False,
                **fields: Any) -> Record:
    candidate = fields.setdefault("candidate", EngineInfo("hf", "transformers", "5.19.0"))
    base: dict[str, Any] = {
        "id": new_record_id(created, sha, candidate.name), "kind": "gate", "created": created,
        "model": {"name": "tiny-llama", "digest": "d" * 64},
        "suite": {"name": "smoke", "version": 1, "digest": "s" * 64},
        "oracle": {"engine": "vllm", "version": PIN.version, "pin": PIN.spec},
        "harness": {"sha": sha, "dirty": dirty}, "outcome": "pass", "summary": "test record",
        "verdicts": (Verdict("c01", "strict", "pass", "strict pass: 3/3 tokens", evidence={"matched": 3}),),
        "gates": ("strict",),
    }
    return Record(**{**base, **fields})
