"""The engine pool's bookkeeping and the engine-start ledger, with a stand-in for vllm_serve.py.

The stand-in speaks the pool's protocol (a request line on stdin, a result file, ``done`` on the
acknowledgement pipe) and answers as a vLLM worker would, without vLLM: a meta line whose
``engine_start_s`` is non-zero only for the first workload of its process, the cases, ``end``. What
the real engine does behind that protocol (a reused engine equals a fresh one, bit for bit) is
tests/integration/test_engine_pool.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.api import Case, EngineRefused, Sampling
from harness.engines.launch import ledger
from harness.engines.vllm import pool as engine_pool
from harness.engines.vllm.pool import EnginePool, key, pooled, unpooled
from harness.engines.vllm.runner import VLLMRunner
from harness.models import ModelRef, content_digest, resolve_model
from harness.workspace import Workspace
from tests.unit.child_pytest import NO_HYPOTHESIS

STUB = """#!{python}
import json, os, sys
ack = os.fdopen(int(sys.argv[2]), "w")
uses = 0
for line in sys.stdin:
    req_path, res_path = line.rstrip("\\n").split("\\t")
    req = json.load(open(req_path))
    with open(res_path, "w") as out:
        if req["engine"].get("block_size") == 16:
            out.write(json.dumps({{"kind": "refused", "reason": "ValueError: block size 16 not supported"}}) + "\\n")
            out.close(); ack.write("done\\n"); ack.flush(); sys.exit(3)
        if req["engine"].get("crash"):
            sys.exit(1)
        uses += 1
        print("workload", uses, "pid", os.getpid(), flush=True)
        out.write(json.dumps({{"kind": "meta", "version": "stub", "pid": os.getpid(), "output_tokens": 1,
                              "timings": {{"engine_start_s": 12.5 if uses == 1 else 0.0, "generate_s": 0.1}},
                              "engine": {{"pooled": True, "uses": uses}}}}) + "\\n")
        for c in req["cases"]:
            out.write(json.dumps({{"kind": "case", "id": c["id"], "token_ids": [os.getpid() % 1000],
                                  "text": "", "top_ids": None, "finish_reason": "length"}}) + "\\n")
        out.write(json.dumps({{"kind": "end"}}) + "\\n")
    ack.write("done\\n"); ack.flush()
