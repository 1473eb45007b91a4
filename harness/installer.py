"""How every virtualenv of the project is filled: uv where it can, pip where it cannot.

One recipe for the project's own venv (``make venv`` runs ``python -m harness.installer``), the
release venvs (:mod:`harness.engines.launch.venvs`) and the PyPI engines' venvs
(:mod:`harness.engines.pip.venvs`):

1. ``python -m venv`` (with pip: the fallback, and what ``pip config`` and ``pip index`` answer);
2. ``uv pip install --python <venv>`` with the requirements, uv being the pinned one
   (``requirements/uv.txt``) that ``make venv`` installs into the project's venv;
3. pip instead where uv is missing, where pip's configuration holds a setting uv cannot be given,
   or where uv refuses the install (the stamp says why).

uv reads no pip configuration, so pip's own (``pip config list``: its files and ``PIP_*``) is handed
to it: indexes, find-links, constraints, the certificate bundle, the timeout. uv picks the best
version across all indexes as pip does (``--index-strategy unsafe-best-match``), so both resolve the
same versions. uv links files from one cache (uv's default, or ``$UV_CACHE_DIR``) into every venv
(``--link-mode hardlink``): a release venv that pins the same torch as another costs no copy.
``$HARNESS_INSTALLER=pip`` (``make venv INSTALLER=pip``) makes pip do it all.

Standard library only: ``make venv`` runs this module with a venv that holds nothing yet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALLERS = ("uv", "pip")
UV_REQUIREMENT = Path(__file__).resolve().parents[1] / "requirements" / "uv.txt"
"""The uv pin, ``uv==<version>``: installed into the project's venv by ``make venv``."""

# pip setting -> uv option (a list setting becomes one option per item)
_UV_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraints",
    "trusted-host": "--allow-insecure-host",
    "only-binary": "--only-binary",
    "no-binary": "--no-binary",
}
_UV_FLAGS = {"no-index": "--no-index", "pre": "--prerelease=allow"}
_UV_ENV = {"cert": "SSL_CERT_FILE", "default-timeout": "UV_HTTP_TIMEOUT", "timeout": "UV_HTTP_TIMEOUT"}
_NO_EFFECT = {
    "disable-pip-version-check",
    "no-input",
    "progress-bar",
    "quiet",
    "verbose",
    "no-cache-dir",
    "cache-dir",
    "retries",
    "root-user-action",
    "no-warn-script-location",
    "require-virtualenv",
    "no-color",
    "log",
    "exists-action",
}
"""pip settings that change how pip talks, not what it installs: nothing to hand to uv."""

Run = Callable[[list[str], str, Mapping[str, str]], str]
"""Runs a command (``what`` names it in an error) with extra environment; returns its output."""


class InstallError(RuntimeError):
    """An install failed with every installer tried; the message names the step."""


def uv_pin(requirement: Path = UV_REQUIREMENT) -> str:
    """``uv==<version>`` as ``requirements/uv.txt`` pins it."""
    for line in requirement.read_text().splitlines():
        if re.fullmatch(r"uv==\S+", line.strip()):
            return line.strip()
    raise InstallError(f"{requirement}: no `uv==<version>` line")


def pip_settings(text: str) -> dict[str, str]:
    """pip's effective settings from ``pip config list`` output (``global.find-links='/x'``,
    ``:env:.find-links='/x'``): an ``install.`` setting beats a ``global.`` one, the environment
    (``PIP_*``) beats both."""
    rank = {"global": 0, "install": 1, ":env:": 2}
    best: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([^.=\s]+)\.([A-Za-z0-9_-]+)=(.*)", line.strip())
        if m is None or m.group(1) not in rank:
            continue
        section, key, raw = m.groups()
        value = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw
        key = key.replace("_", "-")
        if key not in best or rank[section] >= best[key][0]:
            best[key] = (rank[section], value)
    return {k: v for k, (_, v) in sorted(best.items())}


