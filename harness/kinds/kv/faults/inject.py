"""Storage faults under a KV connector's store: what each fault is, and how it is applied for real.

The suite ``kv_faults`` (:mod:`harness.kinds.kv.faults.run`) stores through a connector, damages the store,
and has a fresh engine serve the same requests. The faults, and where each is applied:

* ``no_space``: the producer stores onto a real tmpfs of ``size`` bytes, mounted over the store
  folder in a private mount namespace of the producer's process tree (:func:`mount_wrap`), so the
  store fills mid-write with ENOSPC; what was on it when the producer exited is what the consumer
  finds (copied out before the namespace goes).
* ``read_only``: the store folder is a read-only bind mount of itself at store time (EROFS).
* ``truncated`` / ``byte_flipped``: after the store, one stored file of the target request is cut to
  half its length / has one byte in its middle xor-ed (:func:`truncate_file`, :func:`flip_byte`).
* ``removed``: each stored file of the target is unlinked the moment the consumer opens it, i.e.
  after the connector's lookup found it and before its load read it.
* ``read_error``: opening a stored file of the target for reading fails with EIO.

The last two, and the proof that the consumer read a damaged file at all, are injected at the file
layer by a preloaded shim (``shim.c``: ``open``/``openat``/``fopen`` of the named files,
:func:`shim_env`), which logs every open it saw. A fault whose damage never reached the consumer
(nothing of the target was stored, or the consumer never opened the damaged file) makes its row
vacuous (:mod:`harness.kinds.kv.faults.verdict`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SHIM_SOURCE = Path(__file__).with_name("shim.c")


@dataclass(frozen=True, slots=True)
class Fault:
    """One storage fault of the suite."""

    name: str
    when: Literal["store", "load", "cycle"]
    """Applied while the producer stores, between store and load (or during the load), or not a
    damage at all (the engine's own offload -> evict -> onboard cycles)."""
    how: str
    """One line for the record and the pages: what was done to the storage, and at which layer."""


FAULTS: tuple[Fault, ...] = (
    Fault("no_space", "store", "the store is a real tmpfs too small for it (private mount namespace): "
          "ENOSPC mid-write"),
    Fault("truncated", "load", "one stored file of the request cut to half its length after the store"),
    Fault("byte_flipped", "load", "one byte in the middle of one stored file of the request xor 0x01 "
          "after the store"),
    Fault("removed", "load", "each stored file of the request unlinked when the consumer opens it "
          "(after the lookup found it, before the load read it; preloaded shim at open(2))"),
    Fault("read_error", "load", "opening a stored file of the request for reading fails with EIO "
          "(preloaded shim at open(2))"),
    Fault("read_only", "store", "the store folder is a read-only bind mount at store time "
          "(private mount namespace): EROFS"),
    Fault("evict_cycles", "cycle", "offload -> evict -> onboard rounds in one consumer whose small KV "
          "pool makes the engine evict the prefixes itself"),
)
BY_NAME = {f.name: f for f in FAULTS}
SHIM_MODES = ("watch", "eio", "vanish")


class FaultError(RuntimeError):
    """A fault that cannot be applied on this machine; the message names what is missing."""


def fault(name: str) -> Fault:
    try:
        return BY_NAME[name]
    except KeyError:
        import difflib

        near = difflib.get_close_matches(name, BY_NAME, n=3)
        raise ValueError(f"unknown storage fault {name!r}; valid: {', '.join(BY_NAME)}"
                         + (f" (did you mean {', '.join(near)}?)" if near else "")) from None


# ---------------------------------------------------------------- damage after the store

def truncate_file(path: Path) -> dict[str, Any]:
    """Cut ``path`` to half its length; the fact for the record (sizes before and after)."""
    size = path.stat().st_size
    if size < 2:
        raise FaultError(f"{path}: {size} bytes, nothing to truncate")
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return {"file": path.name, "size_before": size, "size_after": path.stat().st_size}


def flip_byte(path: Path, offset: int | None = None) -> dict[str, Any]:
    """Xor one byte of ``path`` (default: its middle, past any header) with 0x01; the fact."""
    size = path.stat().st_size
    if size < 1:
        raise FaultError(f"{path}: empty, no byte to flip")
    off = size // 2 if offset is None else offset % size
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)[0]
        f.seek(off)
        f.write(bytes([b ^ 0x01]))
    return {"file": path.name, "offset": off, "before": b, "after": b ^ 0x01}


