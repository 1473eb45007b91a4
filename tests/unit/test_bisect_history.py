"""A bisect over a synthetic git history of a tiny `cmd:` engine (made here, in a temporary folder):
the engine replays the goldens, and one commit plants a regression (c03 answers a token outside the
oracle's top-k). The bisect finds that commit; a commit that cannot build is skipped and said so;
a skipped commit next to the regression makes a tie naming both; every step's record carries its SHA."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.bisect import BisectError
from harness.bisect.run import bisect_history
from harness.record_paths import portable
from harness.records import load_record
from harness.workspace import REPO_ROOT, Workspace

from .features_kit import commit, git, make_git_workspace
from .test_bisect_releases import flipped, outputs

ENGINE = '''"""A tiny cmd: engine: answers each workload line from answers.json beside it."""
import json, os, sys
FLIP = {flip}
here = os.path.dirname(os.path.abspath(__file__))
answers = json.load(open(os.path.join(here, "answers.json")))
bad = json.load(open(os.path.join(here, "bad.json")))
for line in sys.stdin:
    case = json.loads(line)
    out = dict(id=case["id"], **answers[case["id"]])
    if FLIP and case["id"] == "c03":
        out["token_ids"] = bad
    print(json.dumps(out), flush=True)
'''
BUILD = "test ! -e BROKEN && python3 -c 'import ast,sys; ast.parse(open(\"engine.py\").read())'"


def engine_repo(root: Path, ws: Workspace, plan: list[str]) -> list[str]:
    """A repository whose commits follow ``plan``: ``good`` / ``flip`` (the regression) / ``break`` (the
    build fails) / ``mend`` (it builds again) / ``doc``. Returns the SHAs, oldest first."""
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    golden = outputs(ws)
    (root / "answers.json").write_text(json.dumps({cid: {
        "token_ids": list(o.token_ids), "top_ids": o.top_ids.tolist(),  # type: ignore[union-attr]
        "top_logprobs": o.top_logprobs.tolist(), "chosen_logprobs": o.chosen_logprobs.tolist()}  # type: ignore[union-attr]
        for cid, o in golden.items()}))
    (root / "bad.json").write_text(json.dumps(list(flipped(golden["c03"]).token_ids)))
    shas = []
    for i, step in enumerate(plan):
        if step in ("good", "flip"):
            (root / "engine.py").write_text(ENGINE.format(flip=step == "flip"))
        elif step == "break":
            (root / "BROKEN").write_text("the build fails here\n")
        elif step == "mend":
            (root / "BROKEN").unlink()
        shas.append(commit(root, f"{i}: {step}", touch="NOTES" if step == "doc" else None))
    return shas


CANDIDATE = f"cmd:{sys.executable} {{repo}}/engine.py {{model}}"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_git_workspace(tmp_path / "ws")


def test_the_planted_regression_is_found_and_a_broken_build_is_skipped(ws: Workspace, tmp_path: Path) -> None:
    shas = engine_repo(tmp_path / "engine", ws, ["good", "doc", "break", "mend", "doc", "doc", "flip", "doc",
                                                  "doc"])
    done = bisect_history(ws, "tiny-llama", "smoke", tmp_path / "engine", shas[0], shas[-1], CANDIDATE,
                          build=BUILD)
    r = done.result
    assert r.kind == "found" and r.first_new == shas[6] and r.last_old == shas[5], r
    b = done.record.extra["bisect"]
    assert [(d["case"], d["comparator"], d["after"]) for d in b["diff"]] == [("c03", "near_tie", "fail"),
                                                                            ("c03", "strict", "fail")]
    for s in b["steps"]:
        if s["record"]:
            step = load_record(ws.root / s["record"])
            assert step.candidate.sha == s["point"]  # the per-SHA truth of that commit
            # {repo} as written; the interpreter's path as records write every machine path
            assert step.candidate.settings["command"] == portable(CANDIDATE.partition(":")[2], (ws.root, REPO_ROOT))
        else:
            assert s["state"] == "skip" and s["point"] == shas[2]
            assert s["reason"].startswith(f"cannot build {shas[2][:10]}: the build exited with 1")
    assert done.record.summary.startswith(f"first commit whose verdicts differ from {shas[0][:10]}'s: "
                                          f"{shas[6][:10]} (broke")
    assert done.record.candidate.sha is None  # the bisect is about many commits; its steps carry theirs
    assert git(tmp_path / "engine", "status", "--porcelain") == ""  # the repository itself is untouched


def test_an_unbuildable_commit_next_to_the_regression_is_a_tie(ws: Workspace, tmp_path: Path) -> None:
    shas = engine_repo(tmp_path / "engine", ws, ["good", "doc", "doc", "break", "flip", "mend", "doc"])
    done = bisect_history(ws, "tiny-llama", "smoke", tmp_path / "engine", shas[0], shas[-1], CANDIDATE,
                          build=BUILD)
    r = done.result
    # 3 cannot build; 4 plants the flip but cannot build either (BROKEN is still there); 5 mends it
    assert r.kind == "ambiguous" and r.candidates == (shas[3], shas[4], shas[5]) and r.last_old == shas[2]
    assert done.record.outcome == "skip"


def test_bad_input_names_what_is_wrong(ws: Workspace, tmp_path: Path) -> None:
    shas = engine_repo(tmp_path / "engine", ws, ["good", "flip"])
    repo = tmp_path / "engine"
    with pytest.raises(BisectError, match="is not an ancestor of --bad"):
        bisect_history(ws, "tiny-llama", "smoke", repo, shas[1], shas[0], CANDIDATE)
    with pytest.raises(BisectError, match="--good 'nope' is not a commit"):
        bisect_history(ws, "tiny-llama", "smoke", repo, "nope", shas[0], CANDIDATE)
    with pytest.raises(BisectError, match="runs a `cmd:` engine"):
        bisect_history(ws, "tiny-llama", "smoke", repo, shas[0], shas[1], "hf")
    with pytest.raises(BisectError, match="not a git repository"):
        bisect_history(ws, "tiny-llama", "smoke", tmp_path, shas[0], shas[1], CANDIDATE)
    assert not list(ws.records.rglob("*.json"))
