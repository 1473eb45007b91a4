"""FEATURES.md / SUPPORTED_MODELS.md: cells computed from records, citations that resolve, broken
records reported and skipped, records never rewritten, history newest first."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from harness.cli import main
from harness.features import CatalogError, check_citations, generate, history, load_catalog, write_pages
from harness.records import Control
from harness.workspace import Workspace
from tests.pins import PIN
from tests.unit.features_kit import CATALOG, make_git_workspace, make_record


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_git_workspace(tmp_path / "ws")


def refs_of(page: str) -> dict[str, str]:
    """Record path -> its reference label on a generated page (``[r3]: path``)."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^\[([^\]]+)\]: (\S+)$", page, re.M)}


def cell(ws: Workspace, row: str = "near-tie", col: str = "hf"):  # noqa: ANN201
    return generate(ws).table.cell(row, col)


def test_no_record_is_not_yet(ws: Workspace) -> None:
    g = generate(ws)
    assert g.table.cell("near-tie", "hf").state == "todo"
    assert g.table.cell("exact", "cpp").state == "na"
    assert "n/a not applicable to this engine" in g.features
    assert "✅" not in g.features.split("## Decode")[1]


def test_pass_cites_its_record_and_sha(ws: Workspace) -> None:
    rec, path = make_record(ws)
    c = cell(ws)
    assert (c.state, c.text) == ("pass", "near_tie 8/8")
    rel = path.relative_to(ws.root).as_posix()
    g = generate(ws)
    label = refs_of(g.features)[rel]
    assert f"| [✅ 8/8][{label}] |" in g.features  # the short cell: symbol, count, link; no note
    assert check_citations(ws, g.features, g.supported) == []
    # a failing cell carries a note with the failing cases, the SHA and the device class
    make_record(ws, statuses={"near_tie": ["pass"] * 5 + ["fail"] * 3, "strict": ["pass"] * 8},
                outcome="fail", created="2026-11-30T05:00:00Z")
    g = generate(ws)
    line = next(x for x in g.features.splitlines() if x.startswith("| `near-tie`"))
    assert "[◐ 5/8][r" in line and "<sup>1</sup>" in line
    note = next(x for x in g.features.splitlines() if x.startswith("1. ◐ "))
    assert "near_tie 5/8 (c06, c07, c08)" in note and f"@ `{rec.harness['sha'][:10]}`" in note


def test_partial_names_the_gap_and_the_cases(ws: Workspace) -> None:
    make_record(ws, statuses={"near_tie": ["pass"] * 5 + ["fail"] * 3, "strict": ["pass"] * 8},
                outcome="fail")
    c = cell(ws)
    assert c.state == "partial" and c.text == "near_tie 5/8 (c06, c07, c08)"
    assert cell(ws, "exact").state == "pass"  # the strict row reads strict's own verdicts


def test_strict_row_shows_near_ties_as_partial(ws: Workspace) -> None:
    make_record(ws, statuses={"near_tie": ["pass"] * 8, "strict": ["pass"] * 5 + ["fail"] * 3})
    assert cell(ws, "exact").text == "strict 5/8 (c06, c07, c08)"
    assert cell(ws).state == "pass"


def test_all_failing_is_a_fail(ws: Workspace) -> None:
    make_record(ws, statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8}, outcome="fail")
    c = cell(ws)
    assert c.state == "fail" and c.symbol == "❌" and c.text.startswith("near_tie 0/8")


def test_refused_shows_the_engines_reason(ws: Workspace) -> None:
    make_record(ws, outcome="refused", statuses={"near_tie": ["refused"] * 8},
                extra={"engine_refused": "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"},
                settings={"kv_cache_dtype": "fp8"})
    c = cell(ws)
    assert c.state == "refused" and c.text == "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"
    g = generate(ws)
    refused = g.supported.split("## Refused configurations")[1]
    assert "kv_cache_dtype=fp8" in refused and "requires x86 with AVX-512" in refused


def test_vacuous_record_is_vacuous_not_pass(ws: Workspace) -> None:
    make_record(ws, outcome="vacuous", controls=(
        Control("near_tie", "swap beyond bar", "fail", "pass 8/8", False),
        Control("strict", "flip decisive token", "fail", "fail 8/8", True)))
    assert cell(ws).state == "vacuous"
    assert "swap beyond bar expected fail, got pass 8/8" in cell(ws).text
    assert cell(ws, "exact").state == "pass"  # strict's own controls bit