def pick_data_file(files: Sequence[Path]) -> Path:
    """The file a truncation or a flip damages: the largest of the request's stored files (a page
    data file, not an index), the last by name among equals."""
    if not files:
        raise FaultError("the request stored no file to damage")
    return max(files, key=lambda p: (p.stat().st_size, str(p)))


def list_files(root: Path) -> list[str]:
    """Every regular file under ``root``, absolute, sorted (what a pass left in the store)."""
    if not root.is_dir():
        return []
    return sorted(str(p) for p in root.rglob("*") if p.is_file())


def store_bytes(root: Path) -> int:
    return sum(Path(p).stat().st_size for p in list_files(root))


def copy_store(src: Path, dst: Path) -> None:
    """A private copy of a store for one fault's consumer (the damage never reaches another row)."""
    if dst.exists():
        shutil.rmtree(dst)
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        dst.mkdir(parents=True)


def rebase(paths: Sequence[str], old: Path, new: Path) -> list[Path]:
    """``paths`` under ``old`` as the same files under ``new``."""
    return [new / Path(p).relative_to(old) for p in paths]


# ---------------------------------------------------------------- the preloaded shim

def build_shim(cache: Path) -> Path:
    """The compiled shim (``cache/fault_shim-<source digest>.so``), built once with the C compiler
    (``CC``, else ``cc``); :class:`FaultError` naming the compiler when there is none."""
    src = SHIM_SOURCE.read_bytes()
    out = cache / f"fault_shim-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FaultError("the file-layer faults (removed, read_error) need a C compiler to build "
                         "harness/kinds/kv/faults/shim.c: set CC or install cc")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SHIM_SOURCE), "-ldl"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise FaultError(f"{cc} could not build {SHIM_SOURCE.name}: {done.stderr.strip()[-400:]}")
    os.replace(tmp, out)
    return out


