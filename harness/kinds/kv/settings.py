"""The KV round trip's settings: the suite's ``[kv]`` table (and its ``[kv.load]`` lane), checked,
and the engine settings and ``kv_transfer_config`` each phase starts its engine with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.models import ModelRef
from harness.suites import Suite, SuiteError
from harness.tomlcheck import Where, check_keys, need_choice, need_int, need_list, need_str, need_table


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
    faults: FaultSettings | None = None
    """``[kv.faults]``: the connector under storage faults instead of the round trip."""

    @classmethod
    def from_suite(cls, suite: Suite) -> KVSettings:
        top = Where(suite.path, error=SuiteError)
        if not isinstance(suite.extra.get("kv"), Mapping):
            raise top.fail("the KV round trip needs a [kv] table")
        kv = need_table(suite.extra, "kv", top)
        where = top / "kv"
        check_keys(kv, where, KV_KEYS)
        tap = need_table(kv, "tap", where, {})
        check_keys(tap, where / "tap", ("chunk_size", "role", "extra_config"))
        policy = need_choice(kv, "load_failure_policy", where, ("recompute", "fail"), "recompute")
        chunk = need_int(kv, "chunk_size", where, 64, lo=1)
        block = need_int(kv, "block_size", where, 32, lo=1)
        if chunk % block:
            raise (where / "chunk_size").fail(f"chunk_size {chunk} must be a multiple of block_size {block} "
                                              f"(the non-multiple belongs in refuse_chunk_size)")
        refuse = need_int(kv, "refuse_chunk_size", where, None, lo=1)
        if refuse is not None and refuse % block == 0:
            raise (where / "refuse_chunk_size").fail(
                f"refuse_chunk_size {refuse} is a multiple of block_size {block}: "
                f"the connector would accept it")
        controls = need_str(kv, "controls_case", where, None) if "controls_case" in kv else None
        if controls is not None and controls not in {c.id for c in suite.cases}:
            raise (where / "controls_case").fail(f"controls_case {controls!r} is not a case of the suite")
        load = need_table(kv, "load", where) if "load" in kv else None
        faults = (FaultSettings.from_table(need_table(kv, "faults", where), where / "faults", block,
                                           {c.id for c in suite.cases}) if "faults" in kv else None)
        if faults is not None and load is not None:
            raise (where / "faults").fail("[kv.faults] and [kv.load] are two suites: give one")
        return cls(chunk, block, refuse, policy, controls, need_int(kv, "timing_reps", where, 3, lo=1),
                   need_int(kv, "timing_copies", where, 4, lo=1), need_table(kv, "engine", where, {}),
                   need_int(tap, "chunk_size", where / "tap", block, lo=1),
                   need_str(tap, "role", where / "tap", "kv_both"),
                   need_table(tap, "extra_config", where / "tap", {}),
                   LoadSettings.from_table(load, where / "load", block) if load is not None else None,
                   faults)


KV_KEYS = ("chunk_size", "block_size", "refuse_chunk_size", "load_failure_policy", "controls_case",
           "timing_reps", "timing_copies", "engine", "tap", "load", "faults")
"""The keys of a suite's ``[kv]`` table."""


LOAD_VERDICTS = ("kv_load.pages", "kv_load.bit_exact", "kv_load.near_tie", "kv_load.evidence")
"""The comparators the load lane's verdicts are named by (:mod:`harness.kinds.kv.load_judge`)."""


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
    def from_table(cls, t: Mapping[str, Any], where: Where, block: int) -> LoadSettings:
        def ints(key: str, default: int, lo: int = 1) -> int:
            return int(need_int(t, key, where, default, lo=lo))

        check_keys(t, where, cls.__slots__)  # type: ignore[attr-defined]
        suffix = need_list(t, "suffix_tokens", where, [8, 64], of=int, lo=1)
        if len(suffix) != 2 or suffix[0] > suffix[1]:
            raise (where / "suffix_tokens").fail(f"expected [least, most], got {suffix}")
        prefixes = tuple(need_list(t, "prefix_tokens", where, [32, 96, 160], of=int, lo=1))
        s = cls(ints("requests", 128), prefixes, (suffix[0], suffix[1]), ints("pool_blocks", 48),
                ints("max_model_len", 512), ints("min_in_flight", 64), ints("flip_requests", 1, lo=0),
                ints("seed", 0, lo=0), ints("timeout_s", 7200))
        longest = max(s.prefix_tokens) + s.suffix_tokens[1]
        if longest >= s.max_model_len:
            raise (where / "max_model_len").fail(f"the longest request ({longest} tokens) does not fit "
                                                 f"max_model_len {s.max_model_len}")
        if s.pool_blocks * block < s.max_model_len + block:
            raise (where / "pool_blocks").fail(
                f"pool_blocks {s.pool_blocks} x block {block} cannot hold one request of max_model_len "
                f"{s.max_model_len}: vLLM would refuse to start")
        if s.min_in_flight > s.requests:
            raise (where / "min_in_flight").fail(f"min_in_flight {s.min_in_flight} > requests {s.requests}")
        return s


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """``[kv.faults]``: the connector under storage faults (:mod:`harness.kinds.kv.faults.run`)."""

    target: str = ""
    """The case whose stored files each fault damages; the other cases are bystanders."""
    faults: tuple[str, ...] = ()
    """Which faults to run (:data:`harness.kinds.kv.faults.inject.FAULTS`; default: all)."""
    rounds: int = 3
    """Offload -> evict -> onboard rounds of the cycle row."""
    pool_blocks: int = 8
    """The cycle consumer's KV pool in blocks: small enough that the engine evicts every round."""
    max_model_len: int = 192
    no_space_fraction: float = 0.5
    """The small filesystem holds the bystanders' files and this fraction of the target's."""
    timeout_s: int = 420
    """Seconds one phase may take before it counts as hung."""

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in
                ((k, getattr(self, k)) for k in self.__slots__)}  # type: ignore[attr-defined]

    @classmethod
    def from_table(cls, t: Mapping[str, Any], where: Where, block: int, cases: set[str]) -> FaultSettings:
        from harness.kinds.kv.faults.inject import BY_NAME, fault

        check_keys(t, where, cls.__slots__)  # type: ignore[attr-defined]
        target = need_str(t, "target", where)
        if target not in cases:
            raise (where / "target").fail(f"target {target!r} is not a case of the suite")
        names = tuple(need_list(t, "faults", where, list(BY_NAME), of=str))
        for n in names:
            try:
                fault(n)
            except ValueError as e:
                raise (where / "faults").fail(str(e)) from None
        frac = t.get("no_space_fraction", 0.5)
        if not isinstance(frac, (int, float)) or not 0.0 < float(frac) < 1.0:
            raise (where / "no_space_fraction").fail(f"expected a number in (0, 1), got {frac!r}")
        s = cls(target, names, need_int(t, "rounds", where, 3, lo=2),
                need_int(t, "pool_blocks", where, 8, lo=2),
                need_int(t, "max_model_len", where, 192, lo=block), float(frac),
                need_int(t, "timeout_s", where, 420, lo=30))
        if s.pool_blocks * block < s.max_model_len + block:
            raise (where / "pool_blocks").fail(
                f"pool_blocks {s.pool_blocks} x block {block} cannot hold one request of max_model_len "
                f"{s.max_model_len}: vLLM would refuse to start")
        return s


def engine_settings(model: ModelRef, kv: KVSettings, transfer: Mapping[str, Any]) -> dict[str, Any]:
    from harness.engines.vllm.runner import default_engine_settings

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