def test_a_pass_without_controls_is_not_a_full_pass(ws: Workspace) -> None:
    make_record(ws, controls=())
    c = cell(ws)
    assert c.state == "partial" and "unguarded" in c.text


def test_failed_positive_control_is_partial(ws: Workspace) -> None:
    make_record(ws, controls=(Control("near_tie", "swap beyond bar", "fail", "fail 8/8", True),
                              Control("near_tie", "swap within bar", "pass", "fail 8/8", False)))
    c = cell(ws)
    assert c.state == "partial" and "positive control 'swap within bar'" in c.text


def test_newest_record_supersedes_and_records_are_never_rewritten(ws: Workspace) -> None:
    make_record(ws, created="2026-11-30T01:00:00Z", outcome="fail",
                statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8})
    _, newer = make_record(ws, created="2026-11-30T02:00:00Z")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in ws.records.rglob("*.json")}
    c = cell(ws)
    assert c.state == "pass" and c.record == newer.relative_to(ws.root).as_posix()
    write_pages(ws, generate(ws))
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in ws.records.rglob("*.json")}
    assert before == after


def test_explicit_supersedes_retracts_a_newer_record(ws: Workspace) -> None:
    older, older_path = make_record(ws, created="2026-11-30T01:00:00Z", outcome="fail",
                                    statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8})
    wrong, _ = make_record(ws, created="2026-11-30T02:00:00Z")
    make_record(ws, created="2026-11-30T03:00:00Z", candidate="cpp",
                extra={"supersedes": [wrong.id]})  # a correction naming the bad record
    c = cell(ws)
    assert c.record == older_path.relative_to(ws.root).as_posix() and c.state == "fail"


@pytest.mark.parametrize("damage", [
    lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]),        # truncated
    lambda p: p.write_text("{}"),                                            # no fields
    lambda p: p.write_text(p.read_text().replace('"outcome": "pass"', '"outcome": "great"')),
    lambda p: p.write_bytes(b"\xff\xfe not json"),
])
def test_malformed_record_is_a_warning_cell_never_a_crash(ws: Workspace, damage) -> None:  # noqa: ANN001
    _, good = make_record(ws, created="2026-11-30T01:00:00Z")
    _, bad = make_record(ws, created="2026-11-30T02:00:00Z")
    damage(bad)
    g = generate(ws)
    rel = bad.relative_to(ws.root).as_posix()
    c = g.table.cell("near-tie", "hf")
    assert c.state == "pass" and c.record == good.relative_to(ws.root).as_posix()
    assert c.warnings == (f"⚠ unreadable record {rel}",)
    assert g.table.cell("near-tie", "cpp").warnings == ()  # not this candidate's file
    assert f"- ⚠ `{rel}`" in g.features.split("## Unreadable records")[1]
    assert "(1 unreadable)" in g.features


