"""The fault table's rows about files and runs side by side: the disk full while a record or
goldens are written (a small tmpfs in a private user + mount namespace, ``unshare -rm``: no root
needed), four gates at once on one workspace, a corrupt record among the records the pages read,
and SIGTERM to ``make test``."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.chaos.launch import (
    MODEL,
    Sandbox,
    engine_up,
    harness,
    last_error,
    run,
    signal_harness,
    unwrapped,
)
from harness.chaos.table import Row, scenario
from harness.chaos.watch import GUARD, TreeWatch, broken_goldens, broken_records
from harness.excerpt import LINE, clip
from harness.workspace import REPO_ROOT

TMPFS_KIB = 512

# Inside the namespace: fill the tmpfs at $1 but for $2 bytes, run the harness, then say (one JSON
# line) whether the earlier files are intact and what was left there.
CHECK = """
import hashlib, json, os, subprocess, sys
folder, keep = sys.argv[1], int(sys.argv[2])
def digest():
    h = hashlib.sha256()
    for base, _, files in sorted(os.walk(folder)):
        for f in sorted(files):
            if f != "filler":
                h.update(f.encode() + open(os.path.join(base, f), "rb").read())
    return h.hexdigest()
before = digest()
st = os.statvfs(folder)
open(os.path.join(folder, "filler"), "wb").write(b"x" * max(0, st.f_bavail * st.f_frsize - keep))
r = subprocess.run([sys.executable, "-m", "harness.cli", *sys.argv[3:]], capture_output=True, text=True)
files = sorted(os.path.relpath(os.path.join(b, f), folder) for b, _, fs in os.walk(folder) for f in fs)
print(json.dumps({"rc": r.returncode, "out": (r.stdout + r.stderr)[-3000:], "intact": digest() == before,
                  "files": files}))
