"""The one install recipe (harness/installer.py, harness.engines.launch.venvs.new_venv/ensure_venv): pip's
settings handed to uv, uv where it is, pip where uv is missing, refuses (a planted uv that always
fails) or cannot be given a setting, and a stamp that names the installer. Real venvs, real pip,
real uv (the one ``make venv`` installs beside the project's python; skipped where there is none),
a tiny wheel written here, installed with ``--no-index``."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.engines.launch.procs import pid_running
from harness.engines.launch.venvs import VenvError, ensure_venv, new_venv, read_venv, run_logged
from harness.installer import InstallError, find_uv, installer_for, pip_settings, uv_options, uv_pin

ROOT = Path(__file__).resolve().parents[2]
UV = find_uv()
needs_uv = pytest.mark.skipif(UV is None, reason="no uv beside this python nor on PATH (make venv installs it)")

PIP_CONFIG_LIST = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///srv/a/simple file:///srv/b/simple'
global.find-links='/srv/global-wheels'
global.index-url='https://mirror.example/simple'
install.find-links='/srv/install-wheels'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/srv/wheels'
"""


def test_pip_settings_take_the_environment_over_install_over_global() -> None:
    got = pip_settings(PIP_CONFIG_LIST)
    assert got["find-links"] == "/srv/wheels"
    assert got["extra-index-url"] == "file:///srv/a/simple file:///srv/b/simple"
    assert got["default-timeout"] == "180"
    assert pip_settings(PIP_CONFIG_LIST.replace(":env:.find-links='/srv/wheels'\n", ""))["find-links"] \
        == "/srv/install-wheels"


def test_every_pip_setting_that_decides_what_is_installed_reaches_uv() -> None:
    args, env, unknown = uv_options(pip_settings(PIP_CONFIG_LIST))
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert ("--extra-index-url", "file:///srv/a/simple") in pairs and ("--extra-index-url", "file:///srv/b/simple") in pairs
    assert ("--find-links", "/srv/wheels") in pairs and ("--constraints", "/etc/pip/constraints.txt") in pairs
    assert ("--index-strategy", "unsafe-best-match") in pairs, "pip's choice: the best version of all indexes"
    assert ("--link-mode", "hardlink") in pairs
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}
    assert unknown == []
    _, _, unknown = uv_options({"use-feature": "truststore", "pre": "1", "quiet": "1"})
    assert unknown == ["use-feature=truststore"]


def test_the_uv_pin_is_one_exact_version() -> None:
    pin = uv_pin()
    assert pin.startswith("uv==") and pin.count(".") == 2
    with pytest.raises(InstallError, match="no `uv==<version>` line"):
        uv_pin(ROOT / "requirements" / "oracle.txt")


def test_the_installer_module_runs_on_a_python_without_site_packages() -> None:
    """`make venv` runs it with a venv that holds nothing yet: the standard library only."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import harness.installer as i; print(i.INSTALLERS)"
    res = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "uv" in res.stdout


def _wheel(folder: Path, name: str = "harness_probe", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel: one module that prints its version."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(text.encode())}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def _probe(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import harness_probe; print(harness_probe.VERSION)"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


@needs_uv
def test_uv_fills_a_release_style_venv_and_the_stamp_names_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HARNESS_INSTALLER", raising=False)
    wheel = _wheel(tmp_path)

    def install(folder: Path, version: str, log: Path) -> dict:
        inst = new_venv(folder, log, f"harness-probe=={version}")
        assert inst.name == "uv", inst.note
        inst.install(["--no-index", str(wheel)], "installing the probe")
        inst.uninstall(["harness-probe-absent"], "removing what is not there")  # no error
        return inst.stamp()

    info = ensure_venv(tmp_path / "venvs" / "probe-1.0", "1.0", install, ("harness-probe",))
    assert info.installer.startswith("uv ") and info.packages == {"harness-probe": "1.0"}
    assert info.build["uv_cache"] and "installer_note" not in info.build
    assert _probe(info.python) == "1.0"
    again = read_venv(info.path)
    assert again is not None and again.installer == info.installer
    assert json.loads((info.path / ".harness-venv.json").read_text())["installer"] == info.installer


@pytest.fixture(scope="module")
def probe_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One venv made by ``new_venv`` for the tests below (its python): each installs a probe version
    of its own into it and reads that version back."""
    folder = tmp_path_factory.mktemp("venv")
    return new_venv(folder / "probe", folder / "probe.install.log", "harness-probe").python