def test_cli_warns_about_unreadable_records_and_still_writes(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HARNESS_ROOT", str(ws.root))
    _, bad = make_record(ws)
    bad.write_text('{"id": ')
    assert main(["features"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: unreadable record reports/records/tiny-llama/smoke/" in err
    assert "⚠ unreadable record" in (ws.root / "FEATURES.md").read_text()


def test_check_fails_when_the_table_is_edited_by_hand(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HARNESS_ROOT", str(ws.root))
    make_record(ws)
    assert main(["features"]) == 0
    assert main(["features", "--check"]) == 0
    f = ws.root / "FEATURES.md"
    f.write_text(f.read_text().replace("☐", "✅"))
    assert main(["features", "--check"]) == 1
    assert "FEATURES.md is not what the generator writes" in capsys.readouterr().err


def test_dead_citations_are_found(ws: Workspace) -> None:
    _, path = make_record(ws)
    g = generate(ws)
    path.unlink()
    rel = path.relative_to(ws.root).as_posix()
    assert check_citations(ws, g.features, g.supported) == [rel]


def test_history_is_newest_first_and_marks_the_shown_record(ws: Workspace) -> None:
    make_record(ws, created="2026-11-30T01:00:00Z", outcome="fail",
                statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8})
    make_record(ws, created="2026-11-30T03:00:00Z", dirty=True)
    make_record(ws, created="2026-11-30T02:00:00Z")
    cat = load_catalog(ws.root / "features.toml", ws)
    h = history(ws, cat, "near-tie", "hf")
    assert [e.lr.record.created for e in h] == ["2026-11-30T03:00:00Z", "2026-11-30T02:00:00Z",
                                                "2026-11-30T01:00:00Z"]
    assert [e.cell.state for e in h] == ["stale", "pass", "fail"]
    # the newest record ran on a dirty tree: the table shows the newest *current* one
    assert [e.current for e in h] == [False, True, False]
    assert h[0].superseded_by is None and h[2].superseded_by == h[1].lr.record.id


def test_a_newer_stale_record_is_mentioned_beside_the_current_one_not_instead(ws: Workspace) -> None:
    """Regression: a gate on an unmerged side branch made the main-line cell show ⌛ although main
    had a valid record for the same cell."""
    _, current = make_record(ws, created="2026-11-30T01:00:00Z")
    _, newer = make_record(ws, created="2026-11-30T02:00:00Z", dirty=True)
    c = cell(ws)
    assert c.state == "pass" and c.record == current.relative_to(ws.root).as_posix()
    assert [path for path, _ in c.newer] == [newer.relative_to(ws.root).as_posix()]
    assert "uncommitted changes" in c.newer[0][1]
    g = generate(ws)
    assert f"newer [record][{refs_of(g.features)[newer.relative_to(ws.root).as_posix()]}] ⌛" in g.features
    assert check_citations(ws, g.features, g.supported) == []
    # with no current record left, the newest stale one is shown, as stale
    current.unlink()
    c = cell(ws)
    assert c.state == "stale" and c.record == newer.relative_to(ws.root).as_posix() and not c.newer


def test_history_cli_and_unknown_feature(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HARNESS_ROOT", str(ws.root))
    make_record(ws)
    assert main(["history", "near-tie"]) == 0
    assert "✅ pass" in capsys.readouterr().out
    assert main(["history", "near-tye"]) == 2
    assert "Did you mean 'near-tie'" in capsys.readouterr().err


def test_supported_models_lists_verified_and_not_verified(ws: Workspace) -> None:
    make_record(ws, created="2026-11-30T01:00:00Z")
    make_record(ws, candidate="cpp", candidate_sha="ab" * 20, created="2026-11-30T02:00:00Z")
    s = generate(ws).supported
    verified = s.split("## Verified models")[1].split("## Settings per model")[0]
    assert f"| tiny-llama | LlamaForCausalLM | full attention, MQA 2q/1kv | — | {PIN.version} | — | smoke v1 | " \
        "hf (transformers 1.0) |" in verified
    settings = s.split("## Settings per model")[1].split("## Not verified")[0]
    assert f"| tiny-llama | smoke | {PIN.version} | 32 | — | float32 | hf |" in settings
    not_verified = s.split("## Not verified")[1].split("## Refused")[0]
    assert "| tiny-llama | smoke | cpp | ⌛ |" in not_verified and "cannot be checked" in not_verified


def test_supported_models_shows_the_current_state_one_line_per_configuration(ws: Workspace) -> None:
    """Regression: the page listed every superseded stale record of a model (ten rows of history)."""
    for hour in range(1, 6):
        make_record(ws, created=f"2026-11-30T0{hour}:00:00Z", dirty=hour % 2 == 0)
    s = generate(ws).supported
    assert s.count("[record][") == 1  # settings: the one current configuration, nothing else cited
    assert "## Not verified" in s and "| — | | | | | |" in s.split("## Not verified")[1].split("##")[0]


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace('prove = ["near_tie"]', 'prove = []', 1), "].prove: expected a non-empty list of comparator names, got []"),
    (lambda s: s.replace('prove = ["near_tie"]', 'prove = ["near_tye"]', 1),
     "suite 'smoke' has no comparator 'near_tye'"),
    (lambda s: s.replace('na = { cpp', 'na = { cp', 1), ".na].cp: unknown column 'cp'. Did you mean 'cpp'"),
    (lambda s: s.replace('id = "exact"', 'id = "near-tie"', 1), "duplicate row id 'near-tie'"),
    (lambda s: s.replace('candidate = "hf"', '', 1), "[columns[0]].candidate: missing (expected a non-empty string)"),
    (lambda s: s + "\n[[[", "not valid TOML"),
])
def test_catalog_errors_name_the_file_and_field(ws: Workspace, edit, needle: str) -> None:  # noqa: ANN001
    p = ws.root / "features.toml"
    p.write_text(edit(CATALOG))
    with pytest.raises(CatalogError) as e:
        load_catalog(p, ws)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_rows_for_suites_not_written_yet_are_not_yet(ws: Workspace) -> None:
    p = ws.root / "features.toml"
    p.write_text(CATALOG.replace('suite = "smoke"\nprove = ["near_tie"]',
                                 'suite = "kv_roundtrip"\nprove = ["byte_equal"]', 1))
    c = cell(ws)
    assert c.state == "todo" and c.text == "no record for hf"


def test_row_specific_candidate_configuration(ws: Workspace) -> None:
    p = ws.root / "features.toml"
    p.write_text(CATALOG.replace('prove = ["near_tie"]\n',
                                 'prove = ["near_tie"]\ncandidates = { hf = "hf:dtype=bfloat16" }\n', 1))
    make_record(ws)  # plain hf: not this row's configuration
    assert cell(ws).state == "todo"
    make_record(ws, candidate="hf:dtype=bfloat16")
    assert cell(ws).state == "pass"


def test_a_glob_column_collects_every_option_string_of_one_engine(ws: Workspace) -> None:
    from harness.features import slug_matches, spec_matches

    assert spec_matches("vllm@0.31.0", "vllm@*") and not spec_matches("vllm", "vllm@*")
    assert spec_matches("hf", "hf") and not spec_matches("hf:dtype=bfloat16", "hf")
    assert slug_matches("vllm-0.31.0", "vllm@*") and not slug_matches("hf", "vllm@*")
    p = ws.root / "features.toml"
    p.write_text(CATALOG.replace('candidate = "cpp"', 'candidate = "vllm@*"'))
    make_record(ws, candidate="vllm@0.31.0")
    assert cell(ws, col="cpp").state == "pass"
    assert cell(ws, col="hf").state == "todo"


def test_a_release_glob_stands_for_the_version_alone() -> None:
    """``@*`` is one release: a configured release is its own row's, never the plain column's."""
    from harness.features import spec_matches

    assert spec_matches("vllm@0.31.0", "vllm@*")
    assert not spec_matches("vllm@0.31.0:dtype=bfloat16", "vllm@*")
    assert not spec_matches("vllm@0.31.0:weights=.cache/planted/m/mlp-L1-1e-01", "vllm@*")
    assert not spec_matches("vllm@0.31.0/harness-store", "vllm@*")
    assert spec_matches("vllm@0.31.0:dtype=bfloat16", "vllm@*:dtype=bfloat16")
    assert not spec_matches("vllm@0.31.0:dtype=float16", "vllm@*:dtype=bfloat16")
    assert spec_matches("vllm@0.31.0/harness-store", "vllm@*/harness-store")
    assert spec_matches("vllm@0.31.0:weights=.cache/planted/m/mlp-L1-1e-01", "vllm@*:weights=*")
    assert spec_matches("vllm-server@0.31.0", "vllm-server@*") and not spec_matches("vllm@0.31.0", "vllm-server@*")
    assert spec_matches("hf:device=cuda,dtype=bfloat16", "hf:device=cuda*")  # other globs span options


def test_a_configured_release_record_leaves_the_plain_release_cell(ws: Workspace) -> None:
    p = ws.root / "features.toml"
    p.write_text(CATALOG.replace('candidate = "cpp"', 'candidate = "vllm@*"'))
    make_record(ws, candidate="vllm@0.31.0:dtype=bfloat16", outcome="fail",
                statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8})
    assert cell(ws, col="cpp").state == "todo"
    make_record(ws, candidate="vllm@0.31.0")
    assert cell(ws, col="cpp").state == "pass"


