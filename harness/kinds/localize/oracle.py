"""The oracle's side of a localization: the pinned vLLM's tensors on the goldens' own sequences.

The oracle runs the whole golden sequence of a case (prompt + every token it generated) once;
a localization compares the rows up to the candidate's first divergence, which by causality are
the rows of that prefix (a causal model's position t sees tokens <= t only; a longer forward pass
may block its matrix products differently, ~1e-14 NMSE in float32). So one capture serves every
candidate, and it is cached: ``.cache/oracle-tensors/<model>/<key>.npz`` under the workspace, the
key a digest of everything the tensors depend on (the model's digest, the oracle pin, the engine
settings, the taps' definitions, the token ids). A cache file never goes stale: anything that would
change it changes its key. These files are also what a machine without vLLM (a GPU runner)
compares its engines against.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.abilities import TensorSource
from harness.api import EngineFailed, EngineRefused
from harness.engines import RunnerContext, make_runner
from harness.engines.launch.layer_taps import TAPS_VERSION
from harness.engines.vllm.runner import TENSOR_ENGINE_SETTINGS, default_engine_settings
from harness.goldens import Golden
from harness.models import ModelRef
from harness.oracle import ORACLE, oracle_available
from harness.pin import oracle_pin
from harness.workspace import Workspace

META = "__meta__"
"""The key of a cache file's JSON facts (a string array: no pickle)."""


def cache_root(ws: Workspace) -> Path:
    return ws.root / ".cache" / "oracle-tensors"


def golden_sequence(golden: Golden, case_id: str) -> list[int]:
    """The case's prompt and every token the oracle generated for it."""
    case = next(c for c in golden.cases if c.id == case_id)
    return [*case.prompt_ids, *golden.outputs[case_id].token_ids]


def cache_key(model: ModelRef, ids: Sequence[int]) -> str:
    pin = oracle_pin()
    what = {"model": model.digest, "pin": pin.spec, "taps": TAPS_VERSION,
            "engine": {**default_engine_settings(model), **TENSOR_ENGINE_SETTINGS},
            "ids": [int(t) for t in ids]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def cache_path(ws: Workspace, model: ModelRef, ids: Sequence[int]) -> Path:
    return cache_root(ws) / model.slug / f"{cache_key(model, ids)}.npz"


def read_cached(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z[META])) if META in z.files else {}
            return {k: np.asarray(z[k], np.float32) for k in z.files if k != META}, meta
    except (OSError, ValueError, KeyError):
        return None


def write_cached(path: Path, tensors: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Atomically (a temp file renamed over the final name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=path.parent)
    os.close(fd)
    try:
        np.savez(tmp, **{META: np.array(json.dumps(dict(meta), sort_keys=True))}, **dict(tensors))
        os.chmod(tmp, 0o644)  # a cache other checkouts may be given (mkstemp makes it private)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@dataclass(frozen=True, slots=True, eq=False)
class OracleTensors:
    tensors: Mapping[str, Mapping[str, np.ndarray]]
    """Case id -> tensor name -> ``[positions of the whole golden sequence, width]``."""
    source: Mapping[str, str]
    """Case id -> ``cache`` or ``engine`` (captured in this run)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The engine's version, settings and device facts, as the capture recorded them."""
    seconds: float = 0.0


def oracle_tensors(ws: Workspace, model: ModelRef, golden: Golden, case_ids: Sequence[str]) -> OracleTensors:
    """The oracle's tensors of each case's whole golden sequence, from the cache or one engine start.

    Raises :class:`EngineRefused` when they are not cached and the pinned vLLM is not installed here
    (or cannot tap the model), :class:`EngineFailed` when it crashed."""
    t0 = time.perf_counter()
    seqs = {cid: golden_sequence(golden, cid) for cid in case_ids}
    got: dict[str, Mapping[str, np.ndarray]] = {}
    source: dict[str, str] = {}
    meta: dict[str, Any] = {}
    missing = {}
    for cid, ids in seqs.items():
        hit = read_cached(cache_path(ws, model, ids))
        if hit is None:
            missing[cid] = ids
        else:
            got[cid], meta = hit
            source[cid] = "cache"
    if missing:
        if (why := oracle_available()) is not None:
            raise EngineRefused(f"the oracle's tensors of {', '.join(missing)} are not cached under "
                                f"{cache_root(ws)} and the pinned vLLM cannot run here: {why}")
        ws.runs.mkdir(parents=True, exist_ok=True)
        runner = make_runner(oracle_pin().engine, model, RunnerContext(run_dir=ws.runs, name=ORACLE))
        assert isinstance(runner, TensorSource)
        try:
            runner.start()
            captured = runner.capture_layers(missing)
            info = runner.info()
            facts = runner.facts()
        except (EngineRefused, EngineFailed) as e:
            raise type(e)(f"the oracle ({oracle_pin().spec}): {e}", *(
                [e.log_tail] if isinstance(e, EngineFailed) else [])) from None
        finally:
            runner.close()
        meta = {"engine": info.engine, "version": info.version, "settings": dict(info.settings),
                "device": dict(facts.device), "ability": runner.tensor_ability().note}
        for cid, tensors in captured.items():
            write_cached(cache_path(ws, model, missing[cid]), tensors, {**meta, "case": cid})
            got[cid] = tensors
            source[cid] = "engine"
    return OracleTensors(got, source, meta, time.perf_counter() - t0)
