"""The one worker protocol (harness/engines/launch/worker_lines.py): its tolerant reader, the host's check
of a result file, the pass loop, and the standalone workers that load its writer by path."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.api import EngineFailed, EngineRefused
from harness.engines.launch import worker_lines as wl
from harness.engines.launch.procs import Exited, run_engine
from harness.engines.vllm.runner import root_cause
from harness.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
META = {"kind": "meta", "version": "1.0", "timings": {"engine_start_s": 1.0}}
CASE = {"kind": "case", "id": "c01", "token_ids": [5, 6]}
OK = Exited(0, False, 4242)


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "result.jsonl"
    p.write_text(text)
    return p


def _lines(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def test_a_whole_result_is_its_meta_and_body(tmp_path: Path) -> None:
    out = io.StringIO()
    wl.write_result(out, {"version": "1.0"}, [CASE])
    done = wl.check_result(_file(tmp_path, out.getvalue()), "the w worker", OK)
    assert done.meta == {"kind": "meta", "version": "1.0"} and done.body == [CASE]
    assert done.of("case") == [CASE] and done.of("score") == []


def test_a_last_line_cut_by_a_kill_is_left_out_and_the_result_is_incomplete(tmp_path: Path) -> None:
    path = _file(tmp_path, _lines(META, CASE) + '{"kind": "case", "id": "c02", "tok')
    got = wl.read_lines(path)
    assert got.lines == [META, CASE] and got.cut and not got.garbage
    with pytest.raises(wl.WorkerFailed) as e:
        wl.check_result(path, "the w worker", Exited(1, False, 4242), doing="running 2 cases")
    assert e.value.reason == "the w worker (pid 4242) exited with 1 while running 2 cases: its last line was cut short"
    assert e.value.status == "error" and e.value.head == META


def test_a_whole_last_line_without_its_newline_still_counts(tmp_path: Path) -> None:
    got = wl.read_lines(_file(tmp_path, _lines(META, CASE) + json.dumps(wl.END)))
    assert got.lines == [META, CASE, wl.END] and not got.cut


def test_a_garbage_line_is_an_error_naming_the_worker_and_the_line(tmp_path: Path) -> None:
    path = _file(tmp_path, _lines(META) + "Traceback (most recent call last):\n" + _lines(CASE, wl.END))
    with pytest.raises(wl.WorkerFailed) as e:
        wl.check_result(path, "the ct2 worker", OK)
    assert e.value.reason == ("the ct2 worker broke the result protocol: line 2 of result.jsonl is not a JSON "
                              "object: 'Traceback (most recent call last):'")
    assert wl.read_lines(_file(tmp_path, "[1, 2]\n" + _lines(wl.END))).garbage.startswith("line 1 of")


def test_a_missing_end_line_is_an_error_naming_the_worker(tmp_path: Path) -> None:
    with pytest.raises(wl.WorkerFailed) as e:
        wl.check_result(_file(tmp_path, _lines(META, CASE)), "the KV write engine", OK, doing="running 3 passes")
    assert e.value.reason == ("the KV write engine (pid 4242) exited with 0 while running 3 passes: it wrote 2 "
                              "line(s) but no end line")
    with pytest.raises(wl.WorkerFailed, match=r"^the w worker exited with 1 while it ran: it wrote no result$"):
        wl.check_result(tmp_path / "never-written.jsonl", "the w worker", Exited(1, False))
    with pytest.raises(wl.WorkerFailed, match="its first line is 'case', not the meta line"):
        wl.check_result(_file(tmp_path, _lines(CASE, wl.END)), "the w worker", OK)


def test_a_kill_names_the_signal_and_the_process_not_what_followed_in_the_log(tmp_path: Path) -> None:
    log = "(EngineCore pid=7) ERROR OSError: [Errno 22] Invalid argument\n"
    path = _file(tmp_path, _lines(META))
    with pytest.raises(wl.WorkerFailed) as e:
        wl.check_result(path, "engine vllm", Exited(-signal.SIGKILL, False, 4242), log=log, diagnose=root_cause,
                        doing="running 8 cases of tiny-llama")
    assert e.value.reason == "engine vllm (pid 4242) was killed by SIGKILL while running 8 cases of tiny-llama"
    with pytest.raises(wl.WorkerFailed) as e:  # a crash of its own: the log's first error says more
        wl.check_result(path, "engine vllm", Exited(-signal.SIGSEGV, False, 4242), log=log, diagnose=root_cause)
    assert e.value.reason == ("engine vllm (pid 4242) was killed by SIGSEGV while it ran; the first error in its "
                              "log: OSError: [Errno 22] Invalid argument")


def test_a_refusal_a_skip_and_a_start_error_keep_the_engines_own_words(tmp_path: Path) -> None:
    out = io.StringIO()
    try:
        raise ValueError("head size 80 is not supported")
    except ValueError as exc:
        assert wl.write_start_failure(out, "refused", f"ValueError: {exc}", exc) == wl.NOT_STARTED
    head = json.loads(out.getvalue())
    assert head["kind"] == "refused" and "ValueError: head size 80" in head["traceback"]
    with pytest.raises(wl.WorkerFailed) as e:
        wl.check_result(_file(tmp_path, out.getvalue()), "engine vllm", Exited(3, False))
    assert e.value.status == "refused" and e.value.reason == "ValueError: head size 80 is not supported"
    refused = e.value.engine_error(prefix="ct2: ")
    assert isinstance(refused, EngineRefused) and str(refused) == "ct2: ValueError: head size 80 is not supported"
    skip = io.StringIO()
    wl.write_start_failure(skip, "skip", "vLLM 0.1 lacks X", compat={"vllm": "0.1"})
    with pytest.raises(wl.WorkerFailed) as e:
        wl.check_result(_file(tmp_path, skip.getvalue()), "the KV write engine", Exited(3, False))
    assert e.value.status == "skip" and e.value.head["compat"] == {"vllm": "0.1"}
    crash = _lines({"kind": "error", "reason": "RuntimeError: Engine core initialization failed"})
    with pytest.raises(wl.WorkerFailed, match="^RuntimeError: Engine core initialization failed$") as e:
        wl.check_result(_file(tmp_path, crash), "engine vllm", Exited(3, False))
    assert isinstance(e.value.engine_error("tail"), EngineFailed)
    log = "NotImplementedError: Speculative decoding does not support X on CPU\n"
    with pytest.raises(wl.WorkerFailed) as e:  # the log's root cause beats the wrapper's words
        wl.check_result(_file(tmp_path, crash), "engine vllm", Exited(3, False), log=log, diagnose=root_cause)
    assert e.value.status == "refused" and e.value.reason.startswith("NotImplementedError: Speculative")


def test_a_timeout_names_the_worker_and_the_limit(tmp_path: Path) -> None:
    with pytest.raises(wl.WorkerFailed, match=r"^the llama.cpp worker did not finish within 300 s and was stopped$"):
        wl.check_result(_file(tmp_path, _lines(META)), "the llama.cpp worker", Exited(-9, True, 1, 300.0))


def test_the_pass_loop_keeps_the_order_and_times_each_pass() -> None:
    seen = []

    def run_pass(p: dict) -> tuple[list[dict], float]:
        seen.append(p["name"])
        return [{"kind": "case", "pass": p["name"]}], 0.5

    lines, timings = wl.run_passes([{"name": "alone"}, {"name": "together"}], run_pass)
    assert seen == ["alone", "together"] and [d["pass"] for d in lines] == seen
    assert timings == {"pass_alone_s": 0.5, "pass_together_s": 0.5}


ENGINE = """\
import json, os, signal, sys
with open(sys.argv[1], "w") as out:
    out.write(json.dumps({"kind": "meta", "pid": os.getpid()}) + "\\n")
    out.write('{"kind": "case", "id": "c01", "token_ids": [1, 2')
    out.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_engine_killed_while_writing_is_named_with_its_pid_and_signal(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text(ENGINE)
    res = tmp_path / "result.jsonl"
    exited = run_engine([sys.executable, str(tmp_path / "engine.py"), str(res)], tmp_path / "log", 60, label="w")
    pid = json.loads(res.read_text().splitlines()[0])["pid"]
    assert exited.returncode == -signal.SIGKILL and exited.pid == pid
    with pytest.raises(wl.WorkerFailed) as e:
        wl.check_result(res, "engine planted", exited, doing="running 1 case")
    assert e.value.reason == f"engine planted (pid {pid}) was killed by SIGKILL while running 1 case"


STANDALONE = """\
import importlib.util, json, sys
sys.argv = ["x", "run", sys.argv[1], sys.argv[2]]
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
wp = load("worker_protocol", "{root}/harness/engines/pip/workers/worker_protocol.py")
llama = load("llamacpp_worker", "{root}/harness/engines/llamacpp/draws_worker.py")
import numpy as np
class Planted(wp.Engine):
    def version(self): return "planted 1"
    def start(self): pass
    def generate(self, prompt_ids, max_tokens, k):
        return wp.Generated([3, 1], "", "length", logits=np.eye(4, dtype=np.float32)[[3, 1]])
rc = wp.run(Planted, sys.argv[2], sys.argv[3])
print(json.dumps({{"rc": rc, "harness": sorted(m for m in sys.modules if m.split(".")[0] == "harness"),
                  "writers": sorted({{wp.worker_lines.__file__, llama.worker_lines.__file__}})}}))
"""


def test_standalone_workers_write_through_the_one_module_without_the_harness(tmp_path: Path) -> None:
    """The PyPI engines' workers and the llama.cpp sampler run in venvs without the harness: they load
    this module's writer by its path (no copy to drift), and the host reads what they write."""
    req, res = tmp_path / "request.json", tmp_path / "result.jsonl"
    req.write_text(json.dumps({"sampling": {"max_tokens": 2, "logprobs": 2}, "cases": [{"id": "c01",
                                                                                       "prompt_ids": [1]}]}))
    code = STANDALONE.format(root=ROOT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-c", code, str(req), str(res)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    said = json.loads(p.stdout.splitlines()[-1])
    assert said["rc"] == 0 and said["harness"] == [], said
    assert said["writers"] == [str(ROOT / "harness" / "engines" / "launch" / "worker_lines.py")]
    done = wl.check_result(res, "the planted worker", Exited(0, False))
    assert done.meta["engine_version"] == "planted 1" and done.of("case")[0]["token_ids"] == [3, 1]


def test_the_workers_carry_no_writer_of_their_own() -> None:
    """One writer: no worker defines its own line writer or end line any more."""
    workers = [ROOT / "harness" / "engines" / "vllm" / "worker.py", ROOT / "harness" / "kinds" / "kv" / "phase.py",
               ROOT / "harness" / "engines" / "vllm" / "phase.py", ROOT / "harness" / "engines" / "vllm" / "serve.py",
               ROOT / "harness" / "engines" / "llamacpp" / "draws_worker.py",
               *sorted((ROOT / "harness" / "engines" / "pip" / "workers").glob("*.py"))]
    for path in workers:
        text = path.read_text()
        assert "def write_line" not in text and '{"kind": "end"}' not in text.split('"""', 2)[-1], path


HANG = """\
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""


def test_ctrl_c_during_a_gate_is_one_line_naming_what_ran_and_exit_130(workspace: Workspace,
                                                                       tmp_path: Path) -> None:
    """A user's Ctrl-C used to print a traceback through harness/cli.py, after a ``failed:`` line
    per running step. Now: one line, exit 130, no record, and the engine stopped."""
    (tmp_path / "hang.py").write_text(HANG)
    pidfile = tmp_path / "engine.pid"
    env = {**os.environ, "HARNESS_ROOT": str(workspace.root), "PYTHONPATH": str(ROOT)}
    harness = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "gate", "--model", "tiny-llama", "--suite", "smoke",
         "--candidate", f"cmd:{sys.executable} {tmp_path / 'hang.py'} {pidfile}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not pidfile.exists() and harness.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pidfile.exists(), harness.communicate(timeout=60)
    time.sleep(0.5)
    harness.send_signal(signal.SIGINT)
    _, err = harness.communicate(timeout=60)
    said = [line for line in err.splitlines() if line.strip()]
    assert harness.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert said[-1].startswith("interrupted: ") and said[-1].endswith(", nothing written"), err
    assert "tiny-llama/smoke" in said[-1], said[-1]
    assert not [p for p in workspace.records.rglob("*.json")], "a record was written after Ctrl-C"
    assert not Path(f"/proc/{pidfile.read_text()}").exists() or _zombie(int(pidfile.read_text()))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except OSError:
        return True
