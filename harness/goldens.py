"""Goldens: the oracle's outputs for one model + suite, reviewable in git.

Layout of ``goldens/<model>/<suite>/``:

* ``cases.jsonl``          one line per case, sorted by id, ``sort_keys``: prompt ids, generated
                           ids, text, finish reason. A ``git diff`` shows which case moved.
* ``logprobs.safetensors`` per case ``<id>.top_ids`` [T,k] int32, ``<id>.top_logprobs`` [T,k] f32,
                           ``<id>.chosen_logprobs`` [T] f32 (no pickle).
* ``manifest.json``        oracle engine + exact version, model name + digest, suite name +
                           version, sampling, harness SHA, platform, date, sha256 of every file,
                           and ``device``: the oracle's device class and fingerprint
                           (``harness.device``; absent from goldens older than fingerprints,
                           whose class reads as "unknown").

Goldens are written only by ``harness record`` (``make record``); a candidate run opens them
read-only and refuses any whose checksums, suite version, model digest or oracle pin disagree.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Case, EngineInfo, Output, Sampling
from harness.device import device_block, recorded_class
from harness.files import LockTimeout, exchange, locked, sha256_file
from harness.models import ModelRef
from harness.pin import OraclePin
from harness.suites import Suite

SCHEMA = 1
CASES_FILE = "cases.jsonl"
ARRAYS_FILE = "logprobs.safetensors"
MANIFEST_FILE = "manifest.json"


class GoldenError(ValueError):
    """Goldens are missing, corrupt or stale; the message says which file and how to re-record."""


def record_command(model: str, suite: str) -> str:
    return f"make record MODEL={model} SUITE={suite}"


@dataclass(frozen=True, slots=True)
class Golden:
    folder: Path
    manifest: Mapping[str, Any]
    cases: tuple[Case, ...]
    outputs: Mapping[str, Output]

    @property
    def sampling(self) -> Sampling:
        return Sampling(**self.manifest["sampling"])

    @property
    def oracle(self) -> EngineInfo:
        return EngineInfo.from_json(self.manifest["oracle"])

    @property
    def checksums(self) -> Mapping[str, str]:
        return self.manifest["files"]

    @property
    def device_class(self) -> str:
        """The oracle's device class when these goldens were recorded; "unknown" for goldens
        recorded before fingerprints existed (never assumed equal to any class)."""
        return recorded_class(self.manifest)


def golden_dir(goldens_root: Path, model: ModelRef, suite_name: str) -> Path:
    return goldens_root / model.slug / suite_name


LOCK_TIMEOUT_S = float(os.environ.get("HARNESS_GOLDEN_LOCK_TIMEOUT_S", "3600"))


def lock_path(root: Path, slug: str, suite: str) -> Path:
    """The lock one recording of ``slug``/``suite``'s goldens holds (under the ignored reports/tmp)."""
    return root / "reports" / "tmp" / "locks" / f"goldens--{slug}--{suite}.lock"