def test_a_refusing_uv_hands_the_install_to_pip_and_the_stamp_says_so(tmp_path: Path, monkeypatch,
                                                                      probe_venv: Path) -> None:
    monkeypatch.delenv("HARNESS_INSTALLER", raising=False)
    planted = tmp_path / "uv"  # a uv that refuses everything but --version
    planted.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'uv 0.0.1' && exit 0\n"
                       "echo 'error: planted refusal' >&2; exit 2\n")
    planted.chmod(0o755)
    log = tmp_path / "probe.install.log"

    def run(cmd: list[str], what: str, env) -> str:
        return run_logged(cmd, log, what, env)

    inst = installer_for(probe_venv, run, uv=planted)
    assert inst.name == "uv"
    inst.install(["--no-index", str(_wheel(tmp_path, version="1.1"))], "installing the probe")
    assert inst.name == "pip" and _probe(inst.python) == "1.1"
    stamp = inst.stamp()
    assert stamp["installer"].startswith("pip ") and "planted refusal" in stamp["installer_note"]
    assert "uv refused" in stamp["installer_note"]


def test_pip_installs_when_asked_or_when_a_pip_setting_has_no_uv_equivalent(tmp_path: Path, monkeypatch,
                                                                             probe_venv: Path) -> None:
    log = tmp_path / "log"

    def run(cmd: list[str], what: str, env) -> str:
        return run_logged(cmd, log, what, env)

    asked = installer_for(probe_venv, run, want="pip")
    assert asked.name == "pip" and "HARNESS_INSTALLER=pip" in asked.note
    monkeypatch.setenv("PIP_PREFER_BINARY", "1")  # pip-only: uv has no such choice
    odd = installer_for(probe_venv, run, want="uv", uv=Path(sys.executable))  # any executable: never run
    assert odd.name == "pip" and "prefer-binary=1" in odd.note
    odd.install(["--no-index", str(_wheel(tmp_path, version="1.2"))], "installing the probe")
    assert _probe(probe_venv) == "1.2" and odd.stamp()["installer"].startswith("pip ")
    with pytest.raises(InstallError, match="HARNESS_INSTALLER='conda'"):
        installer_for(probe_venv, run, want="conda")


def test_make_venvs_entry_point_fills_the_venv_and_writes_a_stamp_naming_the_installer(tmp_path: Path) -> None:
    """``python -m harness.installer`` as the Makefile runs it (pip here: uv's bootstrap needs the
    package index), removals included; the stamp is JSON, written last."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    wheel = _wheel(tmp_path)
    stamp = venv / ".installed"
    res = subprocess.run([str(venv / "bin/python"), "-m", "harness.installer", "--venv", str(venv), "--installer",
                          "pip", "--stamp", str(stamp), "--remove", "harness-probe-absent", "--",
                          "--no-index", str(wheel)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(stamp.read_text())
    assert got["installer"].startswith("pip ") and "INSTALLER=pip" in got["installer_note"]
    assert got["requirements"] == ["--no-index", str(wheel)] and got["install_s"] > 0
    assert _probe(venv / "bin/python") == "1.0"
    assert "filled" in res.stdout


def test_a_step_past_its_limit_is_stopped_with_everything_it_started(tmp_path: Path) -> None:
    """A build step's compilers are its children's children: giving up on the step stops them too
    (a timed-out vllm.cpp build once left ninja compiling for minutes after the harness had gone)."""
    pidfile, log = tmp_path / "grandchild.pid", tmp_path / "step.log"
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    with pytest.raises(VenvError, match=r"planted step: gave up after 1 s"):
        run_logged(["sh", "-c", script], log, "planted step", timeout_s=1)
    grandchild = int(pidfile.read_text())
    assert not pid_running(grandchild), "the step's own child outlived the step"
    assert log.read_text().startswith("$ sh -c")


def test_a_step_within_its_limit_returns_its_output(tmp_path: Path) -> None:
    out = run_logged(["sh", "-c", "echo made"], tmp_path / "step.log", "planted step", timeout_s=30)
    assert out.strip() == "made"
