"""One engine process of the KV round trip, seen from the host: the passes it runs (producer:
timing passes then the real write; consumer: the restore with its reference and fault lanes), the
process that runs them (:mod:`harness.kinds.kv.phase` inside, under a release's interpreter), and what it
left behind read back as a :class:`Phase`."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.api import Case, Sampling
from harness.engines.launch import ledger
from harness.engines.launch.procs import engine_env, run_engine
from harness.engines.launch.worker_lines import WorkerFailed, check_result
from harness.engines.vllm.preload import preload_env
from harness.engines.vllm.runner import root_cause
from harness.kinds.kv.capture import Capture, CaptureError, read_capture
from harness.models import ModelRef

PHASE_TIMEOUT_S = float(os.environ.get("HARNESS_KV_TIMEOUT_S", "900"))


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    ok: bool
    reason: str
    version: str
    timings: Mapping[str, float]
    rows: tuple[Mapping[str, Any], ...]
    capture: Capture | None
    log: Path
    compat: Mapping[str, Any] = field(default_factory=dict)
    """What :mod:`harness.kinds.kv.compat` adapted to the release this phase ran on."""
    skipped: bool = False
    """The release lacks a hook the gate needs (``reason`` names it): a skip, not an error."""
    observed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Pass -> what :mod:`harness.kinds.kv.observe` saw (counters, peaks, KV-cache events), when asked."""

    def row(self, pass_name: str, case: str, lane: str) -> Mapping[str, Any] | None:
        return next((r for r in self.rows if r["pass"] == pass_name and r["case"] == case
                     and r["lane"] == lane), None)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def run_phase(folder: Path, name: str, model: ModelRef, engine: Mapping[str, Any], sampling: Sampling,
              passes: Sequence[Mapping[str, Any]], capture_dir: Path,
              timeout_s: float = PHASE_TIMEOUT_S, python: str | None = None,
              observe: Mapping[str, Any] | None = None, wrap: Sequence[str] = (),
              env_with: Any = None) -> Phase:
    """Start one engine in a child process group (under ``python``: a vLLM release's venv, else this
    interpreter), run ``passes`` (``observe``: see :mod:`harness.kinds.kv.phase`), read its capture back.
    ``wrap``: an argv prefix the engine runs under (a mount namespace, :mod:`harness.kinds.kv.faults.inject`);
    ``env_with``: a function of the engine's environment giving the one it runs with (a preloaded
    fault shim)."""
    folder.mkdir(parents=True, exist_ok=True)
    req, res = folder / f"{name}.request.json", folder / f"{name}.result.jsonl"
    log = folder / f"{name}.engine.log"
    req.write_text(json.dumps({"model": model.path, "engine": dict(engine), "sampling": sampling.to_json(),
                               "passes": list(passes), **({"observe": dict(observe)} if observe else {})},
                              indent=1))
    t0 = time.perf_counter()
    env = engine_env(repo_on_path=True)
    env = preload_env(python, env) if python else env
    argv = [*wrap, python or sys.executable, "-m", "harness.kinds.kv.phase", str(req), str(res)]
    exited = run_engine(argv, log, timeout_s, env_with(env) if env_with is not None else env, cwd=folder,
                        label=f"KV {name} engine ({model.name})")
    capture = None
    if capture_dir.is_dir():
        try:
            capture = read_capture(capture_dir)
        except CaptureError:
            capture = None
    try:
        done = check_result(res, f"the KV {name} engine", exited, log=log.read_text(errors="replace"),
                            diagnose=root_cause, doing=f"running {len(passes)} passes")
    except WorkerFailed as e:
        ledger.record("kv-phase", model.name, None, ok=False, phase=name, wall_s=time.perf_counter() - t0)
        compat = dict(e.head.get("compat") or {})
        return Phase(name, False, e.reason, str(compat.get("vllm", "")), {}, (), capture, log, compat,
                     skipped=e.status == "skip")
    head = done.meta
    ledger.record("kv-phase", model.name, (head.get("timings") or {}).get("engine_start_s"), ok=True,
                  phase=name, wall_s=time.perf_counter() - t0)
    return Phase(name, True, "", str(head.get("version", "")), dict(head.get("timings", {})),
                 tuple(done.of("case")), capture, log, dict(head.get("compat") or {}),
                 observed=dict(head.get("observed") or {}))


def merge_compat(phases: Sequence[Phase]) -> dict[str, Any]:
    """The phases' :mod:`harness.kinds.kv.compat` findings as one block: the release, every difference it
    absorbed (once), the hooks it lacked, and the probes' answers."""
    found = [ph.compat for ph in phases if ph.compat]
    if not found:
        return {}
    return {"vllm": found[0].get("vllm", ""),
            "notes": list(dict.fromkeys(n for c in found for n in c.get("notes", ()))),
            "missing": list(dict.fromkeys(m for c in found for m in c.get("missing", ()))),
            "offers": {k: v for c in found for k, v in c.get("offers", {}).items()}}


def shift_prompt(ids: Sequence[int], by: int, vocab: int) -> list[int]:
    """A same-length, same-shape copy of a prompt with other tokens (no shared prefix with it)."""
    return [2 + (int(t) - 2 + by * 37) % (vocab - 2) for t in ids]


def vocab_size(model: ModelRef) -> int:
    cfg = Path(model.path) / "config.json"
    try:
        return int(json.loads(cfg.read_text()).get("vocab_size", 32000))
    except (OSError, ValueError):
        return 32000


def request(case: str, ids: Sequence[int], lane: str = "clean", **kw: Any) -> dict[str, Any]:
    return {"case": case, "lane": lane, "prompt_ids": list(ids), **kw}


def producer_passes(cases: Sequence[Case], reps: int, vocab: int, copies: int = 1) -> list[dict[str, Any]]:
    """Warm-up, then ``reps`` x (record-off, record-on) on shifted copies, then the real write.

    Every timing request is a distinct shift of a case (off passes even shifts, on passes odd), so
    each pass computes and stores as much as the real write, ``copies`` times over."""
    shifted = lambda by, capture: [  # noqa: E731
        request(c.id, shift_prompt(c.prompt_ids, by + 10 * k, vocab), "scratch", capture=capture)
        for k in range(copies) for c in cases]
    passes = [{"name": "warm", "requests": [request(cases[0].id, shift_prompt(cases[0].prompt_ids, 1, vocab),
                                                 "scratch", capture=False)]}]
    for r in range(reps):
        passes.append({"name": f"off{r}", "requests": shifted(2 + 2 * r, False)})
        passes.append({"name": f"on{r}", "requests": shifted(3 + 2 * r, True)})
    passes.append({"name": "write", "requests": [request(c.id, c.prompt_ids) for c in cases]})
    return passes


def consumer_passes(cases: Sequence[Case], control: Case | None,
                    lanes: Sequence[str]) -> list[dict[str, Any]]:
    reqs = [request(c.id, c.prompt_ids) for c in cases]
    reqs += [request(c.id, c.prompt_ids, "ref", passive=True, skip_reading=True, capture=False)
             for c in cases]
    if control is not None:
        reqs += [request(control.id, control.prompt_ids, lane) for lane in lanes]
    return [{"name": "restore", "requests": reqs}]
