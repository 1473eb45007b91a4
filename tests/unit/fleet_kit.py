"""Builders for the fleet's tests: a git workspace whose matrix entries are `cmd:` engines replaying
the committed goldens (a blink each, no model load), one of them with a planted divergence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.goldens import golden_dir, read_golden
from harness.models import resolve_model
from harness.workspace import REPO_ROOT, Workspace
from tests.unit.child_pytest import NO_HYPOTHESIS
from tests.unit.features_kit import commit, make_git_workspace

ENGINE = Path(__file__).with_name("cmd_replay_engine.py")

CATALOG = """
title = "Features"
intro = "fleet test catalog"

[[columns]]
key = "replay"
title = "replay engine"
candidate = "cmd:*"

[[sections]]
title = "Decode"

[[sections.rows]]
id = "near-tie"
title = "near-tie parity"
model = "tiny-llama"
suite = "smoke"
prove = ["near_tie"]
"""


def answers(ws: Workspace, path: Path, *, flip: str | None = None) -> Path:
    """The goldens as the replay engine's answers; ``flip``: that case's first token is replaced by
    one outside the oracle's top-k (near-tie must fail it)."""
    g = read_golden(golden_dir(ws.goldens, resolve_model("tiny-llama", ws), "smoke"),
                    model_name="tiny-llama", suite_name="smoke")
    out = {}
    for cid, o in g.outputs.items():
        ids = list(o.token_ids)
        if cid == flip:
            top = set(o.top_ids[0].tolist())  # type: ignore[union-attr]
            ids[0] = next(t for t in range(512) if t not in top)
        out[cid] = {"token_ids": ids, "text": o.text, "finish_reason": o.finish_reason,
                    "top_ids": o.top_ids.tolist(), "top_logprobs": o.top_logprobs.tolist(),  # type: ignore[union-attr]
                    "chosen_logprobs": o.chosen_logprobs.tolist()}  # type: ignore[union-attr]
    path.write_text(json.dumps(out))
    return path


def replay(answers_file: Path, extra: str = "") -> str:
    return f"cmd:{sys.executable} {ENGINE} {answers_file} ok{extra}"


def fleet_workspace(root: Path, groups: str) -> Workspace:
    """A committed git workspace with the feature catalog above and ``fleet.toml`` = ``groups``
    (with ``{good}`` / ``{bad}`` standing for replay engines without / with a planted divergence)."""
    ws = make_git_workspace(root, catalog=CATALOG)
    good = answers(ws, root / "good.json")
    bad = answers(ws, root / "bad.json", flip="c03")
    text = groups.replace("{good}", replay(good)).replace("{bad}", replay(bad))
    (root / "fleet.toml").write_text("schema = 1\n[devices.cpu]\nshards = 2\n" + text)
    commit(root, "matrix")
    return ws


def pytest_matrix(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``pytest --harness-matrix fleet.toml …`` in ``root`` as its own workspace (as a runner would)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env.update(HARNESS_ROOT=str(root), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *NO_HYPOTHESIS, "-rA",
                           "--harness-matrix", "fleet.toml", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)
