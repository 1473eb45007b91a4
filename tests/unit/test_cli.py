"""The `harness` command: bad input is a clear message and exit 2, never a traceback."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.workspace import Workspace


@pytest.fixture(autouse=True)
def _root(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))


@pytest.mark.parametrize("argv, needle", [
    (["gate", "--model", "tiny-lama"], "unknown model 'tiny-lama'. Did you mean 'tiny-llama'"),
    (["gate", "--suite", "smok"], "unknown suite 'smok'. Did you mean 'smoke'"),
    (["gate", "--candidate", "hff"], "unknown candidate 'hff'. Did you mean 'hf'"),
    (["show", "reports/records/nope.json"], "nope.json"),
])
def test_bad_input_exits_2_with_a_suggestion(argv: list[str], needle: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert needle in err


def test_missing_goldens_without_recording_name_the_command(
        workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    shutil.rmtree(workspace.goldens / "tiny-llama" / "smoke")
    assert main(["gate", "--no-record-goldens"]) == 2
    assert "make record MODEL=tiny-llama SUITE=smoke" in " ".join(capsys.readouterr().err.split())


def test_list_names_models_suites_and_candidates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "tiny-llama" in out and "smoke" in out and "hf" in out


def test_an_error_naming_a_table_prints_the_table(workspace: Workspace,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Rich would read ``[kv]`` as markup and drop it: errors go out as written."""
    smoke = (workspace.suites / "smoke.toml").read_text()
    (workspace.suites / "stray.toml").write_text(
        smoke.replace('name = "smoke"', 'name = "stray"') + "\n[kv]\nblock_size = 16\n")
    assert main(["gate", "--suite", "stray"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: " in err and "table [kv] is not read by kind 'parity'" in err, err


def test_the_sampling_command_refuses_a_parity_suite_before_any_engine_starts(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.engines.launch import ledger

    starts = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.ENV, str(starts))
    assert main(["sampling", "--model", "tiny-llama", "--suite", "smoke"]) == 2
    out = capsys.readouterr()
    err = " ".join(out.err.split())
    assert "smoke.toml: a sampling suite needs a [sampling_gate] table with its settings" in err, err
    assert "(suite 'smoke' is of kind 'parity')" in err
    assert "oracle" not in out.out + out.err  # the oracle was not even announced
    assert ledger.read(starts) == []  # and no engine started
