"""The KV round trip's settings: the suite's ``[kv]`` table, checked, and the engine settings and
``kv_transfer_config`` each phase starts its engine with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.models import ModelRef
from harness.suites import Suite, SuiteError


@dataclass(frozen=True, slots=True)
class KVSettings:
    """The suite's ``[kv]`` table."""

    chunk_size: int = 64
    block_size: int = 32
    refuse_chunk_size: int | None = None
    load_failure_policy: str = "recompute"
    controls_case: str | None = None
    timing_reps: int = 3
    timing_copies: int = 4
    """Shifted copies of the workload in each timing pass: longer passes, less relative noise."""
    engine: Mapping[str, Any] = field(default_factory=dict)
    tap_chunk_size: int | None = None
    tap_role: str = "kv_both"
    tap_extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_suite(cls, suite: Suite) -> KVSettings:
        where = f"{suite.path} [kv]"
        kv = suite.extra.get("kv")
        if not isinstance(kv, Mapping):
            raise SuiteError(f"{where}: the KV round trip needs a [kv] table")

        def num(key: str, default: int | None, lo: int = 1) -> int | None:
            v = kv.get(key, default)
            if v is None:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise SuiteError(f"{where}: field {key!r} must be an int >= {lo}, got {v!r}")
            return v

        tap = kv.get("tap", {})
        if not isinstance(tap, Mapping):
            raise SuiteError(f"{where}: field 'tap' must be a table")
        policy = kv.get("load_failure_policy", "recompute")
        if policy not in ("recompute", "fail"):
            raise SuiteError(f"{where}: field 'load_failure_policy' must be 'recompute' or 'fail'")
        chunk, block = num("chunk_size", 64), num("block_size", 32)
        assert chunk is not None and block is not None
        if chunk % block:
            raise SuiteError(f"{where}: chunk_size {chunk} must be a multiple of block_size {block} "
                             f"(the non-multiple belongs in refuse_chunk_size)")
        refuse = num("refuse_chunk_size", None)
        if refuse is not None and refuse % block == 0:
            raise SuiteError(f"{where}: refuse_chunk_size {refuse} is a multiple of block_size {block}: "
                             f"the connector would accept it")
        controls = kv.get("controls_case")
        if controls is not None and controls not in {c.id for c in suite.cases}:
            raise SuiteError(f"{where}: controls_case {controls!r} is not a case of the suite")
        engine = kv.get("engine", {})
        extra = tap.get("extra_config", {})
        if not isinstance(engine, Mapping) or not isinstance(extra, Mapping):
            raise SuiteError(f"{where}: 'engine' and 'tap.extra_config' must be tables")
        tap_chunk = tap.get("chunk_size", block)
        if not isinstance(tap_chunk, int) or tap_chunk < 1:
            raise SuiteError(f"{where}: field 'tap.chunk_size' must be an int >= 1")
        return cls(chunk, block, refuse, policy, controls, num("timing_reps", 3) or 3,
                   num("timing_copies", 4) or 4, dict(engine), tap_chunk, str(tap.get("role", "kv_both")),
                   dict(extra))


def engine_settings(model: ModelRef, kv: KVSettings, transfer: Mapping[str, Any]) -> dict[str, Any]:
    from harness.engines.vllm import default_engine_settings

    return {**default_engine_settings(model), "block_size": kv.block_size, **kv.engine,
            "enable_prefix_caching": False,  # every cached token must come through the connector
            "kv_transfer_config": dict(transfer)}


def transfer(connector: str, module: str, role: str, harness: Mapping[str, Any],
              policy: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"kv_connector": connector, "kv_connector_module_path": module, "kv_role": role,
            "kv_load_failure_policy": policy,
            "kv_connector_extra_config": {**(extra or {}), "harness": dict(harness)}}


def fill_store(v: Any, store: Path) -> Any:
    if isinstance(v, str):
        return v.replace("{store}", str(store))
    if isinstance(v, Mapping):
        return {k: fill_store(x, store) for k, x in v.items()}
    return v