def test_a_glob_cell_with_several_releases_names_each_and_shows_the_worst(ws: Workspace) -> None:
    """The other-releases column of a KV row: one record per release, each judged on its own."""
    from dataclasses import replace

    from harness.records import write_record

    p = ws.root / "features.toml"
    p.write_text(CATALOG.replace('candidate = "cpp"', 'candidate = "vllm@*"'))
    for version, created, statuses, outcome in (
            ("0.31.0", "2026-11-30T00:00:02Z", None, "pass"),
            ("0.26.0", "2026-11-30T00:00:01Z", {"near_tie": ["pass"] * 7 + ["fail"], "strict": ["pass"] * 8},
             "fail")):
        rec, _ = make_record(ws, candidate=f"vllm@{version}", created=created, statuses=statuses,
                             outcome=outcome, write=False)
        write_record(ws.records, replace(rec, candidate=replace(rec.candidate, version=version)))
    c = cell(ws, col="cpp")
    assert c.state == "partial"  # the worst of the two leads
    assert c.text == "2 releases: 0.26.0 ◐ (near_tie 7/8 (c08)), 0.31.0 ✅"  # in release order
    assert c.record is not None and "vllm-0.31.0" in c.record  # the newest is cited
    # on the page: the cell counts releases passing; its note lists each release on a line of its own
    page = generate(ws).features
    assert "[◐ 1/2][r" in page
    assert "2. ◐ 2 releases, newest @ `" in page  # note 1 is the hf column's ☐
    assert "\n    - 0.26.0 ◐ (near_tie 7/8 (c08))\n    - 0.31.0 ✅\n" in page


