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
    (lambda s: s.replace('version = 1', 'version = "one"'), "field 'version' must be int"),
    (lambda s: s.replace('max_tokens = 4', ''), "[sampling]: missing field 'max_tokens'"),
    (lambda s: s.replace('[compare.strict]', '[compare.strictt]'), "Did you mean 'strict'"),
    (lambda s: s.replace('text = "hi"', ''), "give 'text' or 'ids'"),
    (lambda s: s + '[[cases]]\nid = "a"\ntext = "x"\n', "duplicate id 'a'"),
    (lambda s: s.replace('name = "s"', 'name = "t"'), "field 'name' is 't'"),
    (lambda s: s.replace('[sampling]', '[sampling]\ntemperature = 0.7'), "must be 0"),
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
