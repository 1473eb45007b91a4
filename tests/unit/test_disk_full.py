"""A full disk while a record or goldens are written: a clear error naming the file, nothing
half-written, the earlier files intact. The disk is a real 256 KiB tmpfs, mounted in a private
user + mount namespace (``unshare -rm``: no root needed where user namespaces are allowed), over
the folder being written. About 10 s."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.workspace import REPO_ROOT


def _in_small_tmpfs(folder: Path, script: str, tmp_path: Path, kib: int = 256) -> dict[str, object]:
    """Run ``script`` (python) with ``folder`` a tmpfs of ``kib`` KiB; it prints one JSON line."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a private tmpfs")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not available here: {probe.stderr.decode().strip()}")
    folder.mkdir(parents=True, exist_ok=True)
    (tmp_path / "script.py").write_text(script)
    r = subprocess.run(["unshare", "-rm", "sh", "-c",
                        f'mount -t tmpfs -o size={kib}k tmpfs "{folder}" && "{sys.executable}" '
                        f'"{tmp_path / "script.py"}"'], capture_output=True, text=True, timeout=300,
                       cwd=REPO_ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


FILL = """
def fill(folder, keep):
    # everything but `keep` bytes: the next file that needs more finds the disk full
    import os
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with open(os.path.join(folder, "filler"), "wb") as f:
        f.write(b"x" * max(0, free - keep))
"""


def test_a_record_on_a_full_disk_is_a_clear_error_and_the_earlier_ones_are_intact(tmp_path: Path) -> None:
    records = tmp_path / "records"
    earlier = next(p for p in sorted((REPO_ROOT / "reports" / "records").rglob("*.json")))
    out = _in_small_tmpfs(records, FILL + textwrap.dedent(f"""
        import dataclasses, hashlib, json, os
        from pathlib import Path
        from harness.records import RecordError, load_record, record_path, write_record
        root = Path({str(records)!r})
        rec = load_record(Path({str(earlier)!r}))
        first = write_record(root, rec)                      # the earlier record, written while there is room
        digest = hashlib.sha256(first.read_bytes()).hexdigest()
        fill(str(root), 2048)
        try:
            write_record(root, dataclasses.replace(rec, id=rec.id + "-2"))
            err = None
        except RecordError as e:
            err = str(e)
        left = sorted(p.name for p in first.parent.iterdir())
        print(json.dumps({{"error": err, "intact": hashlib.sha256(first.read_bytes()).hexdigest() == digest,
                          "loads": load_record(first).id == rec.id, "left": left, "first": first.name}}))
        """), tmp_path)
    assert out["error"] and "No space left on device" in out["error"] and "could not be written" in out["error"]
    assert out["intact"] and out["loads"]
    assert out["left"] == [out["first"]], "a half-written or temporary record was left behind"


@pytest.mark.parametrize("free", [4096, 8192])  # 8 KiB: cases.jsonl fits, the safetensors file does not
def test_goldens_on_a_full_disk_are_a_clear_error_and_the_earlier_ones_are_intact(tmp_path: Path,
                                                                                    free: int) -> None:
    goldens = tmp_path / "goldens" / "tiny-llama"
    out = _in_small_tmpfs(goldens, FILL + textwrap.dedent(f"""
        import json, shutil
        from pathlib import Path
        from harness.goldens import GoldenError, read_golden, write_golden
        from harness.models import resolve_model
        from harness.pin import oracle_pin
        from harness.suites import find_suite
        from harness.workspace import Workspace
        ws = Workspace.default()
        folder = Path({str(goldens)!r}) / "smoke"
        shutil.copytree(ws.goldens / "tiny-llama" / "smoke", folder)
        g = read_golden(folder, model_name="tiny-llama", suite_name="smoke")
        before = {{p.name: p.read_bytes() for p in folder.iterdir()}}
        fill(str(folder.parent), {free})
        try:
            write_golden(folder, model=resolve_model("tiny-llama", ws), suite=find_suite(ws.suites, "smoke"),
                         cases=g.cases, outputs=list(g.outputs.values()), oracle=g.oracle, pin=oracle_pin(),
                         provenance={{}})
            err = None
        except GoldenError as e:
            err = str(e)
        read_golden(folder, model_name="tiny-llama", suite_name="smoke")  # raises if not intact
        after = {{p.name: p.read_bytes() for p in folder.iterdir()}}
        print(json.dumps({{"error": err, "same": before == after,
                          "left": sorted(p.name for p in folder.parent.iterdir())}}))
        """), tmp_path)
    assert out["error"] and "No space left on device" in out["error"] and "earlier goldens are untouched" in out["error"]
    assert out["same"], "the earlier goldens changed"
    assert out["left"] == ["filler", "smoke"], "a half-written golden folder was left behind"