@contextmanager
def recording(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive ``flock`` on ``path`` (:func:`lock_path`) while goldens are recorded, so two
    gates on one workspace never run the oracle twice nor swap folders under each other; after
    ``timeout_s`` name the holder and give up."""
    try:
        with locked(path, timeout_s):
            yield
    except LockTimeout as e:
        raise GoldenError(f"{e} (another process recording these goldens)") from None


def write_golden(folder: Path, *, model: ModelRef, suite: Suite, cases: Sequence[Case],
                 outputs: Sequence[Output], oracle: EngineInfo, pin: OraclePin,
                 provenance: Mapping[str, Any]) -> Path:
    """Write a complete golden set into ``folder`` atomically (all files or none).

    The manifest's ``device`` is this machine's class and fingerprint for the CPU (the pinned
    oracle is the CPU build of vLLM, run with this process's environment); a ``device`` entry in
    ``provenance`` (e.g. with the kernel library the engine reported) replaces it."""
    from safetensors.numpy import save_file

    by_id = {o.case_id: o for o in outputs}
    bad = [o.case_id for o in outputs if o.error is not None or not o.has_logprobs]
    if bad:
        raise GoldenError(f"oracle failed or returned no logprobs for {', '.join(bad)}: "
                          f"not writing goldens to {folder}")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as e:
        raise GoldenError(f"{folder}: cannot write goldens: {e.strerror or e}") from None
    try:
        lines, arrays = [], {}
        for case in sorted(cases, key=lambda c: c.id):
            o = by_id[case.id]
            lines.append(json.dumps({
                "id": case.id, "prompt_ids": list(case.prompt_ids), "prompt_text": case.prompt_text,
                "tags": list(case.tags), "token_ids": list(o.token_ids), "text": o.text,
                "finish_reason": o.finish_reason,
            }, sort_keys=True, ensure_ascii=False))
            assert o.top_ids is not None and o.top_logprobs is not None and o.chosen_logprobs is not None
            arrays[f"{case.id}.top_ids"] = np.ascontiguousarray(o.top_ids, dtype=np.int32)
            arrays[f"{case.id}.top_logprobs"] = np.ascontiguousarray(o.top_logprobs, dtype=np.float32)
            arrays[f"{case.id}.chosen_logprobs"] = np.ascontiguousarray(o.chosen_logprobs,
                                                                        dtype=np.float32)
        (tmp / CASES_FILE).write_text("\n".join(lines) + "\n")
        save_file(arrays, str(tmp / ARRAYS_FILE))
        manifest = {
            "schema": SCHEMA,
            "oracle": {**oracle.to_json(), "pin": pin.spec},
            "model": {"name": model.name, "digest": model.digest},
            "suite": {"name": suite.name, "version": suite.version, "digest": suite.digest},
            "sampling": suite.sampling.to_json(),
            "device": device_block("cpu"),
            **provenance,
            "files": {f: sha256_file(tmp / f) for f in (CASES_FILE, ARRAYS_FILE)},
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    except BaseException as e:  # before anything was swapped in: the partial folder goes, nothing is lost
        shutil.rmtree(tmp, ignore_errors=True)
        why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
        if not isinstance(e, OSError) and "(os error" not in why:  # safetensors words a full disk its own way
            raise
        earlier = "the earlier goldens are untouched" if folder.exists() else "there were none before"
        raise GoldenError(f"{folder}: the goldens could not be written: {why}. Nothing was "
                          f"swapped in ({earlier}); free space and record again") from None
    try:
        if not folder.exists():
            os.rename(tmp, folder)
        elif not exchange(tmp, folder):  # atomic where the kernel can swap two names at once
            old = folder.with_name(f".{folder.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(folder, old)
            os.rename(tmp, folder)
            shutil.rmtree(old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # after an exchange: the earlier goldens
    return folder


def read_golden(folder: Path, *, model_name: str, suite_name: str) -> Golden:
    """Open and verify a golden set. Raises GoldenError naming the file and the fix."""
    fix = f"to re-record: {record_command(model_name, suite_name)}"
    mpath = folder / MANIFEST_FILE
    if not mpath.exists():
        raise GoldenError(f"no goldens for model {model_name!r} suite {suite_name!r} "
                          f"({mpath} missing); {fix}")
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise GoldenError(f"{mpath}: unreadable manifest ({e}); {fix}") from None
    for name, want in files.items():
        p = folder / name
        if not p.exists():
            raise GoldenError(f"{p}: golden file missing; {fix}")
        if (have := sha256_file(p)) != want:
            raise GoldenError(f"{p}: checksum mismatch (manifest {want[:12]}, file {have[:12]}): "
                              f"the golden was edited or corrupted; refusing it. {fix}")
    from safetensors.numpy import load_file

    arrays = load_file(str(folder / ARRAYS_FILE))
    cases, outputs = [], {}
    for n, line in enumerate((folder / CASES_FILE).read_text().splitlines(), 1):
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise GoldenError(f"{folder / CASES_FILE}:{n}: not JSON ({e}); {fix}") from None
        cid = d["id"]
        cases.append(Case(cid, tuple(d["prompt_ids"]), d.get("prompt_text", ""),
                          tuple(d.get("tags", ()))))
        outputs[cid] = Output(
            case_id=cid, token_ids=tuple(d["token_ids"]), text=d.get("text", ""),
            top_ids=arrays[f"{cid}.top_ids"], top_logprobs=arrays[f"{cid}.top_logprobs"],
            chosen_logprobs=arrays[f"{cid}.chosen_logprobs"],
            finish_reason=d.get("finish_reason", ""),
        )
    return Golden(folder, manifest, tuple(cases), outputs)


def staleness(golden: Golden, *, model: ModelRef, suite: Suite, pin: OraclePin,
              cases: Sequence[Case]) -> list[str]:
    """Why these goldens no longer describe this model/suite/pin (empty: they do)."""
    m = golden.manifest
    why = []
    if m["suite"]["version"] != suite.version:
        why.append(f"goldens were recorded with suite {suite.name} v{m['suite']['version']}, "
                   f"the suite is now v{suite.version}")
    else:
        recorded = {c.id: c.prompt_ids for c in golden.cases}
        now = {c.id: c.prompt_ids for c in cases}
        moved = sorted(set(recorded) ^ set(now) | {k for k in now if recorded.get(k) != now[k]})
        if moved or golden.sampling != suite.sampling:
            what = f"cases {', '.join(moved)}" if moved else "sampling"
            why.append(f"suite {suite.name} changed ({what}) but its version is still "
                       f"{suite.version}: bump the version")
    if m["model"]["digest"] != model.digest:
        why.append(f"model {model.name} changed: goldens recorded for digest "
                   f"{m['model']['digest'][:12]}, the weights now hash to {model.digest[:12]}")
    if m["oracle"].get("pin") != pin.spec:
        why.append(f"goldens predate the pin: recorded with {m['oracle'].get('pin')}, "
                   f"the oracle pin is now {pin.spec}")
    return why
