"""The storage-fault suite without an engine: each fault really applied (files, the preloaded shim,
mount namespaces), the verdict rule, the [kv.faults] table, and the two connector doubles as controls
(the digest-checking one comes through every fault, the I/O-error-ignoring one is caught by every
fault, and a fault that does not reach the load makes its row vacuous)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.kinds.kv.faults import controls as fault_controls
from harness.kinds.kv.faults.controls import double_row, run_double_controls
from harness.kinds.kv.faults.inject import (
    FAULTS,
    FaultError,
    build_shim,
    can_mount,
    copy_store,
    damage,
    fault,
    flip_byte,
    mount_wrap,
    opened,
    pick_data_file,
    settle_kept,
    shim_env,
    shim_log,
    store_difference,
    truncate_file,
)
from harness.kinds.kv.faults.verdict import RowFacts, classify, double_controls, vacuity_controls, verdict
from harness.kinds.kv.settings import KVSettings
from harness.suites import SuiteError, load_suite

STORAGE = [f.name for f in FAULTS if f.when != "cycle"]
needs_mount = pytest.mark.skipif(can_mount() is not None, reason=str(can_mount()))


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_shim(tmp_path_factory.mktemp("shim"))
    except FaultError as e:
        pytest.skip(str(e))


def _read_in_child(path: Path, env: dict[str, str]) -> dict[str, object]:
    code = ("import json,sys\ntry:\n data=open(sys.argv[1],'rb').read(); print(json.dumps({'n':len(data)}))\n"
            "except OSError as e:\n print(json.dumps({'errno':e.errno}))")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(path)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def test_truncate_and_flip_change_exactly_what_they_say(tmp_path: Path) -> None:
    a = tmp_path / "a.kv"
    a.write_bytes(bytes(range(256)) * 4)
    fact = truncate_file(a)
    assert fact == {"file": "a.kv", "size_before": 1024, "size_after": 512}
    assert a.read_bytes() == (bytes(range(256)) * 4)[:512]
    b = tmp_path / "b.kv"
    b.write_bytes(bytes(1000))
    fact = flip_byte(b)
    data = b.read_bytes()
    assert fact["offset"] == 500 and data[500] == 1 and sum(data) == 1, "one byte, in the middle, xor 1"


def test_damage_picks_the_largest_file_and_refuses_nothing_to_damage(tmp_path: Path) -> None:
    small, big = tmp_path / "x.json", tmp_path / "x.kv"
    small.write_text("{}")
    big.write_bytes(b"k" * 100)
    assert pick_data_file([small, big]) == big
    fact, watched = damage("truncated", [small, big])
    assert fact["file"] == "x.kv" and watched == [big], "the shim watches the damaged file only"
    with pytest.raises(FaultError, match="stored no file"):
        damage("removed", [])
    with pytest.raises(ValueError, match="did you mean truncated"):
        fault("truncate")


def test_store_difference_sees_lost_and_short_files(tmp_path: Path) -> None:
    clean, other = tmp_path / "clean", tmp_path / "other"
    (clean / "k").mkdir(parents=True)
    (clean / "k" / "0.kv").write_bytes(b"a" * 10)
    (clean / "k" / "1.kv").write_bytes(b"b" * 10)
    copy_store(clean, other)
    assert store_difference(clean, other) is None, "an unchanged copy is no fault"
    (other / "k" / "0.kv").write_bytes(b"a" * 4)
    (other / "k" / "1.kv").unlink()
    diff = store_difference(clean, other)
    assert diff is not None and "1 missing" in diff and "1 cut short" in diff and "4/20 bytes" in diff


def test_shim_fails_opens_with_eio_and_logs_them(tmp_path: Path, shim: Path) -> None:
    hit, miss = tmp_path / "hit.kv", tmp_path / "miss.kv"
    hit.write_bytes(b"x" * 10)
    miss.write_bytes(b"y" * 7)
    log = tmp_path / "opens.log"
    env = shim_env(shim, "eio", [hit], log)
    assert _read_in_child(hit, env) == {"errno": errno.EIO}
    assert _read_in_child(miss, env) == {"n": 7}, "a file not named is untouched"
    assert [(m, p) for m, _, p in shim_log(log)] == [("eio", str(hit))]
    subprocess.run([sys.executable, "-I", "-c", f"open({str(hit)!r}, 'ab').write(b'z')"], env=env, check=True)
    assert hit.read_bytes() == b"x" * 10 + b"z", "opens for writing pass through"


def test_shim_vanish_removes_the_file_between_lookup_and_load(tmp_path: Path, shim: Path) -> None:
    f = tmp_path / "chunk" / "layer.safetensors"
    f.parent.mkdir()
    f.write_bytes(b"x" * 10)
    log = tmp_path / "opens.log"
    assert f.exists(), "the lookup finds it"
    assert _read_in_child(f, shim_env(shim, "vanish", [f], log)) == {"errno": errno.ENOENT}
    assert not f.exists() and opened(log) is not None


def test_shim_watch_proves_the_damaged_file_was_read(tmp_path: Path, shim: Path) -> None:
    f = tmp_path / "a.kv"
    f.write_bytes(b"x" * 3)
    log = tmp_path / "opens.log"
    assert opened(log) is None
    assert _read_in_child(f, shim_env(shim, "watch", [f], log)) == {"n": 3}
    assert opened(log) is not None and "a.kv" in str(opened(log))
    with pytest.raises(ValueError, match="shim mode"):
        shim_env(shim, "explode", [f], log)


@needs_mount
def test_no_space_is_a_real_small_filesystem(tmp_path: Path) -> None:
    store, keep = tmp_path / "store", tmp_path / "keep"
    code = ("import errno,sys\ntry:\n open(sys.argv[1]+'/f','wb').write(b'x'*65536)\n"
            "except OSError as e:\n sys.exit(7 if e.errno==errno.ENOSPC else 1)")
    rc = subprocess.run([*mount_wrap("no_space", store, keep, 16384), sys.executable, "-I", "-c", code, str(store)],
                        capture_output=True).returncode
    assert rc == 7, "ENOSPC mid-write"
    settle_kept(store, keep)
    assert (store / "f").stat().st_size == 16384, "the consumer finds what the full filesystem held"


@needs_mount
def test_read_only_store_refuses_writes(tmp_path: Path) -> None:
    store, keep = tmp_path / "store", tmp_path / "keep"
    code = ("import errno,sys\ntry:\n open(sys.argv[1]+'/f','wb')\n"
            "except OSError as e:\n sys.exit(7 if e.errno==errno.EROFS else 1)")
    rc = subprocess.run([*mount_wrap("read_only", store, keep), sys.executable, "-I", "-c", code, str(store)],
                        capture_output=True).returncode
    assert rc == 7
    settle_kept(store, keep)
    assert store.is_dir() and not any(store.iterdir())


@pytest.mark.parametrize(("facts", "want"), [
    (RowFacts("truncated", False, "never opened", pages_wrong=3, engine_error="x"), "vacuous"),
    (RowFacts("byte_flipped", True, "", 8, 1), "wrong"),
    (RowFacts("byte_flipped", True, "", 8, 0, ("c: differs at token 2",)), "wrong"),
    (RowFacts("removed", True, "", 0, 0, (), "consumer: FileNotFoundError"), "engine_error"),
    (RowFacts("read_error", True, "", 0, 0, (), None, "load failed"), "refused"),
    (RowFacts("read_error", True, "", 0, 0), "recomputed"),
    (RowFacts("evict_cycles", True, "", 24, 0), "intact"),
])
def test_classify(facts: RowFacts, want: str) -> None:
    assert classify(facts) == want


def test_vacuous_row_makes_a_vacuating_control() -> None:
    v = verdict(RowFacts("truncated", False, "the damaged files were never opened"), "how")
    assert v.status == "skip" and "VACUOUS" in v.summary
    (c,) = vacuity_controls([v])
    assert c.vacuates
    assert not vacuity_controls([verdict(RowFacts("truncated", True, "opened"), "how")])


@needs_mount
def test_doubles_digest_passes_every_row_careless_fails_every_row(tmp_path: Path, shim: Path) -> None:
    controls, info = run_double_controls(STORAGE, tmp_path, shim)
    assert len(controls) == 2 * len(STORAGE)
    bad = [f"{c.mutation}: {c.got} ({c.note})" for c in controls if not c.ok]
    assert not bad, bad
    assert all("❌ served wrong bytes" in line for line in info["careless"].values())
    assert all("✅" in line for line in info["digest"].values())


def test_a_fault_that_misses_the_load_is_vacuous_never_passed(tmp_path: Path, shim: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the damage lands on a file the double never opens (a copy beside the store)."""
    real = fault_controls.damage

    def misplaced(name: str, files: list[Path]) -> tuple[dict[str, object], list[Path]]:
        elsewhere = files[0].parent.parent / "elsewhere.bin"
        elsewhere.write_bytes(b"z" * 9)
        return real(name, [elsewhere])

    monkeypatch.setattr(fault_controls, "damage", misplaced)
    row = double_row("careless", "truncated", tmp_path, shim)
    assert classify(row) == "vacuous", row
    (c,) = double_controls({"careless": {"truncated": row}})
    assert not c.ok and c.vacuates