"""


@pytest.fixture
def stub(tmp_path: Path) -> str:
    path = tmp_path / "fake-python"
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.ENV, str(path))
    return path


def runner(python: str, tmp_path: Path, **options: object) -> VLLMRunner:
    return VLLMRunner(resolve_model("tiny-llama", Workspace.default()), options, python=python, version="stub",
                      run_dir=tmp_path)


CASES = [Case("a", (1, 2, 3)), Case("b", (4, 5))]
SAMPLING = Sampling(max_tokens=2, logprobs=0)


def test_a_configuration_starts_once_and_is_reused(stub: str, tmp_path: Path, counted: Path) -> None:
    with pooled(max_live=2) as pool:
        first = runner(stub, tmp_path).run(CASES, SAMPLING)
        r = runner(stub, tmp_path)
        second = r.run(CASES, SAMPLING)
        assert [o.token_ids for o in first] == [o.token_ids for o in second]  # the same process served both
        assert r.timings["engine_reused"] == 1.0 and r.timings["engine_start_s"] == 0.0
        assert len(pool.engines) == 1
        log = r.log_path.read_text()
        assert "workload 1" in log and "workload 2" in log  # its start first, then this workload
    lines = ledger.read(counted)
    assert [(x["reused"], x["start_s"]) for x in lines] == [(False, 12.5), (True, 0.0)]
    t = ledger.totals(lines)
    assert (t["starts"], t["reused"], t["start_s"]) == (1, 1, 12.5)


def test_other_settings_get_another_engine_and_the_least_recent_goes(stub: str, tmp_path: Path,
                                                                   counted: Path) -> None:
    with pooled(max_live=1) as pool:
        a1 = runner(stub, tmp_path).run(CASES, SAMPLING)
        b = runner(stub, tmp_path, dtype="bfloat16").run(CASES, SAMPLING)
        assert len(pool.engines) == 1  # a's engine was stopped for b's
        a2 = runner(stub, tmp_path).run(CASES, SAMPLING)
    assert a1[0].token_ids != b[0].token_ids != a2[0].token_ids  # three processes
    assert [x["reused"] for x in ledger.read(counted)] == [False, False, False]
    assert key("py", "m", {"dtype": "float32"}, {}) != key("py", "m", {"dtype": "bfloat16"}, {})
    assert key("py", "m", {}, {"VLLM_X": "1"}) != key("py", "m", {}, {}) == key("py", "m", {}, {"HOME": "/x"})


def test_copies_of_a_model_share_an_engine_and_other_weights_do_not(stub: str, tmp_path: Path,
                                                                     counted: Path) -> None:
    """The key is the checkpoint's content: every test's workspace copy of tiny-llama is served by one
    engine; ``weights=`` with other bytes (same config and tokenizer) gets an engine of its own."""
    model = resolve_model("tiny-llama", Workspace.default())
    copy, planted = tmp_path / "copy" / "tiny-llama", tmp_path / "planted"
    shutil.copytree(model.path, copy)
    shutil.copytree(model.path, planted)
    weights = planted / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    weights.write_bytes(bytes(data))
    elsewhere = ModelRef("tiny-llama", str(copy), content_digest(copy))
    with pooled(max_live=3) as pool:
        a = runner(stub, tmp_path).run(CASES, SAMPLING)
        b = VLLMRunner(elsewhere, {}, python=stub, version="stub", run_dir=tmp_path).run(CASES, SAMPLING)
        c = runner(stub, tmp_path, weights=str(planted)).run(CASES, SAMPLING)
        assert len(pool.engines) == 2
    assert a[0].token_ids == b[0].token_ids != c[0].token_ids  # the copy's process served b; c had its own
    assert [x["reused"] for x in ledger.read(counted)] == [False, True, False]


def test_a_refusal_is_remembered_not_started_again(stub: str, tmp_path: Path, counted: Path) -> None:
    with pooled(max_live=2) as pool:
        for _ in range(2):
            with pytest.raises(EngineRefused, match="block size 16"):
                runner(stub, tmp_path, block_size=16).run(CASES, SAMPLING)
        assert not pool.engines and len(pool.refused) == 1
    assert [(x["reused"], x["ok"]) for x in ledger.read(counted)] == [(False, False), (True, False)]


def test_an_engine_that_dies_leaves_the_pool_and_the_run_fails(stub: str, tmp_path: Path, counted: Path) -> None:
    from harness.api import EngineFailed

    with pooled(max_live=2) as pool:
        with pytest.raises(EngineFailed):
            runner(stub, tmp_path, crash=True).run(CASES, SAMPLING)
        assert not pool.engines and not pool.refused


def test_unpooled_and_no_pool_start_their_own(stub: str, tmp_path: Path) -> None:
    with pooled() as pool:
        with unpooled():
            assert engine_pool.active() is None
        assert engine_pool.active() is pool
    assert engine_pool.active() is not pool


def test_the_summary_names_the_files_that_paid(tmp_path: Path) -> None:
    lines = [{"kind": "vllm", "start_s": 50.0, "reused": False, "test": "tests/integration/test_a.py::t1"},
             {"kind": "vllm", "start_s": 0.0, "reused": True, "test": "tests/integration/test_b.py::t2"},
             {"kind": "kv-phase", "start_s": 40.0, "reused": False, "test": "tests/integration/test_b.py::t3"},
             {"kind": "vllm", "start_s": None, "reused": False, "ok": False, "test": ""}]
    out = ledger.summary(lines)
    assert out[0].startswith("engine starts: 3 (kv-phase 1, vllm 2), 90 s starting; 1 served by a live engine; "
                             "1 refused or failed")
    assert any("test_a.py" in x and "1 starts" in x for x in out)
    assert ledger.summary([]) == ["engine starts: 0, 0 s starting; 0 served by a live engine; "
                                  "0 refused or failed at start"]


def test_ledger_lines_from_several_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "l.jsonl"
    monkeypatch.setenv(ledger.ENV, str(path))
    code = "from harness.engines.launch import ledger; ledger.record('vllm', 'm', 1.0)"
    pids = [os.spawnv(os.P_NOWAIT, sys.executable, [sys.executable, "-c", code]) for _ in range(4)]
    for pid in pids:
        os.waitpid(pid, 0)
    ledger.record("vllm", "m", 2.0)
    got = ledger.read(path)
    assert len(got) == 5 and {x["pid"] for x in got} >= {os.getpid()}
    path.write_text(path.read_text() + '{"torn')  # a killed writer's last line
    assert len(ledger.read(path)) == 5
    assert json.loads(path.read_text().splitlines()[0])["kind"] == "vllm"


PAYS = """
import subprocess, sys

def test_an_engine_start():  # the start is written by a child process, as the vLLM worker writes it
    code = "from harness.engines.launch import ledger; ledger.record('vllm', 'tiny-llama', 42.0)"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_no_engine():
    assert True
"""


def test_a_unit_test_that_starts_an_engine_fails_and_the_run_counts_it(tmp_path: Path) -> None:
    """The unit tier is enforced: tests/unit/conftest.py fails a test the ledger says started an engine
    (here in a pytest run of its own, with this repository's tests/unit/conftest.py)."""
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    (unit / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (unit / "test_pays.py").write_text(PAYS)
    env = {k: v for k, v in os.environ.items() if k != ledger.ENV and not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parents[2]), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NO_HYPOTHESIS,
                        "tests/unit"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 1 passed" in r.stdout, r.stdout
    assert ("tests/unit/test_pays.py::test_an_engine_start ran an engine (vllm tiny-llama): tests/unit starts "
            "none; move the test to tests/integration/") in r.stdout, r.stdout
    assert "engine starts: 1 (vllm 1), 42 s starting" in r.stdout, r.stdout


def test_the_pool_size_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_ENGINE_POOL_SIZE", "2")
    assert engine_pool.default_max_live() == 2
    assert EnginePool().max_live == 2


@pytest.mark.parametrize(("avail_gib", "workers", "live"), [(20, None, 3), (20, "2", 2), (7, None, 1), (7, "2", 1),
                                                           (12, "2", 1)])
def test_the_pool_size_is_this_workers_share_of_free_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          avail_gib: int, workers: str | None, live: int) -> None:
    monkeypatch.delenv("HARNESS_ENGINE_POOL_SIZE", raising=False)
    if workers is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {32 * 2**20} kB\nMemAvailable: {avail_gib * 2**20} kB\n")
    assert engine_pool.default_max_live(str(meminfo)) == live
