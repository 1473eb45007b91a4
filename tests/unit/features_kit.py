"""Builders for the FEATURES.md / staleness tests: a throwaway git workspace and records in it."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.api import EngineInfo, Verdict
from harness.records import Control, Record, write_record
from harness.workspace import REPO_ROOT, Workspace
from tests.pins import PIN
from tests.unit import record_kit

CASES = tuple(f"c0{i}" for i in range(1, 9))

CATALOG = """
title = "Features"
intro = "test catalog"

[[columns]]
key = "hf"
title = "transformers"
candidate = "hf"

[[columns]]
key = "cpp"
title = "engine.cpp"
candidate = "cpp"
repo = "../engine"

[[sections]]
title = "Decode"

[[sections.rows]]
id = "near-tie"
title = "near-tie parity"
model = "tiny-llama"
suite = "smoke"
prove = ["near_tie"]

[[sections.rows]]
id = "exact"
title = "token-exact"
model = "tiny-llama"
suite = "smoke"
prove = ["strict"]
na = { cpp = "not applicable to this engine" }
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def commit(repo: Path, message: str, touch: str | None = None) -> str:
    if touch:
        p = repo / touch
        p.write_text(p.read_text() + message + "\n" if p.exists() else message + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_git_workspace(root: Path, catalog: str = CATALOG) -> Workspace:
    """suites/smoke, goldens/tiny-llama/smoke, models/tiny-llama, the pin and a catalog, committed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "suites").mkdir()
    shutil.copy(REPO_ROOT / "suites" / "smoke.toml", root / "suites" / "smoke.toml")
    shutil.copytree(REPO_ROOT / "goldens" / "tiny-llama" / "smoke", root / "goldens" / "tiny-llama" / "smoke")
    shutil.copytree(REPO_ROOT / "models" / "tiny-llama", root / "models" / "tiny-llama")
    (root / "requirements").mkdir()
    shutil.copy(REPO_ROOT / "requirements" / "oracle.txt", root / "requirements" / "oracle.txt")
    (root / "features.toml").write_text(catalog)
    git(root, "init", "-q", "-b", "main")
    commit(root, "workspace")
    return Workspace(root)


def ok_controls(comparators: Sequence[str] = ("strict", "near_tie")) -> tuple[Control, ...]:
    return tuple(Control(c, "flip decisive token", "fail", "fail 8/8", True) for c in comparators)


def make_record(ws: Workspace, *, candidate: str = "hf", created: str = "2026-11-30T00:00:00Z",
                harness_sha: str | None = None, dirty: bool = False, candidate_sha: str | None = None,
                statuses: Mapping[str, Sequence[str]] | None = None, outcome: str = "pass",
                controls: Sequence[Control] | None = None, extra: Mapping[str, Any] | None = None,
                pin: str | None = None, settings: Mapping[str, Any] | None = None,
                write: bool = True) -> tuple[Record, Path | None]:
    """A gate record against the workspace's committed goldens (so it is fresh unless told otherwise)."""
    manifest = json.loads((ws.goldens / "tiny-llama" / "smoke" / "manifest.json").read_text())
    statuses = statuses or {"strict": ["pass"] * 8, "near_tie": ["pass"] * 8}
    verdicts = tuple(Verdict(CASES[i], comp, st, f"{comp} {st}",
                             evidence={"reason": "fp8 KV cache needs AVX-512"} if st == "refused" else {})
                     for comp, sts in statuses.items() for i, st in enumerate(sts))
    sha = harness_sha if harness_sha is not None else git(ws.root, "rev-parse", "HEAD")
    rec = record_kit.make_record(
        created=created, sha=sha, dirty=dirty,
        model={"name": "tiny-llama", "digest": manifest["model"]["digest"],
               "architecture": "LlamaForCausalLM", "attention": "full attention, MQA 2q/1kv"},
        suite={"name": "smoke", "version": manifest["suite"]["version"], "digest": "x"},
        oracle={"engine": "vllm", "version": PIN.version, "pin": pin or manifest["oracle"]["pin"],
                "golden_files": manifest["files"], "golden_created": manifest["created"],
                "settings": manifest["oracle"]["settings"]},
        candidate=EngineInfo(candidate, "cpp" if candidate == "cpp" else "transformers", "1.0",
                             candidate_sha, dict(settings or {})),
        outcome=outcome, summary="test record", verdicts=verdicts, gates=("near_tie",),
        controls=tuple(ok_controls() if controls is None else controls), extra=dict(extra or {}))
    return rec, (write_record(ws.records, rec) if write else None)
