"""Suite files: valid ones load; malformed ones name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.registry import UnknownName
from harness.suites import SuiteError, find_suite, load_suite
from harness.workspace import REPO_ROOT

GOOD = """
name = "s"
version = 1
[sampling]
max_tokens = 4
[compare.strict]
[[cases]]
id = "a"
text = "hi"
"""


def write(tmp_path: Path, text: str, name: str = "s") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def test_committed_suites_load() -> None:
    smoke = load_suite(REPO_ROOT / "suites" / "smoke.toml")
    assert len(smoke.cases) >= 8
    assert smoke.comparator("near_tie") is not None and smoke.comparator("near_tie").gate


def test_smoke_has_a_prompt_longer_than_two_kv_blocks() -> None:
    from harness.models import resolve_model
    from harness.workspace import Workspace

    ws = Workspace(REPO_ROOT)
    cases = find_suite(ws.suites, "smoke").build_cases(resolve_model("tiny-llama", ws).encode)
    assert max(len(c.prompt_ids) for c in cases) > 2 * 32


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace('version = 1', 'version = "one"'), "version: expected an integer >= 0, got 'one'"),
    (lambda s: s.replace('max_tokens = 4', ''), "[sampling].max_tokens: missing (expected an integer >= 1)"),
    (lambda s: s.replace('[compare.strict]', '[compare.strictt]'), "Did you mean 'strict'"),
    (lambda s: s.replace('text = "hi"', ''), "give 'text' or 'ids'"),
    (lambda s: s + '[[cases]]\nid = "a"\ntext = "x"\n', "duplicate id 'a'"),
    (lambda s: s.replace('name = "s"', 'name = "t"'), "name: is 't'"),
    (lambda s: s.replace('[sampling]', '[sampling]\ntemperature = 0.7'), "[sampling].temperature: must be 0 (parity gates are greedy"),
    (lambda s: s + "\n[[[", "not valid TOML"),
])
def test_malformed_suite_names_file_and_field(tmp_path: Path, edit, needle: str) -> None:
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    assert str(path) in str(e.value)
    assert needle in str(e.value)


def test_unknown_suite_lists_the_valid_ones_and_the_closest(tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    with pytest.raises(UnknownName, match=r"unknown suite 'ss'. Did you mean 's'\? Valid: s"):
        find_suite(tmp_path, "ss")


# --- a suite must mean the same thing on every model, or be refused naming the field ----------------

def _limits(name: str):  # noqa: ANN202
    from harness.models.arch import ModelLimits

    return ModelLimits.of(REPO_ROOT / "models" / name)


def test_every_committed_suite_fits_every_committed_model() -> None:
    from harness.models import resolve_model
    from harness.models.tiny import SPECS
    from harness.suites import suite_names
    from harness.workspace import Workspace

    ws = Workspace(REPO_ROOT)
    for model_name in SPECS:
        model = resolve_model(model_name, ws)
        for suite_name in suite_names(ws.suites):
            find_suite(ws.suites, suite_name).build_cases(model.encode, model.limits)


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace('text = "hi"', 'ids = [5, 600, 7]'),
     "case 'a' field 'ids' holds token 600, outside the model's vocabulary of 512 tokens (ids 0..511)"),
    (lambda s: s.replace('text = "hi"', 'ids = [5, -1]'), "field 'ids' holds token -1"),
    (lambda s: s.replace('max_tokens = 4', 'max_tokens = 2047'),
     "case 'a' needs 2 prompt tokens + [sampling] field 'max_tokens' 2047 = 2049 positions, beyond the "
     "model's context of 2048"),
    (lambda s: s.replace('max_tokens = 4', 'max_tokens = 4\nlogprobs = 1000'),
     "[sampling].logprobs: asks for 1000 per position, but the model's vocabulary has 512 tokens"),
])
def test_a_suite_the_model_cannot_run_as_written_is_refused_naming_the_field(tmp_path: Path, edit,
                                                                             needle: str) -> None:
    from harness.models import resolve_model
    from harness.suites import SuiteMismatch
    from harness.workspace import Workspace

    suite = load_suite(write(tmp_path, edit(GOOD)))
    model = resolve_model("tiny-gpt2", Workspace(REPO_ROOT))  # vocab 512, 2048 learned positions
    suite.build_cases(model.encode)  # without limits: no judgement (goldens replayed as recorded)
    with pytest.raises(SuiteMismatch) as e:
        suite.build_cases(model.encode, model.limits)
    assert needle in str(e.value) and str(tmp_path / "s.toml") in str(e.value)


def test_the_context_is_the_models_own(tmp_path: Path) -> None:
    """2049 positions: beyond GPT-2's 2048 learned positions, within tiny-llama's 4096."""
    from harness.suites import SuiteMismatch

    suite = load_suite(write(tmp_path, GOOD.replace("max_tokens = 4", "max_tokens = 2047")))
    encode = lambda t: [5, 6]  # noqa: E731
    assert len(suite.build_cases(encode, _limits("tiny-llama"))) == 1
    with pytest.raises(SuiteMismatch):
        suite.build_cases(encode, _limits("tiny-gpt2"))


def test_the_gate_refuses_a_suite_that_does_not_fit_before_any_engine_starts(
        workspace, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from harness.cli import main

    text = (workspace.suites / "smoke.toml").read_text().replace("max_tokens = 32", "max_tokens = 2040")
    (workspace.suites / "smoke.toml").write_text(text)
    monkeypatch.setenv("HARNESS_ROOT", str(workspace.root))
    assert main(["gate", "--model", "tiny-gpt2", "--suite", "smoke"]) == 2
    assert not workspace.runs.exists(), "refused before any engine started"
