"""The fault table's rows about processes: the harness killed (SIGKILL, SIGTERM, SIGINT) during a
gate, during goldens recording and during a KV round trip; the candidate engine killed mid-run; an
engine that stops answering. Each runs the real pinned vLLM on tiny-llama (one engine start)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

from harness.chaos.launch import MODEL, Ran, Sandbox, engine_up, harness, last_error, run, signal_harness
from harness.chaos.table import Row, scenario
from harness.chaos.watch import TreeWatch, broken_goldens, broken_records, broken_store
from harness.excerpt import LINE, NOTE, clip

SETTLE_S = 30.0
"""How long processes may take to go after the harness has exited (the guard's grace is 10 s)."""
HANG_TIMEOUT_S = 300
"""The configured engine timeout (``HARNESS_VLLM_TIMEOUT_S``) for the engine that stops answering."""

WHAT = {
    "gate": (["gate", "--model", MODEL, "--suite", "smoke", "--candidate", "vllm"], ()),
    "record": (["record", "--model", MODEL, "--suite", "smoke"], ()),
    "kv": (["gate", "--model", MODEL, "--suite", "kv_roundtrip"], ("harness.kinds.kv.phase",)),
}
DURING = {"gate": "a gate (vllm candidate)", "record": "goldens recording (make record)",
          "kv": "a KV round trip (producer engine)"}


def _exit(rc: int) -> str:
    return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"


def _finish(fault: str, injected: str, ran: Ran, sandbox: Sandbox, lost: list[str], did: str = "") -> Row:
    gone_s, left = ran.watch.wait_gone(SETTLE_S)
    ran.watch.stop()
    lost = lost + broken_records(sandbox.records)
    for store in sandbox.root.glob("reports/runs/kv-*/store*"):
        lost += broken_store(store)
    seen = len(ran.watch.seen)
    return Row(fault=fault, injected=injected if ran.injected else f"{injected} (never: {ran.injected})",
               did=did or f"{_exit(ran.rc)}: {last_error(ran.output, sandbox.root)}",
               lost="; ".join(lost) or "nothing", left=len(left), seen=seen,
               seconds=(ran.after_s or 0.0) + gone_s, figure="s from the fault until no process was left",
               ok=ran.injected is not None and not left and not lost,
               detail="\n".join(f"left: {pid} {clip(cmd, LINE)}" for pid, cmd in left))


def _signal_row(what: str, sig: signal.Signals, tmp: Path) -> Row:
    sandbox = Sandbox.make(tmp, f"{what}-{sig.name}")
    argv, needles = WHAT[what]
    ran = run(sandbox, harness(*argv), trigger=engine_up(*needles), inject=signal_harness(sig))
    # complete goldens (the earlier ones, or new ones written whole before the signal) are not a loss
    lost = broken_goldens(sandbox.goldens, [(MODEL, "smoke"), (MODEL, "kv_roundtrip")])
    row = _finish(f"{sig.name} to the harness during {DURING[what]}",
                  f"{sig.name} once the engine core was up", ran, sandbox, lost)
    if ran.injected and ran.rc == 0:  # the run went on to the end: the signal stopped nothing
        return replace(row, did=f"{row.did} (the signal did not stop the run)", ok=False)
    return row


for _what in WHAT:
    for _sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        scenario(f"{_sig.name.lower()}-during-{_what}", engines=1)(
            lambda tmp, w=_what, s=_sig: _signal_row(w, s, tmp))


@scenario("candidate-sigkill", engines=1)
def candidate_killed(tmp: Path) -> Row:
    """The candidate engine (its vLLM frontend process) killed mid-run: error verdicts, a record."""
    sandbox = Sandbox.make(tmp, "candidate-kill")

    def kill_engine(proc: subprocess.Popen[bytes], watch: TreeWatch) -> str:
        pids = watch.matching("vllm/worker.py")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return f"SIGKILL to the vLLM engine process {pids}"

    ran = run(sandbox, harness(*WHAT["gate"][0]), trigger=engine_up("vllm/worker.py"), inject=kill_engine)
    lost, did = _one_record(sandbox, want="error")
    return _finish("the candidate engine killed with SIGKILL mid-run", "SIGKILL to the engine", ran, sandbox,
                   lost, did=f"{_exit(ran.rc)}; {did}")


@scenario("engine-stops-answering", engines=1)
def engine_hangs(tmp: Path) -> Row:
    """Every engine process stopped (SIGSTOP) once up: the configured timeout must end the run."""
    sandbox = Sandbox.make(tmp, "hang")

    def stop_engine(proc: subprocess.Popen[bytes], watch: TreeWatch) -> str:
        pids = [p for n in ("vllm/worker.py", "EngineCore", "VLLM::Worker") for p in watch.matching(n)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return f"SIGSTOP to the engine's {len(pids)} processes"

    ran = run(sandbox, harness(*WHAT["gate"][0]), trigger=engine_up("vllm/worker.py"), inject=stop_engine,
              env={"HARNESS_VLLM_TIMEOUT_S": str(HANG_TIMEOUT_S)})
    lost, did = _one_record(sandbox, want="error", needle=f"did not finish within {HANG_TIMEOUT_S}")
    row = _finish(f"an engine that stops answering (timeout {HANG_TIMEOUT_S} s)",
                  "SIGSTOP to every engine process once up", ran, sandbox, lost,
                  did=f"{_exit(ran.rc)} after {ran.wall_s:.0f} s from launch; {did}")
    return replace(row, seconds=ran.wall_s, figure=f"s from launch to the timeout error (configured "
                   f"{HANG_TIMEOUT_S} s)", ok=row.ok and ran.wall_s <= HANG_TIMEOUT_S + 60)


def _one_record(sandbox: Sandbox, want: str, needle: str = "") -> tuple[list[str], str]:
    """(what is missing, what the record says) for a run that must leave one record ``want``."""
    from harness.records import RecordError, load_record

    paths = sorted(p for p in sandbox.records.rglob("*.json") if not p.name.startswith("."))
    if len(paths) != 1:
        return [f"{len(paths)} records written, expected 1"], ""
    try:
        rec = load_record(paths[0])
    except RecordError as e:
        return [clip(str(e), NOTE)], ""
    first = next((v.summary for v in rec.verdicts if v.status == want), "")
    said = " ".join(v.summary + v.detail for v in rec.verdicts)
    ok = rec.outcome == want and (not needle or needle in said)
    return ([] if ok else [f"the record's outcome is {rec.outcome}, expected {want}"
                           + (f" naming {needle!r}" if needle else "")]), \
        f"record {rec.outcome}: {clip(first, LINE)}"
