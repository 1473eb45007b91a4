"""The storage-fault suite's controls: each connector double (:mod:`harness.kinds.kv.faults.doubles`)
through each storage fault, applied the same way as under an engine's store
(:mod:`harness.kinds.kv.faults.inject`), judged by the same rule (:mod:`harness.kinds.kv.faults.verdict`).
No engine: child processes of a few milliseconds each."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from harness.kinds.kv.faults.doubles import DOUBLES, PAYLOAD_BYTES, payload, run_child
from harness.kinds.kv.faults.inject import (
    BY_NAME,
    FaultError,
    copy_store,
    damage,
    list_files,
    mount_wrap,
    opened,
    settle_kept,
    shim_env,
    shim_mode,
    store_difference,
)
from harness.kinds.kv.faults.verdict import RowFacts, classify, double_controls, explain
from harness.records import Control

NO_SPACE_BYTES = PAYLOAD_BYTES // 4
"""The doubles' small filesystem: a quarter of their payload fits."""


def double_row(double: str, name: str, folder: Path, shim: Path | None) -> RowFacts:
    """``double`` stores, fault ``name`` is applied, ``double`` loads: the row's facts."""
    f = BY_NAME[name]
    if f.when == "cycle":
        raise ValueError(f"{name}: the doubles have no engine to evict their pages")
    base = folder / double
    clean = base / "clean"
    rc, res, err = run_child("store", double, clean, base / "clean.store.json")
    if rc != 0 or not res.get("stored"):
        raise FaultError(f"double {double}: the clean store failed ({err or res})")
    root = base / name
    words: list[str] = []
    if f.when == "store":
        keep = base / f"{name}.kept"
        rc, res, err = run_child("store", double, root, base / f"{name}.store.json",
                                 wrap=mount_wrap(name, root, keep, NO_SPACE_BYTES))  # type: ignore[arg-type]
        settle_kept(root, keep)
        if rc != 0:
            words.append(f"store exited {rc}: {err}")
        diff = store_difference(clean, root)
        applied, how = diff is not None, diff or "the store under the fault equals the clean store"
        targets = [root / Path(p).relative_to(clean) for p in list_files(clean)]
    else:
        copy_store(clean, root)
        fact, targets = damage(name, [Path(p) for p in list_files(root)])
        applied, how = True, str(fact)
    env = None
    log = base / f"{name}.opens.log"
    log.unlink(missing_ok=True)
    if shim is not None:
        env = shim_env(shim, shim_mode(name), targets, log)
    elif shim_mode(name) != "watch":
        raise FaultError(f"{name}: needs the preloaded shim")
    rc, res, err = run_child("load", double, root, base / f"{name}.load.json", env=env)
    if rc != 0:
        words.append(f"load exited {rc}: {err}")
    if f.when == "load" and shim is not None:
        seen = opened(log)
        applied, how = seen is not None, f"{how}; {seen or 'the damaged files were never opened'}"
    served = bool(res.get("served"))
    wrong = served and res.get("sha256") != hashlib.sha256(payload()).hexdigest()
    return RowFacts(name, applied, how, pages_served=int(served), pages_wrong=int(wrong),
                    engine_error="; ".join(words) or None,
                    named=(str(res["problem"]),) if res.get("problem") else ())


def run_double_controls(faults: Sequence[str], folder: Path, shim: Path | None) -> tuple[list[Control], dict]:
    """Both doubles through every storage fault of ``faults`` (the cycle row has none): the controls
    and, per double and fault, the row's line for the record."""
    rows = {d: {n: double_row(d, n, folder, shim) for n in faults if BY_NAME[n].when != "cycle"}
            for d in DOUBLES}
    info = {d: {n: explain(f, classify(f)) for n, f in by.items()} for d, by in rows.items()}
    return double_controls(rows), info