def test_a_release_whose_engine_died_before_naming_itself_is_named_by_its_spec() -> None:
    from types import SimpleNamespace

    from harness.features.cells import release_of

    def rec(name: str, version: str) -> SimpleNamespace:
        return SimpleNamespace(candidate=SimpleNamespace(name=name, version=version))

    assert release_of(rec("vllm@0.22.1/vllm.x:ExampleConnector", "unknown")) == "0.22.1"  # type: ignore[arg-type]
    assert release_of(rec("vllm@0.22.1/vllm.x:ExampleConnector", "0.22.1")) == "0.22.1"  # type: ignore[arg-type]
    assert release_of(rec("vllm/harness-store", "unknown")) == "unknown"  # type: ignore[arg-type]


def test_a_section_shows_only_the_columns_that_apply_and_the_glance_its_worst(tmp_path: Path) -> None:
    catalog = CATALOG + """
[[sections]]
title = "Only hf"

[[sections.rows]]
id = "hf-only"
title = "a row no other engine runs"
model = "tiny-llama"
suite = "smoke"
prove = ["strict"]
na = { cpp = "not this engine", oracle = "no goldens" }
"""
    ws = make_git_workspace(tmp_path / "ws", catalog)
    make_record(ws, statuses={"near_tie": ["pass"] * 8, "strict": ["pass"] * 5 + ["fail"] * 3})
    make_record(ws, candidate="cpp", outcome="fail", statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8})
    page = generate(ws).features
    decode, only = page.split("## Decode")[1].split("## Only hf")
    assert "| Feature | Model | `hf` | `cpp` | `oracle` |" in decode
    assert "| Feature | Model | `hf` |" in only and "`cpp`" not in only.split("---")[0]
    glance = page.split("## At a glance")[1].split("## Decode")[0]
    rows = {line.split(" | ")[0]: line for line in glance.splitlines() if line.startswith("| `")}
    # hf: ✅ near-tie, ◐ strict in Decode (worst ◐, 1 of 2 pass); ◐ in the hf-only section
    assert "[◐ 1/2](#decode)" in rows["| `hf`"] and "[◐ 0/1](#only-hf)" in rows["| `hf`"]
    # cpp: ❌ near-tie, n/a for strict; n/a for the whole second section
    assert rows["| `cpp`"].endswith("| [❌ 1/1](#decode) | n/a |".replace("1/1", "0/1"))
    # the worst verdict wins over a pass, and a plain ✅ never counts a ☐ as passed
    assert "✅" not in rows["| `cpp`"]


SECTION_NA = CATALOG.replace('title = "Decode"\n', 'title = "Decode"\nna = { hf = "no engine of this kind" }\n', 1)