"""


def _full_disk(tmp: Path, name: str, mount: str, keep: int, argv: list[str],
               seed: dict[str, Path]) -> tuple[dict[str, Any], float]:
    """Run ``argv`` with ``sandbox/mount`` a nearly full tmpfs holding ``seed`` (relative path ->
    source: the earlier files, which must come out intact)."""
    sandbox = Sandbox.make(tmp, name)
    folder = sandbox.root / mount
    held = tmp / f"{name}-seed"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for rel, src in seed.items():
        (held / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, held / rel) if src.is_dir() else shutil.copy2(src, held / rel)
    (tmp / "check.py").write_text(CHECK)
    script = (f'mount -t tmpfs -o size={TMPFS_KIB}k tmpfs "{folder}" && cp -a "{held}/." "{folder}/" && '
              f'exec "{sys.executable}" "{tmp / "check.py"}" "{folder}" {keep} {" ".join(argv)}')
    t0 = time.monotonic()
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=3600,
                       cwd=sandbox.root, env=sandbox.env())
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"unshare -rm + tmpfs failed ({r.returncode}): {(r.stdout + r.stderr)[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), time.monotonic() - t0


def _disk_row(fault: str, out: dict[str, Any], seconds: float, needle: str, what: str,
              root: Path) -> Row:
    said = unwrapped(out["out"])
    clear = out["rc"] == 2 and "No space left on device" in said and needle in said
    partial = [f for f in out["files"] if f.startswith(".") or "/." in f or f.endswith(".tmp")]
    lost = ([] if out["intact"] else [f"the earlier {what} changed"]) + [f"left behind: {f}" for f in partial]
    return Row(fault, f"a {TMPFS_KIB} KiB tmpfs, full but for a few KiB, under the {what}",
               f"exit {out['rc']}: {last_error(out['out'], root)}", "; ".join(lost) or "nothing", 0, 0,
               seconds, "s for the whole run", clear and not lost)


@scenario("disk-full-record", engines=0)
def disk_full_record(tmp: Path) -> Row:
    earlier = sorted((REPO_ROOT / "reports" / "records" / MODEL / "smoke").glob("*.json"))[-1]
    out, s = _full_disk(tmp, "full-records", "reports/records", 2048,
                        ["gate", "--model", MODEL, "--suite", "smoke", "--candidate", "hf"],
                        {f"{MODEL}/smoke/{earlier.name}": earlier})
    return _disk_row("the disk full while a record is written (gate, hf candidate)", out, s,
                     "the record could not be written", "records", tmp / "full-records")


@scenario("disk-full-goldens", engines=1)
def disk_full_goldens(tmp: Path) -> Row:
    out, s = _full_disk(tmp, "full-goldens", f"goldens/{MODEL}", 8192,
                        ["record", "--model", MODEL, "--suite", "smoke"],
                        {"smoke": REPO_ROOT / "goldens" / MODEL / "smoke"})
    return _disk_row("the disk full while goldens are recorded (make record)", out, s,
                     "the goldens could not be written", "goldens", tmp / "full-goldens")


@scenario("four-gates-at-once", engines=1)
def four_gates(tmp: Path) -> Row:
    """Four gates on one workspace, goldens missing: one oracle run, four intact records."""
    sandbox = Sandbox.make(tmp, "four")
    shutil.rmtree(sandbox.goldens / MODEL / "smoke")
    argv = harness("gate", "--model", MODEL, "--suite", "smoke", "--candidate", "hf")
    t0 = time.monotonic()
    procs, logs = [], []
    for i in range(4):
        logs.append((sandbox.root / f"gate{i}.log").open("wb"))
        procs.append(subprocess.Popen(argv, stdout=logs[-1], stderr=subprocess.STDOUT, cwd=sandbox.root,
                                      env=sandbox.env(), start_new_session=True))
    watches = [TreeWatch(p.pid) for p in procs]
    rcs = [p.wait(timeout=3600) for p in procs]
    for fh in logs:
        fh.close()
    wall = time.monotonic() - t0
    oracle_runs = len({k for w in watches for k, cmd in w.seen.items()
                       if "vllm/worker.py" in cmd and GUARD not in cmd})
    left = []
    for w in watches:
        left += w.wait_gone(30)[1]
        w.stop()
    records = sorted(p for p in sandbox.records.rglob("*.json") if not p.name.startswith("."))
    lost = broken_records(sandbox.records) + broken_goldens(sandbox.goldens, [(MODEL, "smoke")])
    if len(records) != 4:
        lost.append(f"{len(records)} records, expected 4")
    if oracle_runs != 1:
        lost.append(f"the oracle ran {oracle_runs} times for one set of goldens")
    outcomes = sorted(json.loads(p.read_text())["outcome"] for p in records) if not lost else []
    did = f"exits {rcs}; {oracle_runs} oracle run(s); records {outcomes or len(records)}"
    return Row("four gates at once on one checkout and goldens folder (goldens missing)",
               "4 x `harness gate --candidate hf` started together", did, "; ".join(lost) or "nothing",
               len(left), sum(len(w.seen) for w in watches), wall, "s for all four",
               not lost and not left and rcs == [0, 0, 0, 0])


@scenario("corrupt-record", engines=0)
def corrupt_record(tmp: Path) -> Row:
    sandbox = Sandbox.make(tmp, "corrupt", extra=("features.toml", "reports/records", "requirements"))
    victim = sorted((sandbox.records / MODEL / "smoke").glob("*.json"))[-1]
    victim.write_text(victim.read_text()[:700])  # cut mid-way, as a crash or a bad merge would leave it
    t0 = time.monotonic()
    r = subprocess.run(harness("features"), capture_output=True, text=True, cwd=sandbox.root,
                       env=sandbox.env(), timeout=1800)
    pages = (sandbox.root / "FEATURES.md").read_text() if (sandbox.root / "FEATURES.md").exists() else ""
    shown = "⚠" in pages and victim.name in pages
    return Row("a corrupt record JSON in reports/records", f"{victim.name} cut to 700 bytes",
               f"exit {r.returncode}; FEATURES.md {'shows ⚠ naming the file' if shown else 'lacks the ⚠'}",
               "nothing" if r.returncode == 0 else f"the pages were not written: {last_error(r.stderr)}",
               0, 0, time.monotonic() - t0, "s for make features", r.returncode == 0 and shown)


MAKE_TEST = '''
from pathlib import Path


def test_a_gate_on_the_real_engine(parity_gate):
    parity_gate(model="{model}", suite="smoke", candidate="vllm")


def test_after(tmp_path):
    Path({marker!r}).write_text("ran")
'''


@scenario("sigterm-to-make-test", engines=1)
def sigterm_make_test(tmp: Path) -> Row:
    """SIGTERM to `make test` while a test runs a real engine: the whole run stops, nothing is left."""
    sandbox = Sandbox.make(tmp, "make")
    marker = sandbox.root / "second-test-ran"
    test = sandbox.root / "test_chaos_make.py"
    test.write_text(MAKE_TEST.format(model=MODEL, marker=str(marker)))
    argv = ["make", "-C", str(REPO_ROOT), "-o", ".venv/.installed", "test",
            f"PYTEST_ARGS={test} -p no:cacheprovider -q"]
    ran = run(sandbox, argv, trigger=engine_up("vllm/worker.py"), inject=signal_harness(signal.SIGTERM))
    gone_s, left = ran.watch.wait_gone(30)
    ran.watch.stop()
    stopped = "SIGTERM" in ran.output and not marker.exists()
    return Row("SIGTERM to `make test` (a cancelled CI job) while a test runs an engine",
               "SIGTERM to make once the engine core was up",
               f"make exit {ran.rc}; pytest "
               + ("stopped (Terminated), the next test never ran" if stopped else "went on"),
               "nothing" if stopped else "the run went on", len(left), len(ran.watch.seen),
               (ran.after_s or 0.0) + gone_s, "s from SIGTERM until no process was left",
               ran.injected is not None and stopped and not left,
               "\n".join(f"left: {pid} {clip(cmd, LINE)}" for pid, cmd in left))
