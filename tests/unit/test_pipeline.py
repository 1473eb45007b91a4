"""One pipeline for every gate kind: regressions of what drifted when gate, KV round trip and A/B
each assembled their own records."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from harness.api import EngineInfo, Verdict
from harness.cli import build_parser
from harness.kinds.registered import KINDS, GateRequest, Judgement, staleness
from harness.models import resolve_model
from harness.oracle import load_or_record
from harness.pipeline import build_record, kind_of, run_gate_by_name
from harness.records import Record, load_record, upgrade
from harness.report import print_record
from harness.speed import Speed, speed_extra
from harness.staleness import Current
from harness.suites import SuiteError, find_suite, load_suite
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import EARLIER, PIN
from tests.unit.features_kit import make_git_workspace, ok_controls
from tests.unit.record_kit import make_record


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_git_workspace(tmp_path / "ws")


def ab_record(ws: Workspace, a_version: str, pin: str = "A=vllm") -> Record:
    """An A/B record as ab.py wrote them before the pipeline existed (oracle.pin = 'A=<spec>')."""
    manifest = json.loads((ws.goldens / "tiny-llama" / "smoke" / "manifest.json").read_text())
    (ws.suites / "ab_smoke.toml").write_text((REPO_ROOT / "suites" / "ab_smoke.toml").read_text())
    from tests.unit.features_kit import commit, git

    commit(ws.root, "ab suite")
    return make_record(
        id="20261130T000000Z_x_ab-vllm_000000", kind="ab", created="2026-11-30T00:00:00Z",
        model={"name": "tiny-llama", "digest": manifest["model"]["digest"]},
        suite={"name": "ab_smoke", "version": 1, "digest": "x"},
        oracle={"role": "A (reference configuration)", "spec": "vllm", "pin": pin, "name": "vllm",
                "engine": "vllm", "version": a_version},
        candidate=EngineInfo("vllm:dtype=bfloat16", "vllm", a_version),
        harness={"sha": git(ws.root, "rev-parse", "HEAD"), "dirty": False}, outcome="pass",
        summary="ab", verdicts=(Verdict("a01", "kl", "pass", "ok"),), gates=("kl",),
        controls=ok_controls(("kl",)))


def test_an_ab_record_is_not_stale_forever(ws: Workspace) -> None:
    """Regression: ab.py wrote the pin as 'A=<spec>' and staleness compared it with the oracle pin,
    so every A/B record was 'goldens predate the pin' for ever."""
    assert staleness(ab_record(ws, PIN.version), Current.of(ws)) == []


def test_an_ab_record_whose_pinned_arm_ran_another_release_is_stale(ws: Workspace) -> None:
    why = staleness(ab_record(ws, EARLIER), Current.of(ws))
    assert f"arm A (vllm) ran vLLM {EARLIER}, the pin is now {PIN.spec}" in why
    assert f"arm B (vllm:dtype=bfloat16) ran vLLM {EARLIER}, the pin is now {PIN.spec}" in why
    assert not any("goldens" in w for w in why)


def _judgement(ws: Workspace, suite_name: str) -> tuple[GateRequest, Judgement]:
    model = resolve_model("tiny-llama", ws)
    suite = find_suite(ws.suites, suite_name)
    golden, _ = load_or_record(ws, model, suite, auto_record=False)
    req = GateRequest(model, suite, "kv")
    j = Judgement("kv-harness-store", EngineInfo("harness-store", "vllm", PIN.version),
                  (Verdict("c01", "byte_equal", "pass", "ok"),), ("byte_equal",), (), "kv", golden=golden)
    return req, j


def test_every_kind_records_the_oracles_settings(workspace: Workspace) -> None:
    """Regression: KV round-trip records lacked the oracle's settings (SUPPORTED_MODELS.md said —)."""
    req, j = _judgement(workspace, "kv_roundtrip")
    rec = build_record(workspace, req, KINDS.get("kv_roundtrip"), j)
    assert rec.kind == "kv_roundtrip" and rec.suite["kind"] == "kv_roundtrip"
    assert rec.oracle["settings"]["block_size"] == 32 and rec.oracle["settings"]["dtype"] == "float32"
    assert rec.oracle["pin"] == PIN.spec and rec.oracle["golden_files"]
    assert rec.model["architecture"] == "LlamaForCausalLM"  # model facts for every kind too
    assert rec.outcome == "vacuous"  # a gated comparator without controls cannot count as a pass


def test_a_typo_in_a_comparator_parameter_is_refused_when_the_suite_loads(tmp_path: Path) -> None:
    """Regression: near_tie read threshold_nats with a default, so threshold_nat gated at 0.5."""
    p = tmp_path / "smoke.toml"
    p.write_text((REPO_ROOT / "suites" / "smoke.toml").read_text().replace(
        "threshold_nats = 0.5", "threshold_nat = 0.3"))
    with pytest.raises(SuiteError) as e:
        load_suite(p)
    msg = str(e.value)
    assert str(p) in msg and "[compare.near_tie]" in msg and "'threshold_nat'" in msg
    assert "Did you mean 'threshold_nats'" in msg
    p.write_text(p.read_text().replace("threshold_nat = 0.3", 'threshold_nats = "half"'))
    with pytest.raises(SuiteError, match=r"\[compare.near_tie\].threshold_nats: expected a number, got 'half'"):
        load_suite(p)


