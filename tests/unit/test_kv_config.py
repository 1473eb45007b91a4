"""Connector specs, harness settings, the chunk-size refusal and the suite's [kv] table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from harness.kinds.kv.config import (
    ConnectorSpec,
    ConnectorSpecError,
    HarnessKVConfig,
    KVConfigError,
    chunk_size_problem,
    load_connector_class,
    parse_connector,
)
from harness.kinds.kv.plan import groups_of
from harness.kinds.kv.settings import KVSettings
from harness.registry import UnknownName
from harness.suites import SuiteError, load_suite
from harness.workspace import REPO_ROOT

EXAMPLE = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"


def test_connector_specs_in_every_accepted_form() -> None:
    assert parse_connector(f"{EXAMPLE}:ExampleConnector") == ConnectorSpec(EXAMPLE, "ExampleConnector")
    assert parse_connector(f"{EXAMPLE}.ExampleConnector") == ConnectorSpec(EXAMPLE, "ExampleConnector")
    assert parse_connector("ExampleConnector") == ConnectorSpec(EXAMPLE, "ExampleConnector")
    assert load_connector_class(parse_connector("ExampleConnector")).__name__ == "ExampleConnector"


def test_a_harness_connector_named_by_its_path_before_the_move_resolves_to_where_it_is() -> None:
    """Records and specs written before the KV gate became harness.kinds.kv name harness.kv.*; the
    one alias table (MOVED_MODULES) resolves them, and the class they name loads."""
    from harness.kinds.kv.config import MOVED_MODULES, STORE_MODULE, TAP_MODULE

    assert parse_connector("harness.kv.connector:HarnessKVConnector") == ConnectorSpec(
        STORE_MODULE, "HarnessKVConnector")
    assert parse_connector("harness.kv.tap.HarnessTapConnector") == ConnectorSpec(TAP_MODULE, "HarnessTapConnector")
    assert load_connector_class(parse_connector("harness.kv.connector:HarnessKVConnector")).__name__ == (
        "HarnessKVConnector")
    for new in MOVED_MODULES.values():
        assert importlib.util.find_spec(new) is not None, f"{new}: an alias points at no module"


@pytest.mark.parametrize("spec, needles", [
    ("harness.kinds.kv.nope:MyConnector", ["module 'harness.kinds.kv.nope'", "'MyConnector'", "cannot be imported"]),
    (f"{EXAMPLE}:ExampleConector", ["class 'ExampleConector'", f"module '{EXAMPLE}'", "ExampleConnector"]),
    ("ExampleConector", ["'ExampleConector'", "not registered", "Did you mean ExampleConnector"]),
    ("harness.kv_pages.identity:PageRef", ["harness.kv_pages.identity:PageRef", "not a vLLM v1 KV connector"]),
    (":X", ["expected module.path:ClassName"]),
])
def test_an_unknown_connector_names_both_module_and_class(spec: str, needles: list[str]) -> None:
    with pytest.raises(ConnectorSpecError) as e:
        load_connector_class(parse_connector(spec))
    for n in needles:
        assert n in str(e.value), (n, str(e.value))
    assert isinstance(e.value, UnknownName)  # the CLI answers bad input with exit code 2


def kv_config(*groups: KVCacheGroupSpec) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=list(groups))


def spec(block: int) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=64, dtype=torch.float32)


def test_a_chunk_size_off_the_block_grid_is_refused_naming_group_and_both_sizes() -> None:
    groups = groups_of(kv_config(KVCacheGroupSpec(["l0", "l1"], spec(32))))
    assert chunk_size_problem(64, groups) is None
    why = chunk_size_problem(48, groups)
    assert why is not None
    for needle in ("chunk_size 48", "group 0", "block size 32", "FullAttentionSpec", "l0 and 1 more",
                   "not supported"):
        assert needle in why


def test_every_paged_group_counts_and_state_groups_do_not() -> None:
    sw = SlidingWindowSpec(block_size=48, num_kv_heads=1, head_size=64, dtype=torch.float32,
                           sliding_window=128)
    mamba = MambaSpec(block_size=100, shapes=((4,),), dtypes=(torch.float32,))
    groups = groups_of(kv_config(KVCacheGroupSpec(["a"], spec(32)), KVCacheGroupSpec(["b"], sw),
                                 KVCacheGroupSpec(["m"], mamba)))
    assert [g.paged for g in groups] == [True, True, False]
    assert "group 1's block size 48" in (chunk_size_problem(64, groups) or "")
    assert chunk_size_problem(96, groups) is None


def test_harness_settings_are_checked_field_by_field(tmp_path: Path) -> None:
    ok = HarnessKVConfig.from_extra({"harness": {"capture_dir": str(tmp_path), "chunk_size": 64,
                                                 "lanes": {"clean": {"root": str(tmp_path / "s")}}}})
    assert ok.chunk_size == 64 and ok.lanes["clean"] == (tmp_path / "s", None)
    for extra, needle in [
        ({}, "is missing"),
        ({"harness": {}}, "['capture_dir'] must be a path"),
        ({"harness": {"capture_dir": "x", "chunk_size": "64"}}, "['chunk_size'] must be an int"),
        ({"harness": {"capture_dir": "x", "lanes": {"clean": {}}}}, "['lanes']['clean'] needs a 'root'"),
        ({"harness": {"capture_dir": "x", "lanes": {"f": {"root": "r", "fault": {"kind": "smudge"}}}}},
         "'kind' must be one of flip, drop"),
        ({"harness": {"capture_dir": "x", "tap": {"module": "m"}}}, "['tap'] needs 'module' and 'class'"),
    ]:
        with pytest.raises(KVConfigError) as e:
            HarnessKVConfig.from_extra(extra)
        assert needle in str(e.value)


def write_suite(tmp_path: Path, kv: str) -> Path:
    text = (REPO_ROOT / "suites" / "kv_roundtrip.toml").read_text()
    head, _, rest = text.partition("[kv]")
    rest = rest[rest.index("[[cases]]"):]
    p = tmp_path / "kv_roundtrip.toml"
    p.write_text(head + kv + "\n" + rest)
    return p


def test_the_committed_suite_settings() -> None:
    kv = KVSettings.from_suite(load_suite(REPO_ROOT / "suites" / "kv_roundtrip.toml"))
    assert (kv.chunk_size, kv.block_size, kv.refuse_chunk_size) == (64, 32, 48)
    assert kv.controls_case == "n_2c_plus_k" and kv.load_failure_policy == "recompute"
    assert kv.tap_chunk_size == 32 and kv.tap_extra == {"shared_storage_path": "{store}"}


@pytest.mark.parametrize("kv, needle", [
    ("[kv]\nchunk_size = 48\nblock_size = 32", "chunk_size 48 must be a multiple of block_size 32"),
    ("[kv]\nrefuse_chunk_size = 64", "refuse_chunk_size 64 is a multiple"),
    ("[kv]\ncontrols_case = 'c99'", "controls_case 'c99' is not a case"),
    ("[kv]\nload_failure_policy = 'ignore'", "[kv].load_failure_policy: expected one of recompute, fail, got 'ignore'"),
    ("[kv]\ntiming_reps = 0", "[kv].timing_reps: expected an integer >= 1, got 0"),
])
def test_a_malformed_kv_table_names_the_file_and_field(tmp_path: Path, kv: str, needle: str) -> None:
    with pytest.raises(SuiteError) as e:
        KVSettings.from_suite(load_suite(write_suite(tmp_path, kv)))
    assert needle in str(e.value) and "kv_roundtrip.toml: [kv]." in str(e.value), str(e.value)
