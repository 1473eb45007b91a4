"""Two shards that want the same missing goldens at the same moment: one records, the other waits
and verifies what the first wrote. Real processes racing on a real workspace; the "oracle" here
copies the committed goldens into place the way write_golden does (temp folder + rename), slowly."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path

from harness.fleet import recording
from harness.goldens import GoldenError
from harness.workspace import REPO_ROOT, Workspace

SOURCE = REPO_ROOT / "goldens" / "tiny-llama" / "smoke"


def fake_oracle(ws: Workspace, log: Path, corrupt: bool) -> None:
    """Record goldens: slowly, atomically, and say so in ``log``."""
    folder = ws.goldens / "tiny-llama" / "smoke"
    time.sleep(0.8)  # long enough for the other process to find the goldens missing too
    tmp = folder.with_name(f".smoke.{os.getpid()}")
    shutil.copytree(SOURCE, tmp)
    if corrupt:
        (tmp / "cases.jsonl").write_text((tmp / "cases.jsonl").read_text().replace('"c01"', '"c99"', 1))
    while True:  # without the lock the other contender may be renaming its own copy at this moment
        try:
            os.rename(tmp, folder)
            break
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            aside = folder.with_name(f".smoke.old.{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                os.rename(folder, aside)
            shutil.rmtree(aside, ignore_errors=True)
    with log.open("a") as fh:
        fh.write(f"recorded by {os.getpid()}\n")


def contender(root: str, log: str, barrier: mp.synchronize.Barrier, corrupt: bool, lock: bool,
              out: mp.queues.Queue) -> None:
    ws = Workspace(Path(root))
    if not lock:
        recording.exclusive = lambda path, timeout_s=0: contextlib.nullcontext()  # planted: no lock
    barrier.wait()

    def run(auto_record: bool) -> str:
        if auto_record:
            fake_oracle(ws, Path(log), corrupt)
            return "ran on goldens it recorded"
        return "ran on goldens it read"

    try:
        result, how = recording.with_goldens(ws, "tiny-llama", "tiny-llama", "smoke", run, may_record=True)
        out.put((how.how, result))
    except GoldenError as e:
        out.put(("error", str(e)))


def race(tmp_path: Path, *, corrupt: bool = False, lock: bool = True) -> tuple[list[tuple[str, str]], list[str]]:
    ws = tmp_path / "ws"
    (ws / "goldens" / "tiny-llama").mkdir(parents=True)
    log = tmp_path / "oracle.log"
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=contender, args=(str(ws), str(log), barrier, corrupt, lock, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = sorted(out.get(timeout=5) for _ in procs)
    return results, (log.read_text().splitlines() if log.exists() else [])


def test_two_shards_record_once_and_the_second_verifies(tmp_path: Path) -> None:
    results, log = race(tmp_path)
    assert len(log) == 1, f"the oracle ran {len(log)} times: {log}"
    assert results == [("recorded", "ran on goldens it recorded"), ("verified", "ran on goldens it read")]


def test_planted_without_the_lock_both_record(tmp_path: Path) -> None:
    """The race is real: take the lock away and both processes run the oracle."""
    results, log = race(tmp_path, lock=False)
    assert len(log) == 2, log
    assert [how for how, _ in results] == ["recorded", "recorded"]


def test_the_second_reader_refuses_what_the_first_wrote_when_it_is_corrupt(tmp_path: Path) -> None:
    results, log = race(tmp_path, corrupt=True)
    assert len(log) == 1
    (how, msg), (how2, _) = results
    assert how == "error" and how2 == "recorded"
    assert "cases.jsonl: checksum mismatch" in msg and "make record MODEL=tiny-llama SUITE=smoke" in msg


def test_committed_goldens_need_no_lock(workspace: Workspace) -> None:
    calls = []
    result, how = recording.with_goldens(workspace, "tiny-llama", "tiny-llama", "smoke",
                                         lambda auto: calls.append(auto) or "ok", may_record=True)
    assert (result, how.how, calls) == ("ok", "committed", [False])
    assert not recording.lock_path(workspace, "tiny-llama", "smoke").exists()


def test_a_held_lock_times_out_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with recording.exclusive(path):
        ctx = mp.get_context("fork")
        q = ctx.Queue()

        def wait() -> None:
            try:
                with recording.exclusive(path, timeout_s=0.5):
                    q.put("got it")
            except GoldenError as e:
                q.put(str(e))

        p = ctx.Process(target=wait)
        p.start()
        p.join(10)
        msg = q.get(timeout=5)
    assert "x.lock: still locked after" in msg and f"pid {os.getpid()}" in msg