def shim_env(shim: Path, mode: str, paths: Sequence[Path], log: Path,
             env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` with the shim preloaded (after anything already preloaded) for ``paths``."""
    if mode not in SHIM_MODES:
        raise ValueError(f"shim mode {mode!r}; valid: {', '.join(SHIM_MODES)}")
    out = dict(os.environ if env is None else env)
    have = out.get("LD_PRELOAD", "")
    out["LD_PRELOAD"] = ":".join([*([have] if have else []), str(shim)])
    out["HARNESS_FAULT_PATHS"] = "\n".join(str(Path(p).absolute()) for p in paths)
    out["HARNESS_FAULT_MODE"] = mode
    out["HARNESS_FAULT_LOG"] = str(log)
    return out


def shim_log(log: Path) -> list[tuple[str, int, str]]:
    """The opens the shim saw: (mode, pid, path) per line; a line cut by a kill is skipped."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(errors="replace").splitlines():
        mode, _, rest = line.partition(" ")
        pid, _, path = rest.partition(" ")
        if mode in SHIM_MODES and pid.isdigit() and path.startswith("/"):
            out.append((mode, int(pid), path))
    return out


# ---------------------------------------------------------------- store-time faults: mounts

MOUNT_SCRIPT = """set -e
store="$1"; size="$2"; keep="$3"; shift 3
mkdir -p "$store"
if [ "$size" = ro ]; then
  mount --bind "$store" "$store"; mount -o remount,bind,ro "$store"
else
  mount -t tmpfs -o "size=$size" harness-kv-faults "$store"
fi
set +e
"$@"; rc=$?
mkdir -p "$keep"; cp -a "$store/." "$keep/"
exit $rc
"""


def mount_wrap(kind: Literal["no_space", "read_only"], store: Path, keep: Path,
               size: int = 0) -> list[str]:
    """The argv prefix that runs a command with ``store`` on a ``size``-byte tmpfs (``no_space``)
    or read-only (``read_only``) in a private mount namespace, then copies what the store holds to
    ``keep`` (outside the mount) before the namespace goes. :class:`FaultError` when this machine
    cannot make a mount namespace (it is asked, not assumed: :func:`can_mount`)."""
    if (why := can_mount()) is not None:
        raise FaultError(why)
    arg = "ro" if kind == "read_only" else str(max(int(size), 4096))
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", MOUNT_SCRIPT, "kv-faults",
            str(store), arg, str(keep)]


_CAN_MOUNT: list[str | None] = []


def can_mount() -> str | None:
    """None when a private mount namespace with a tmpfs can be made here; else why not."""
    if not _CAN_MOUNT:
        unshare = shutil.which("unshare")
        if unshare is None:
            _CAN_MOUNT.append("no unshare(1) on this machine: a real small filesystem cannot be mounted")
        else:
            done = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c",
                                   "d=$(mktemp -d) && mount -t tmpfs -o size=4096 t \"$d\" && "
                                   "umount \"$d\"; rc=$?; rmdir \"$d\"; exit $rc"],
                                  capture_output=True, text=True)
            _CAN_MOUNT.append(None if done.returncode == 0 else
                              f"a private mount namespace with a tmpfs cannot be made here "
                              f"({done.stderr.strip()[-200:] or f'exit {done.returncode}'})")
    return _CAN_MOUNT[0]


def settle_kept(store: Path, keep: Path) -> None:
    """After a mount-wrapped producer: the store folder holds what the small filesystem held."""
    if store.exists():
        shutil.rmtree(store)
    if keep.exists():
        os.replace(keep, store)
    else:
        store.mkdir(parents=True)


# ---------------------------------------------------------------- one fault, start to end

def shim_mode(name: str) -> str:
    """How the shim treats the damaged request's files on the consumer: ``removed`` unlinks them on
    open, ``read_error`` fails the open, every other fault only logs that they were opened."""
    return {"removed": "vanish", "read_error": "eio"}.get(name, "watch")


def damage(name: str, files: Sequence[Path]) -> tuple[dict[str, Any], list[Path]]:
    """Apply a between-store-and-load fault to the request's stored ``files``: the fact, and the
    files the shim must see the consumer open for the fault to count as applied (the damaged one;
    for ``removed`` and ``read_error``, which damage nothing now, every one: the shim does it when
    the consumer opens them)."""
    if name in ("truncated", "byte_flipped"):
        victim = pick_data_file(files)
        return (truncate_file(victim) if name == "truncated" else flip_byte(victim)), [victim]
    if not files:
        raise FaultError("the request stored no file to damage")
    return {"files": len(files)}, list(files)


def store_difference(clean: Path, faulted: Path) -> str | None:
    """How a store written under a store-time fault differs from the clean one (files, bytes), or
    None when it does not: the fault changed nothing."""
    def sizes(root: Path) -> dict[str, int]:
        return {str(Path(p).relative_to(root)): Path(p).stat().st_size for p in list_files(root)}

    a, b = sizes(clean), sizes(faulted)
    if a == b:
        return None
    lost = sorted(set(a) - set(b))
    short = sorted(k for k in set(a) & set(b) if b[k] < a[k])
    extra = sorted(set(b) - set(a))
    return (f"{len(b)}/{len(a)} files, {sum(b.values())}/{sum(a.values())} bytes of the clean store"
            + (f"; {len(lost)} missing" if lost else "") + (f"; {len(short)} cut short" if short else "")
            + (f"; {len(extra)} not in the clean store" if extra else ""))


def opened(log: Path) -> str | None:
    """The shim's evidence that the consumer opened a damaged file, or None."""
    seen = shim_log(log)
    if not seen:
        return None
    files = sorted({Path(p).name for _, _, p in seen})
    return f"the consumer opened {len(seen)}x ({seen[0][0]}): {', '.join(files[:4])}"
