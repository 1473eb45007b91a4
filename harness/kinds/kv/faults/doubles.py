"""Two connector doubles for the storage-fault suite's controls, and the run that puts each one
through every storage fault exactly as an engine's store is (the same mounts, the same shim).

* ``digest``: stores a payload and its sha256 (the digest written last, by rename, so a failed write
  never publishes a chunk); on load any I/O error, missing file, short file or digest mismatch is a
  miss, recomputed. It must come through every fault (the positive control).
* ``careless``: stores the payload and ignores any error while writing; on load it serves whatever
  it can read and fills the rest with zeros, ignoring every I/O error. Every fault must catch it.

Each store and each load runs in a child process (``python -I fault_doubles.py store|load ...``,
standard library only, so it starts in milliseconds), so a store-time fault is a real mount around
it and a load-time fault the same preloaded shim an engine gets.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

PAYLOAD_BYTES = 65536
DOUBLES = ("digest", "careless")


def payload(n: int = PAYLOAD_BYTES) -> bytes:
    """The bytes a double stores (deterministic: the load side checks them without being told)."""
    out = bytearray()
    block = b"harness-kv-faults"
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


def _store(double: str, root: Path) -> dict[str, object]:
    data = payload()
    entry = root / "chunk"
    if double == "careless":
        try:
            entry.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        try:
            with open(entry / "pages.bin", "wb") as f:
                try:
                    f.write(data)
                except OSError:
                    pass
        except OSError:
            pass
        return {"stored": True}
    try:
        entry.mkdir(parents=True, exist_ok=True)
        tmp = entry / ".pages.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, entry / "pages.bin")
        meta = entry / ".digest.tmp"
        meta.write_text(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "nbytes": len(data)}))
        os.replace(meta, entry / "digest.json")
        return {"stored": True}
    except OSError as e:
        for p in (entry / ".pages.tmp", entry / ".digest.tmp", entry / "pages.bin"):
            try:
                p.unlink()
            except OSError:
                pass
        return {"stored": False, "problem": f"{type(e).__name__}: {e}"}


def _load(double: str, root: Path) -> dict[str, object]:
    entry = root / "chunk"
    if double == "careless":
        try:
            with open(entry / "pages.bin", "rb") as f:
                got = f.read()
        except OSError:
            got = b""
        got = got[:PAYLOAD_BYTES] + bytes(max(0, PAYLOAD_BYTES - len(got)))
        return {"served": True, "sha256": hashlib.sha256(got).hexdigest()}
    try:
        meta = json.loads((entry / "digest.json").read_text())
        got = (entry / "pages.bin").read_bytes()
    except (OSError, ValueError) as e:
        return {"served": False, "problem": f"{type(e).__name__}: {e}"}
    if len(got) != int(meta["nbytes"]) or hashlib.sha256(got).hexdigest() != meta["sha256"]:
        return {"served": False, "problem": f"pages.bin: {len(got)} bytes, digest mismatch"}
    return {"served": True, "sha256": hashlib.sha256(got).hexdigest()}


def child(argv: list[str]) -> int:
    what, double, root, out = argv
    result = (_store if what == "store" else _load)(double, Path(root))
    Path(out).write_text(json.dumps(result))
    return 0


def run_child(what: str, double: str, root: Path, out: Path, wrap: list[str] | None = None,
              env: dict[str, str] | None = None) -> tuple[int, dict[str, object], str]:
    """Run one store or load of ``double`` in a child (under ``wrap``, with ``env``): its exit
    status, its result, its stderr."""
    out.unlink(missing_ok=True)
    done = subprocess.run([*(wrap or []), sys.executable, "-I", str(Path(__file__)), what, double,
                           str(root), str(out)], capture_output=True, text=True, env=env, timeout=60)
    result = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, result, done.stderr.strip()[-300:]


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