def test_a_table_the_suites_kind_does_not_read_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "smoke.toml"
    p.write_text((REPO_ROOT / "suites" / "smoke.toml").read_text() + "\n[kv]\nchunk_size = 64\n")
    with pytest.raises(SuiteError, match=r"table \[kv\] is not read by kind 'parity' \(read by kind "
                                         r"'kv_roundtrip'\)"):
        kind_of(load_suite(p))
    p.write_text(p.read_text().replace('kind = "parity"', 'kind = "parrity"'))
    with pytest.raises(SuiteError, match="field 'kind'.*Did you mean 'parity'"):
        kind_of(load_suite(p))


def test_every_flag_a_message_names_exists() -> None:
    """Regression: make gate told the user about --oracle-speed, which the CLI never had."""
    parser = build_parser()
    named = set()
    for p in (REPO_ROOT / "harness").rglob("*.py"):
        named |= set(re.findall(r"harness (gate|ab|record|matrix|features|history|show|speed|export|trend)"
                                r"((?: --[a-z-]+)+)", p.read_text()))
    assert named, "no message names a harness flag: the pattern is stale"
    subs = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for cmd, flags in named:
        for flag in flags.split():
            assert flag in subs[cmd]._option_string_actions, f"a message names `harness {cmd} {flag}`"


def test_speed_is_opt_in_and_says_how_to_ask(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_oracle_speed(model, cases, sampling, c, run_dir):  # noqa: ANN001, ANN202
        calls.append(c)
        return Speed(c, len(cases), 256, 0.5, (), "vllm-offline")

    monkeypatch.setattr("harness.kinds.parity.kind.measure_speed", fake_oracle_speed)
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "hf", auto_record=False, write=False).record
    assert calls == []
    assert rec.extra["speed"]["statement"].endswith("oracle speed not measured (make gate SPEED=1, "
                                                    "harness gate --speed)")
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "hf", auto_record=False, write=False, speed=True).record
    assert calls == [1] and rec.extra["speed"]["statement"].startswith("candidate/oracle = ")
    assert speed_extra(None, 8, None, None)["speed"]["statement"] == "candidate speed not measured"


def test_the_timings_line_says_which_times_are_this_runs(workspace: Workspace) -> None:
    """Regression: the oracle's engine start and generate times printed beside this run's came from
    the goldens' manifest."""
    rec = run_gate_by_name(workspace, "tiny-llama", "smoke", "hf", auto_record=False, write=False).record
    assert rec.timings["recorded_oracle_engine_start_s"] > 0 and "oracle_engine_start_s" not in rec.timings
    con = Console(record=True, width=200)
    print_record(rec, "", con)
    text = con.export_text()
    assert "timings of this run (s):" in text and "recorded_oracle" not in text.split(
        "timings of this run (s):")[1].splitlines()[0]
    assert "oracle when the goldens were recorded (" in text and "not in this run" in text


def test_schema_1_records_keep_environment_out_of_settings() -> None:
    """Regression: SUPPORTED_MODELS.md printed loopback ports and venv internals as settings."""
    old = {"schema": 1, "candidate": {"name": "vllm-server", "engine": "vllm", "version": PIN.version,
                                      "settings": {"base_url": "http://127.0.0.1:55871/v1", "dtype": "float32",
                                                   "venv": {"size_mib": 3299}, "concurrency": 8}}}
    new = upgrade(old)
    assert new["candidate"]["settings"] == {"dtype": "float32", "concurrency": 8}
    assert new["candidate"]["environment"]["base_url"].startswith("http://127.0.0.1")
    assert old["candidate"]["settings"]["base_url"]  # the input is not touched
    committed = [load_record(p) for p in (REPO_ROOT / "reports" / "records").rglob("*.json")]
    for rec in committed:
        assert not {"base_url", "venv", "server_args", "protocol"} & set(rec.candidate.settings), rec.id


def test_records_of_every_kind_round_trip(workspace: Workspace) -> None:
    req, j = _judgement(workspace, "kv_roundtrip")
    rec = build_record(workspace, req, KINDS.get("kv_roundtrip"), replace(j, controls=ok_controls(
        ("byte_equal",))))
    assert Record.from_json(json.loads(json.dumps(rec.to_json()))) == rec


def test_a_candidate_on_another_device_class_is_named_in_the_record_and_the_verdict_text(
        workspace: Workspace) -> None:
    req, j = _judgement(workspace, "smoke")
    j = replace(j, label="hf", controls=ok_controls(("byte_equal",)),
                candidate=EngineInfo("hf", "transformers", "5", environment={"device_class": "cpu-x86_64-avx2"}))
    golden = j.golden
    assert golden is not None
    kind = KINDS.get("parity")
    known = replace(golden, manifest={**golden.manifest, "device": {"class": "cpu-x86_64-avx512bf16"}})
    rec = build_record(workspace, req, kind, replace(j, golden=known))
    cross = rec.extra["cross_device"]
    assert cross["relation"] == "cross-cpu" and cross["exact"] == ["token_ids"]
    assert rec.summary.endswith("goldens cpu-x86_64-avx512bf16, candidate cpu-x86_64-avx2: different CPU "
                                "classes — token ids must be identical, logprobs within 0.0001 nats (not "
                                "bit-exact)")
    same = build_record(workspace, req, kind, replace(j, golden=replace(known, manifest={
        **known.manifest, "device": {"class": "cpu-x86_64-avx2"}})))
    assert same.extra["cross_device"]["relation"] == "same-class" and " — goldens" not in same.summary
    remote = build_record(workspace, req, kind, replace(j, golden=known, candidate=EngineInfo("s", "x", "1")))
    assert remote.extra["cross_device"]["candidate_class"] == "unknown" and " — goldens" not in remote.summary
