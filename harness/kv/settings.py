"""The KV round trip's settings: the suite's ``[kv]`` table (and its ``[kv.load]`` lane), checked,
and the engine settings and ``kv_transfer_config`` each phase starts its engine with."""

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
    load: LoadSettings | None = None
    """``[kv.load]``: the round trip under load instead of one request at a time."""

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
        load = kv.get("load")
        if load is not None and not isinstance(load, Mapping):
            raise SuiteError(f"{where}: field 'load' must be a table")
        return cls(chunk, block, refuse, policy, controls, num("timing_reps", 3) or 3,
                   num("timing_copies", 4) or 4, dict(engine), tap_chunk, str(tap.get("role", "kv_both")),
                   dict(extra), LoadSettings.from_table(load, f"{suite.path} [kv.load]", block)
                   if load is not None else None)


LOAD_VERDICTS = ("kv_load.pages", "kv_load.bit_exact", "kv_load.near_tie", "kv_load.evidence")
"""The comparators the load lane's verdicts are named by (:mod:`harness.kv.load_judge`)."""


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """``[kv.load]``: many requests in flight over shared prefixes of several lengths, in a KV pool
    small enough that the engine preempts and evicts cached prefixes while the connector restores."""

    requests: int = 128
    """Requests submitted at once to the consumer (64-256)."""
    prefix_tokens: tuple[int, ...] = (32, 96, 160)
    """Lengths of the prefixes requests share (each base prompt is cut at each length)."""
    suffix_tokens: tuple[int, int] = (8, 64)
    """The least and most tokens each request adds after its shared prefix (its own tokens)."""
    pool_blocks: int = 48
    """The consumer's KV pool, in blocks (vLLM's ``num_gpu_blocks_override``)."""
    max_model_len: int = 512
    min_in_flight: int = 64
    """Evidence: at least this many requests in flight at the peak, or the run is not under load."""
    flip_requests: int = 1
    """Requests replayed in the planted-fault lane (one byte of a stored page flipped)."""
    seed: int = 0
    timeout_s: int = 7200
    """Seconds each phase may take: the producer runs every request alone (smollm2-135m on two
    busy cores: about 18 s each), far longer than a plain round trip's phase."""

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in
                ((k, getattr(self, k)) for k in self.__slots__)}  # type: ignore[attr-defined]

    @classmethod
    def from_table(cls, t: Mapping[str, Any], where: str, block: int) -> LoadSettings:
        def ints(key: str, default: Any, lo: int = 1) -> Any:
            v = t.get(key, default)
            items = v if isinstance(v, list | tuple) else [v]
            if not items or any(not isinstance(x, int) or isinstance(x, bool) or x < lo for x in items):
                raise SuiteError(f"{where}: field {key!r} must be int(s) >= {lo}, got {v!r}")
            return tuple(items) if isinstance(v, list | tuple) else v

        unknown = sorted(set(t) - set(cls.__slots__))  # type: ignore[attr-defined]
        if unknown:
            raise SuiteError(f"{where}: unknown field(s) {', '.join(unknown)}; known: "
                             f"{', '.join(cls.__slots__)}")  # type: ignore[attr-defined]
        suffix = ints("suffix_tokens", [8, 64])
        if len(suffix) != 2 or suffix[0] > suffix[1]:
            raise SuiteError(f"{where}: field 'suffix_tokens' must be [least, most], got {list(suffix)}")
        s = cls(ints("requests", 128), ints("prefix_tokens", [32, 96, 160]), (suffix[0], suffix[1]),
                ints("pool_blocks", 48), ints("max_model_len", 512), ints("min_in_flight", 64),
                ints("flip_requests", 1, lo=0), ints("seed", 0, lo=0), ints("timeout_s", 7200))
        longest = max(s.prefix_tokens) + s.suffix_tokens[1]
        if longest >= s.max_model_len:
            raise SuiteError(f"{where}: the longest request ({longest} tokens) does not fit max_model_len "
                             f"{s.max_model_len}")
        if s.pool_blocks * block < s.max_model_len + block:
            raise SuiteError(f"{where}: pool_blocks {s.pool_blocks} x block {block} cannot hold one request "
                             f"of max_model_len {s.max_model_len}: vLLM would refuse to start")
        if s.min_in_flight > s.requests:
            raise SuiteError(f"{where}: min_in_flight {s.min_in_flight} > requests {s.requests}")
        return s


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