def test_fault_table_errors_name_the_key(tmp_path: Path) -> None:
    src = Path("suites/kv_faults.toml").read_text()
    bad = tmp_path / "kv_faults.toml"
    bad.write_text(src.replace('target = "n_2c_plus_k"', 'target = "n_2c_plus_k"\nfaults = ["no_spcae"]'))
    with pytest.raises(SuiteError, match=r"\[kv\.faults\]\.faults.*did you mean no_space"):
        KVSettings.from_suite(load_suite(bad))
    bad.write_text(src.replace('target = "n_2c_plus_k"', 'target = "nope"'))
    with pytest.raises(SuiteError, match=r"\[kv\.faults\]\.target.*nope"):
        KVSettings.from_suite(load_suite(bad))
    kv = KVSettings.from_suite(load_suite(Path("suites/kv_faults.toml")))
    assert kv.faults is not None and kv.faults.target == "n_2c_plus_k"
    assert kv.faults.faults == tuple(f.name for f in FAULTS), "default: every fault"


def test_the_docs_table_is_the_committed_records() -> None:
    from harness.kinds.kv.faults.table import block, committed

    root = Path("reports/records")
    assert committed(root), "no kv_faults record is committed"
    assert block(root) in Path("docs/kv-faults.md").read_text(), (
        "docs/kv-faults.md's table differs from the committed kv_faults records: "
        "python -m harness.kinds.kv.faults.table rewrites it")