def _true(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def uv_options(settings: Mapping[str, str]) -> tuple[list[str], dict[str, str], list[str]]:
    """pip's ``settings`` as uv options and environment, and the settings uv cannot be given
    (where there are any, pip installs: uv would resolve something else)."""
    args = ["--index-strategy", "unsafe-best-match", "--link-mode", "hardlink"]
    env: dict[str, str] = {}
    unknown: list[str] = []
    for key, value in settings.items():
        if key in _UV_OPTIONS:
            for item in value.split():
                args += [_UV_OPTIONS[key], item]
        elif key in _UV_FLAGS:
            args += [_UV_FLAGS[key]] if _true(value) else []
        elif key in _UV_ENV:
            env[_UV_ENV[key]] = value
        elif key not in _NO_EFFECT:
            unknown.append(f"{key}={value}")
    return args, env, unknown


def find_uv(python: Path | str | None = None) -> Path | None:
    """uv beside ``python`` (a venv's, the project's by default), else on ``PATH``."""
    here = Path(python).parent if python else Path(sys.prefix) / "bin"
    for candidate in (here / "uv", Path(sys.prefix) / "bin" / "uv"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("uv")
    return Path(found) if found else None


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out[1] if len(out) > 1 else "unknown"


@dataclass(slots=True)
class Installer:
    """Installs into one venv (``python``) with uv, or pip; ``note`` says why pip, where it is pip."""

    python: Path
    run: Run
    uv: Path | None = None
    """The uv binary; None: pip installs."""
    uv_args: list[str] = field(default_factory=list)
    uv_env: dict[str, str] = field(default_factory=dict)
    note: str = ""
    refused: bool = False
    """uv refused an install: pip does the rest for this venv."""
    used: list[str] = field(default_factory=list)
    """Which installer did each install (``uv``, ``pip``)."""

    @property
    def name(self) -> str:
        return "uv" if self.uv is not None and not self.refused else "pip"

    def _pip(self, args: Sequence[str], what: str, env: Mapping[str, str], fresh: bool) -> str:
        cmd = [
            str(self.python),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            *(["--no-cache-dir"] if fresh else []),
            *args,
        ]
        out = self.run(cmd, what, env)
        self.used.append("pip")
        return out

    def install(
        self, args: Sequence[str], what: str, env: Mapping[str, str] | None = None, fresh: bool = False
    ) -> str:
        """``pip install <args>`` (requirements, ``-r file``, ``-e .``, ``--no-deps``): with uv, and
        with pip where uv refuses (from then on, for this venv). ``fresh``: no cache (a source build
        whose result depends on the environment)."""
        env = dict(env or {})
        if self.name == "pip" or self.uv is None:
            return self._pip(args, what, env, fresh)
        cmd = [
            str(self.uv),
            "pip",
            "install",
            "--python",
            str(self.python),
            *self.uv_args,
            *(["--no-cache"] if fresh else []),
            *args,
        ]
        try:
            out = self.run(cmd, what, {**self.uv_env, **env})
        except Exception as exc:  # noqa: BLE001 - any refusal: pip gets its turn, the stamp says why
            last = str(exc).strip().splitlines()[-1:] or ["?"]
            self.note = f"uv refused ({what}: {last[0][:200]}); pip installed instead"
            self.refused = True
            return self._pip(args, what, env, fresh)
        self.used.append("uv")
        return out

    def uninstall(self, names: Sequence[str], what: str) -> str:
        """Remove ``names`` where installed (absent ones are no error)."""
        if self.name == "uv" and self.uv is not None:
            return self.run(
                [str(self.uv), "pip", "uninstall", "--python", str(self.python), *names], what, self.uv_env
            )
        return self.run([str(self.python), "-m", "pip", "uninstall", "-y", *names], what, {})

    def stamp(self) -> dict[str, Any]:
        """What the venv's stamp says of its installer: ``installer`` (``uv 0.13.9``, ``pip 24.0``, or
        ``uv 0.13.9 + pip 24.0`` where pip finished what uv began), uv's cache, why pip."""
        names = [n for n in INSTALLERS if n in self.used] or [self.name]
        labels = [
            f"uv {_version([str(self.uv), '--version'])}"
            if n == "uv" and self.uv is not None
            else f"pip {_version([str(self.python), '-m', 'pip', '--version'])}"
            for n in names
        ]
        out: dict[str, Any] = {"installer": " + ".join(labels)}
        if "uv" in names and self.uv is not None:
            out["uv_cache"] = _cache_dir(self.uv)
        if self.note:
            out["installer_note"] = self.note
        return out


def _cache_dir(uv: Path) -> str:
    try:
        return subprocess.run(
            [str(uv), "cache", "dir"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def installer_for(python: Path, run: Run, want: str | None = None, uv: Path | None = None) -> Installer:
    """The installer for the venv of ``python``: uv (``uv``, else the one :func:`find_uv` finds) with
    pip's settings, or pip where ``want`` (``$HARNESS_INSTALLER``, default ``uv``) says so, where no
    uv is found, or where pip's configuration has a setting uv cannot be given."""
    want = want or os.environ.get("HARNESS_INSTALLER") or "uv"
    if want not in INSTALLERS:
        raise InstallError(f"HARNESS_INSTALLER={want!r}: expected one of {', '.join(INSTALLERS)}")
    if want == "pip":
        return Installer(python, run, note="pip asked for (make venv INSTALLER=pip, HARNESS_INSTALLER=pip)")
    uv = uv or find_uv(python)
    if uv is None:
        return Installer(python, run, note=f"no uv found (beside {python} nor on PATH)")
    listed = run([str(python), "-m", "pip", "config", "list"], "reading pip's configuration", {})
    args, env, unknown = uv_options(pip_settings(listed))
    if unknown:
        return Installer(python, run, note=f"pip settings uv cannot be given: {', '.join(unknown)}")
    return Installer(python, run, uv=uv, uv_args=args, uv_env=env)


def create_venv(folder: Path, run: Run) -> Path:
    """``python -m venv folder`` with the interpreter the harness runs on; its python."""
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(folder)], f"creating {folder.name}", {})
    return folder / "bin" / "python"


# ---------------------------------------------------------------------------------------------
# make venv


_CHATTER = ("Collecting", "Requirement already", "Using cached", "Downloading", "Processing", "Obtaining",
            "Looking in", "Building", "Created wheel", "Stored in", "Preparing", "Getting requirements",
            "Installing build", "Attempting", "Found existing", "Uninstalling", "Successfully uninstalled")


def _plain_run(cmd: list[str], what: str, env: Mapping[str, str]) -> str:
    """Run ``cmd`` for ``make venv``: its summary lines shown as they come (uv's ``Resolved 151
    packages in 2.4s``, pip's ``Successfully installed``), not one line per package."""
    print("+", shlex.join(cmd), flush=True)
    lines: list[str] = []
    with subprocess.Popen(cmd, env={**os.environ, "PIP_NO_INPUT": "1", **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.strip() and not line[0].isspace() and not line.startswith(_CHATTER) \
                    and cmd[-2:] != ["config", "list"]:
                sys.stdout.write(line[:300] + ("\n" if len(line) > 300 else ""))
                sys.stdout.flush()
    out = "".join(lines)
    if proc.returncode != 0:
        raise InstallError(f"{what} failed (exit {proc.returncode}): {out.strip()[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.installer",
        description="fill a venv (uv, pip where uv cannot) and write its stamp",
    )
    p.add_argument("--venv", type=Path, required=True)
    p.add_argument("--installer", choices=INSTALLERS, default=os.environ.get("HARNESS_INSTALLER") or "uv")
    p.add_argument("--remove", nargs="*", default=[], help="packages to uninstall afterwards")
    p.add_argument("--stamp", type=Path, help="where to write what was installed, by what, in how long")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then pip install arguments")
    a = p.parse_args(argv)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    python = a.venv / "bin" / "python"
    t0 = time.perf_counter()
    uv, bootstrap = None, ""
    if a.installer == "uv":
        uv, pin = a.venv / "bin" / "uv", uv_pin()
        if not uv.exists() or _version([str(uv), "--version"]) != pin.partition("==")[2]:
            try:
                _plain_run(
                    [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", pin],
                    f"installing {pin}",
                    {},
                )
            except InstallError as exc:
                uv, bootstrap = None, f"installing {pin} failed: {str(exc)[-200:]}"
    inst = installer_for(python, _plain_run, a.installer, uv=uv)
    inst.note = "; ".join(n for n in (bootstrap, inst.note) if n)
    if inst.note:
        print(f"harness.installer: pip installs ({inst.note})", flush=True)
    inst.install(args, f"installing {' '.join(args)}")
    if a.remove:
        inst.uninstall(a.remove, f"removing {' '.join(a.remove)}")
    took = time.perf_counter() - t0
    stamp = {
        **inst.stamp(),
        "install_s": round(took, 1),
        "requirements": args,
        "removed": a.remove,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"harness.installer: {stamp['installer']} filled {a.venv} in {took:.0f} s", flush=True)
    if a.stamp is not None:
        tmp = a.stamp.with_name(a.stamp.name + ".tmp")
        tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, a.stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
