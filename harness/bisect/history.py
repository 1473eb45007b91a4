"""A bisect over a candidate's git history: each step is one commit of a ``cmd:`` engine's repository.

``harness bisect --repo PATH --good SHA --bad SHA --candidate 'cmd:...' [--build CMD]``. The points
are GOOD, then every commit on the first-parent line from GOOD to BAD (``git rev-list --first-parent
--ancestry-path``: a merge is one step, named by its merge commit). Each step:

1. checks the commit out in a scratch clone under the run folder (``git clone --shared``, so the
   repository itself is never touched; ``git clean -ffdx`` between steps, so nothing built for one
   commit is used by the next);
2. runs ``--build`` there (``sh -c``, its process group killed after ``HARNESS_BISECT_BUILD_TIMEOUT_S``,
   default 1800 s); a build that fails is a skip naming the exit code and the log's last lines,
   as ``git bisect skip`` would be: that commit is neither good nor bad;
3. gates the candidate command, run inside the checkout (``{repo}`` is its path, ``{model}`` the
   model's), through :func:`harness.pipeline.run_gate`: a normal record whose candidate carries the
   commit's SHA (``EngineInfo.sha``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from harness.bisect import BisectError
from harness.bisect.verdicts import Focus, Observation, observe, rel_path, unrun
from harness.excerpt import NOTE, tail
from harness.models import ModelRef
from harness.suites import Suite
from harness.workspace import Workspace

BUILD_TIMEOUT_S = float(os.environ.get("HARNESS_BISECT_BUILD_TIMEOUT_S", "1800"))
LOG_TAIL = 600


def git(repo: Path, *args: str, timeout: float = 120) -> str:
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        raise BisectError(f"git {' '.join(args)} in {repo}: {e}") from None
    if r.returncode != 0:
        raise BisectError(f"git {' '.join(args)} in {repo} failed: {tail(r.stderr.strip(), NOTE)}")
    return r.stdout.strip()


def commits(repo: Path, good: str, bad: str) -> list[str]:
    """GOOD, then the first-parent line of commits from GOOD to BAD (full SHAs, oldest first)."""
    try:
        git(repo, "rev-parse", "--git-dir")
    except BisectError:
        raise BisectError(f"--repo {repo}: not a git repository") from None
    ends = []
    for name, ref in (("--good", good), ("--bad", bad)):
        try:
            ends.append(git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"))
        except BisectError:
            raise BisectError(f"{name} {ref!r} is not a commit of {repo}") from None
    g, b = ends
    if g == b:
        raise BisectError(f"--good and --bad are the same commit ({g[:10]})")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", g, b]).returncode != 0:
        raise BisectError(f"--good {good} ({g[:10]}) is not an ancestor of --bad {bad} ({b[:10]}): a bisect "
                          f"walks from an older commit to a newer one (for 'first fixed', give the older, "
                          f"failing commit as --good)")
    line = git(repo, "rev-list", "--reverse", "--first-parent", "--ancestry-path", f"{g}..{b}").split()
    return [g, *line]


def check_candidate(spec: str) -> str:
    """The command of a ``cmd:`` spec (only a command can be rebuilt and rerun per commit)."""
    name, _, command = spec.partition(":")
    if name != "cmd" or not command.strip():
        raise BisectError(f"--candidate {spec!r}: a bisect over a repository's history runs a `cmd:` engine "
                          f"built from each commit, e.g. 'cmd:python {{repo}}/engine.py {{model}}'")
    return command


def build(checkout: Path, command: str, log: Path) -> str | None:
    """Run ``command`` in ``checkout``; None when it succeeded, else why not (exit code, log tail)."""
    from harness.engines.launch.procs import kill_group, parent_death_signal, track

    with log.open("wb") as fh:
        proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=checkout, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=parent_death_signal())
        track(proc)
        why = None
        try:
            proc.wait(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            why = f"the build did not finish within {BUILD_TIMEOUT_S:g} s and was killed"
        finally:
            kill_group(proc, grace_s=3.0)
    if why is None and proc.returncode != 0:
        why = f"the build exited with {proc.returncode}"
    if why is None:
        return None
    return f"{why}; log tail: {tail(log.read_text(errors='replace').strip(), LOG_TAIL)!r}"


def history_probe(ws: Workspace, model: ModelRef, suite: Suite, repo: Path, candidate: str, *, focus: Focus,
                  build_cmd: str | None, work: Path,
                  progress: Callable[[str], None] = lambda s: None) -> Callable[[str], Observation]:
    """The probe of one commit (see the module doc); ``work``: the scratch folder of this bisect."""
    from harness.engines.cmd.runner import CmdRunner
    from harness.pipeline import run_gate

    command = check_candidate(candidate)
    checkout = work / "checkout"
    if checkout.exists():
        shutil.rmtree(checkout)
    work.mkdir(parents=True, exist_ok=True)
    git(work, "clone", "--quiet", "--shared", "--no-checkout", str(repo.resolve()), str(checkout),
        timeout=600)

    def probe(sha: str) -> Observation:
        t0 = time.perf_counter()
        git(checkout, "checkout", "--quiet", "--force", "--detach", sha)
        git(checkout, "clean", "-ffdxq")
        facts = {}
        if build_cmd:
            b0 = time.perf_counter()
            failed = build(checkout, build_cmd, work / f"build-{sha[:12]}.log")
            facts["build_s"] = round(time.perf_counter() - b0, 1)
            if failed is not None:
                progress(f"{sha[:10]}: build failed")
                return unrun(sha, f"cannot build {sha[:10]}: {failed}", time.perf_counter() - t0, facts)
        runner = CmdRunner(command, model, name=candidate, run_dir=ws.runs, cwd=checkout,
                           sha=sha)
        res = run_gate(ws, model, suite, candidate, runner=runner, auto_record=False,
                       speed="a bisect step is not timed against the oracle")
        return observe(sha, res.record, rel_path(ws.root, res.path), focus, time.perf_counter() - t0, facts)

    return probe