def test_a_section_na_applies_to_every_row_and_a_rows_own_entry_wins(ws: Workspace) -> None:
    (ws.root / "features.toml").write_text(SECTION_NA)
    make_record(ws)  # even a passing record: the catalog says the column does not apply
    assert (cell(ws, "near-tie").state, cell(ws, "near-tie").text) == ("na", "no engine of this kind")
    assert cell(ws, "exact").text == "no engine of this kind"
    assert (cell(ws, "exact", "cpp").state, cell(ws, "exact", "cpp").text) == ("na", "not applicable to this engine")
    own = SECTION_NA.replace('na = { cpp = "not applicable', 'na = { hf = "its own reason", cpp = "not applicable', 1)
    (ws.root / "features.toml").write_text(own)
    assert cell(ws, "exact").text == "its own reason" and cell(ws, "near-tie").text == "no engine of this kind"
    assert cell(ws, "near-tie", "cpp").state == "todo"  # the section names hf only


CANNOT_RUN = CATALOG.replace('candidate = "cpp"\n', 'candidate = "cpp"\ncannot_run = { tiny-llama = "no GPU here" }\n', 1)


def test_a_model_a_column_cannot_run_says_why_until_a_record_speaks(ws: Workspace) -> None:
    (ws.root / "features.toml").write_text(CANNOT_RUN)
    c = cell(ws, col="cpp")
    assert (c.state, c.text) == ("na", "cannot be run here: no GPU here")
    assert cell(ws).state == "todo"  # other columns: still not yet
    assert "| `cpp` | engine.cpp | n/a |" in generate(ws).features  # no ☐ left for it at a glance
    make_record(ws, candidate="cpp", outcome="fail", statuses={"near_tie": ["fail"] * 8, "strict": ["fail"] * 8})
    assert cell(ws, col="cpp").state == "fail"  # a record made elsewhere is shown, never hidden


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace("tiny-llama = ", "tiny-lama = ", 1), ".cannot_run].tiny-lama: unknown model 'tiny-lama'. Did you mean 'tiny-llama'"),
    (lambda s: s.replace('"no GPU here"', "3", 1), ".cannot_run].tiny-llama: expected a non-empty string, got 3"),
    (lambda s: s.replace('na = { hf = "no engine', 'na = { hff = "no engine', 1).replace(
        'title = "Decode"\n', 'title = "Decode"\nna = { hff = "x" }\n', 1), ".na].hff: unknown column 'hff'"),
])
def test_section_na_and_cannot_run_errors_name_the_file_and_key(ws: Workspace, edit, needle: str) -> None:  # noqa: ANN001
    p = ws.root / "features.toml"
    p.write_text(edit(CANNOT_RUN))
    with pytest.raises(CatalogError) as e:
        load_catalog(p, ws)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_a_planted_control_caught_only_where_the_stock_engine_fails_is_no_proof(ws: Workspace) -> None:
    from dataclasses import replace

    from harness.api import Verdict
    from harness.records import write_record

    (ws.root / "features.toml").write_text(CATALOG + """
[[sections.rows]]
id = "planted"
title = "a planted fault fails the gate"
model = "tiny-llama"
suite = "smoke"
prove = ["strict"]
candidates = { hf = "hf+planted" }
""")
    caught = {"near_tie": ["pass"] * 5 + ["fail"] * 3, "strict": ["pass"] * 8}
    rec, _ = make_record(ws, candidate="hf+planted", statuses=caught, outcome="fail", write=False,
                         controls=None)
    rec = replace(rec, verdicts=(*rec.verdicts, Verdict("planted", "strict", "pass", "planted caught",
                                                        evidence={"stock": "hf"})))
    write_record(ws.records, rec)
    c = cell(ws, "planted")
    assert c.state == "partial" and "no hf record of smoke" in c.text
    make_record(ws, statuses=caught, outcome="fail", created="2026-11-30T01:00:00Z")  # fails alone
    c = cell(ws, "planted")
    assert c.state == "partial" and "not told apart: caught only by near_tie" in c.text
    make_record(ws, created="2026-11-30T02:00:00Z")  # the stock engine passes every test it failed
    assert cell(ws, "planted").state == "pass"
