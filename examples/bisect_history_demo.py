"""Make the git history `make bisect REPO=...` is shown on in docs/bisect.md: a `cmd:` engine
(examples/cmd_engine.py, transformers, greedy) over ten commits, one of which plants a real
regression and one of which does not build.

    python examples/bisect_history_demo.py /tmp/toy-engine
    make bisect MODEL=tiny-llama SUITE=smoke REPO=/tmp/toy-engine GOOD=v1.0 BAD=main \\
        CANDIDATE='cmd:python {repo}/engine.py {model}' BUILD='python -m py_compile engine.py'

Author, committer and dates are fixed, so the same SHAs come out on every machine. The commits:
engine, docs, a refactor, a syntax error (its build fails: the bisect skips it), the fix, docs,
"a gentle repetition penalty by default" (the regression: greedy decoding is no longer the model's
argmax wherever a token repeats), docs, docs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ENGINE = (Path(__file__).parent / "cmd_engine.py").read_text()
REFACTOR = ENGINE.replace("    ids = torch.tensor([case[\"prompt_ids\"]])\n",
                          "    ids = torch.tensor([case[\"prompt_ids\"]], dtype=torch.long)\n")
BROKEN = REFACTOR.replace("do_sample=False,", "do_sample=False", 1)
REGRESSION = REFACTOR.replace("do_sample=False,", "do_sample=False, repetition_penalty=1.3,", 1)
assert REFACTOR != ENGINE and BROKEN != REFACTOR and REGRESSION != REFACTOR

PLAN: list[tuple[str, str | None, str]] = [
    ("engine.py", ENGINE, "engine: transformers, greedy"),
    ("README", "A toy cmd: engine.\n", "docs: README"),
    ("engine.py", REFACTOR, "engine: prompt ids as int64 explicitly"),
    ("engine.py", BROKEN, "engine: tidy the generate call"),
    ("engine.py", REFACTOR, "engine: fix the syntax error"),
    ("README", "A toy cmd: engine.\nRun: python engine.py MODEL < workload.jsonl\n", "docs: how to run"),
    ("engine.py", REGRESSION, "engine: a gentle repetition penalty by default"),
    ("CHANGES", "1.1: repetition penalty\n", "docs: changes"),
    ("CHANGES", "1.1: repetition penalty\n1.1.1: docs\n", "docs: more changes"),
]


def git(root: Path, *args: str, n: int = 0) -> str:
    stamp = f"2026-01-{n + 1:02d}T12:00:00+00:00"
    env = {**os.environ, "GIT_AUTHOR_NAME": "Toy", "GIT_AUTHOR_EMAIL": "toy@example.com",
           "GIT_COMMITTER_NAME": "Toy", "GIT_COMMITTER_EMAIL": "toy@example.com",
           "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def main(root: Path) -> None:
    if root.exists():
        sys.exit(f"{root} exists: name a new folder")
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for n, (name, text, message) in enumerate(PLAN):
        (root / name).write_text(text or "")
        git(root, "add", name, n=n)
        git(root, "commit", "-q", "-m", message, n=n)
        if n == 0:
            git(root, "tag", "v1.0", n=n)
    print(git(root, "log", "--oneline", "--reverse"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
