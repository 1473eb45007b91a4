"""vllm.cpp's candidate without building vllm.cpp: the build cache on a planted CMake project (real
CMake and Ninja, seconds), and the runner on a planted worker speaking the real worker protocol.
The real build and gate are tests/integration/test_vllmcpp.py (opt-in: HARNESS_VLLMCPP_SRC)."""

from __future__ import annotations

import json
import shutil
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from harness.api import Case, EngineRefused, Sampling
from harness.engines import make_runner
from harness.engines.vllmcpp import build as vb
from harness.engines.vllmcpp import runner as vc
from harness.goldens import golden_dir, read_golden
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.workspace import Workspace

TOOLS = all(shutil.which(t) for t in ("cmake", "ninja", "c++"))
needs_tools = pytest.mark.skipif(not TOOLS, reason="cmake, ninja and a C++ compiler are needed")

# --- the build cache, on a planted project ----------------------------------------------------------

PROJECT = {
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.20)\nproject(fake CXX)\n"
                      "include(cmake/CompilerWarnings.cmake)\n"
                      "add_library(vllm STATIC lib.cpp)\nadd_library(vllm::vllm ALIAS vllm)\n"
                      "target_include_directories(vllm PUBLIC include)\n"
                      "add_subdirectory(examples)\n",
    "cmake/CompilerWarnings.cmake": "function(w t)\n  target_compile_options(${t} PRIVATE\n"
                                    "    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)\nendfunction()\n",
    "include/fake.h": "int fake();\n",
    "lib.cpp": "#include \"fake.h\"\nint fake() { return 3; }\n",
    "examples/CMakeLists.txt": "add_executable(server server/main.cpp)\n"
                               "target_link_libraries(server PRIVATE vllm::vllm)\n",
    "examples/server/main.cpp": "#include \"fake.h\"\nint main() { return fake() - 3; }\n",
}
WORKER = "#include \"fake.h\"\nint main() { return fake() - 3; }\n"


def _project(root: Path, files: dict[str, str] = PROJECT) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    worker = tmp_path / "worker" / "vllmcpp_worker.cpp"
    worker.parent.mkdir()
    worker.write_text(WORKER)
    monkeypatch.setattr(vb, "WORKER_SOURCE", worker)
    monkeypatch.setenv(vb.CACHE_ENV, str(tmp_path / "cache"))
    return _project(tmp_path / "src")


@needs_tools
def test_a_build_is_made_once_keyed_by_source_compiler_and_flags(planted: Path, tmp_path: Path) -> None:
    first = vb.ensure_build(tmp_path, str(planted), jobs=2)
    assert not first.cached and first.server.is_file() and first.worker.is_file()
    facts = first.facts
    assert facts["source_digest"] == vb.tree_digest(planted)[0] and facts["commit"] is None
    assert facts["compiler"] and facts["cmake_args"] == list(vb.CMAKE_ARGS) and facts["build_s"] > 0
    assert any("-Werror dropped" in p for p in facts["patches"])
    assert "-Werror" not in (first.folder / "src" / "cmake" / "CompilerWarnings.cmake").read_text()
    assert "-Werror" in (planted / "cmake" / "CompilerWarnings.cmake").read_text(), "the user's tree is untouched"
    assert not (planted / "build").exists()
    again = vb.ensure_build(tmp_path, str(planted), jobs=2)
    assert again.cached and again.folder == first.folder and again.facts["built"] == facts["built"]


@needs_tools
def test_an_archive_of_the_same_tree_is_the_same_build(planted: Path, tmp_path: Path) -> None:
    first = vb.ensure_build(tmp_path, str(planted), jobs=2)
    archive = tmp_path / "fake-src.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(planted, arcname="fake")
    assert vb.ensure_build(tmp_path, str(archive), jobs=2).folder == first.folder
    (planted / "lib.cpp").write_text(PROJECT["lib.cpp"] + "// changed\n")
    assert vb.ensure_build(tmp_path, str(planted), jobs=2).folder != first.folder, "a changed source rebuilds"


@needs_tools
def test_a_half_made_build_is_rebuilt_and_a_failed_one_names_the_compiler_error(planted: Path,
                                                                                tmp_path: Path) -> None:
    first = vb.ensure_build(tmp_path, str(planted), jobs=2)
    (first.folder / vb.STAMP).unlink()  # as if the build had been killed before its stamp
    rebuilt = vb.ensure_build(tmp_path, str(planted), jobs=2)
    assert not rebuilt.cached and (rebuilt.folder / vb.STAMP).is_file()
    (planted / "examples/server/main.cpp").write_text("int main() { return undeclared_thing; }\n")
    with pytest.raises(vb.BuildError, match="undeclared_thing") as e:
        vb.ensure_build(tmp_path, str(planted), jobs=2)
    assert "build failed" in str(e.value) and ".build.log" in str(e.value)
    broken = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and p != first.folder]
    assert broken and not any((p / vb.STAMP).exists() for p in broken), "no stamp on a failed build"


@needs_tools
def test_a_changed_worker_rebuilds_only_the_worker(planted: Path, tmp_path: Path) -> None:
    first = vb.ensure_build(tmp_path, str(planted), jobs=2)
    server_mtime = first.server.stat().st_mtime_ns
    vb.WORKER_SOURCE.write_text(WORKER + "// another version\n")
    again = vb.ensure_build(tmp_path, str(planted), jobs=2)
    assert again.folder == first.folder and again.facts["worker_digest"] != first.facts["worker_digest"]
    assert "worker_build_s" in again.facts and again.server.stat().st_mtime_ns == server_mtime


def test_no_source_and_a_missing_source_are_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(vb.SRC_ENV, raising=False)
    with pytest.raises(vb.BuildError, match="vllmcpp:src=PATH.*HARNESS_VLLMCPP_SRC"):
        vb.source_path(None)
    with pytest.raises(vb.BuildError, match="does not exist"):
        vb.source_path(str(tmp_path / "nope"))
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(vb.BuildError, match="cannot unpack junk.tar.gz"):
        vb.ensure_build(tmp_path, str(tmp_path / "junk.tar.gz"))


# --- the runner, on a planted worker ----------------------------------------------------------------

DOUBLE = r'''#!{python}
"""A planted vllm.cpp worker: answers each prompt text with the goldens' tokens (as the real worker
would for a correct engine), speaking the worker protocol."""
import json, os, signal, sys
req = json.load(open(sys.argv[1]))
table = json.load(open(os.environ["PLANTED_TABLE"]))
mode = os.environ.get("PLANTED_MODE", "good")
out = open(sys.argv[2], "w")
def line(d):
    out.write(json.dumps(d) + "\n"); out.flush()
if mode == "refuse":
    line({{"kind": "refused", "reason": "hf_config: nested per-layer rope parameters are not implemented"}})
    sys.exit(3)
line({{"kind": "meta", "engine_version": "0.0.1", "timings": {{"load_s": 0.1, "generate_s": 0.2}},
      "output_tokens": 5}})
for i, c in enumerate(req["cases"]):
    if mode == "die" and i == 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    ids, tokens = table[c["prompt_text"]]
    if mode == "bos":
        ids = [1] + ids
    tokens = tokens[: c["max_tokens"]]
    line({{"kind": "case", "id": c["id"], "token_ids": tokens, "text": "", "finish_reason": "length",
          "served_prompt_ids": ids, "logprobs_returned": False}})
line({{"kind": "end"}})
'''


@pytest.fixture
def planted_worker(workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    model = resolve_model("tiny-llama", workspace)
    g = read_golden(golden_dir(workspace.goldens, model, "smoke"), model_name="tiny-llama", suite_name="smoke")
    runner = vc.VllmCppRunner(model, {}, "vllmcpp")
    table = {runner.prompt_text(c): (list(c.prompt_ids), list(g.outputs[c.id].token_ids)) for c in g.cases}
    (tmp_path / "table.json").write_text(json.dumps(table))
    monkeypatch.setenv("PLANTED_TABLE", str(tmp_path / "table.json"))
    folder = tmp_path / "build-cache" / "planted"
    worker = vb.Build(folder, {}, True).worker
    worker.parent.mkdir(parents=True)
    worker.write_text(DOUBLE.format(python=sys.executable))
    worker.chmod(worker.stat().st_mode | stat.S_IEXEC)
    build = vb.Build(folder, {"source_digest": "ab" * 32, "commit": None, "compiler": "planted"}, True)
    monkeypatch.setattr(vc, "ensure_build", lambda *a, **k: build)
    monkeypatch.setenv("HARNESS_MODEL_CACHE", str(tmp_path / "models"))
    return worker


def _gate(ws: Workspace, spec: str = "vllmcpp"):  # noqa: ANN202
    return run_gate_by_name(ws, "tiny-llama", "smoke", spec, auto_record=False).record


def test_a_correct_engine_passes_and_the_record_says_what_it_cannot_return(planted_worker: Path,
                                                                            workspace: Workspace) -> None:
    rec = _gate(workspace)
    assert rec.outcome == "pass", rec.summary
    caps = rec.extra["capabilities"]
    assert caps["prompts"] == "text" and "the engine's RequestOutput" in caps["tokenized_by"]
    assert "no logprobs" in caps["reasons"]["top_logprobs"]
    strict = [v for v in rec.verdicts if v.comparator == "strict"]
    assert len(strict) == 8 and all(v.status == "pass" for v in strict)
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "tokenizer")
    assert rec.candidate.settings["dtype"] == "bfloat16" and rec.candidate.engine == "vllm.cpp"
    assert rec.candidate.environment["converted"]["dtype"] == "bfloat16"


def test_a_tokenizer_that_adds_a_bos_fails_the_tokenizer_gate(planted_worker: Path, workspace: Workspace,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANTED_MODE", "bos")
    rec = _gate(workspace)
    assert rec.outcome == "fail"
    assert all(v.status == "fail" for v in rec.verdicts if v.comparator == "tokenizer")


def test_a_refusal_is_recorded_in_the_engines_own_words(planted_worker: Path, workspace: Workspace,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANTED_MODE", "refuse")
    rec = _gate(workspace)
    assert rec.outcome == "refused" and "nested per-layer rope" in rec.summary


def test_a_worker_killed_mid_run_is_an_error_naming_the_signal(planted_worker: Path, workspace: Workspace,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANTED_MODE", "die")
    rec = _gate(workspace)
    assert rec.outcome == "error" and "SIGSEGV" in rec.summary + json.dumps(rec.extra), rec.summary


def test_options_are_checked_before_anything_is_built(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    with pytest.raises(EngineRefused, match="unknown option.*valid: src"):
        make_runner("vllmcpp:threads=2", model)
    with pytest.raises(EngineRefused, match="dtype='float16'; valid: bfloat16, float32"):
        make_runner("vllmcpp:dtype=float16", model)
    with pytest.raises(EngineRefused, match="the harness writes f32, f16, q8_0"):
        make_runner("vllmcpp:gguf=q4_k", model)
    with pytest.raises(EngineRefused, match="num_blocks='many' is not an integer"):
        make_runner("vllmcpp:num_blocks=many", model)
    with pytest.raises(EngineRefused, match="prompts='ids'"):
        make_runner("vllmcpp-server:prompts=ids", model)


def test_the_prompt_text_is_the_suites_own_when_it_tokenizes_to_the_ids(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    r = vc.VllmCppRunner(model, {}, "vllmcpp")
    ids = tuple(model.encode("Hello world"))
    assert r.prompt_text(Case("a", ids, "Hello world")) == "Hello world"
    assert r.prompt_text(Case("b", ids, "something else")) == model.decode(ids)


def test_bf16_conversion_keeps_shapes_and_says_so(workspace: Workspace, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    model = resolve_model("tiny-llama", workspace)
    facts = vc.to_bf16(Path(model.path), tmp_path, tmp_path / "log")
    assert facts["dtype"] == "bfloat16" and facts["tensors"] > 0
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (tmp_path / "tokenizer.json").read_bytes() == (Path(model.path) / "tokenizer.json").read_bytes()
    import torch
    from safetensors.torch import load_file as load_torch

    got = load_torch(str(next(tmp_path.glob("*.safetensors"))))
    src = load_file(str(next(Path(model.path).glob("*.safetensors"))))
    assert all(got[k].dtype == torch.bfloat16 and tuple(got[k].shape) == src[k].shape for k in src)


def test_sampling_is_greedy_in_the_request(planted_worker: Path, workspace: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", workspace)
    r = vc.VllmCppRunner(model, {"max_num_seqs": "4"}, "vllmcpp", run_dir=tmp_path)
    r.start()
    case = Case("c01", tuple(model.encode("Hello")), "Hello")
    out = r.run([case], Sampling(max_tokens=3))
    assert out[0].error is None and len(out[0].token_ids) == 3
    req = json.loads(next(tmp_path.glob("vllmcpp-*/request.json")).read_text())
    assert req["sampling"]["temperature"] == 0.0 and req["engine"]["max_num_seqs"] == 4
    assert req["cases"] == [{"id": "c01", "prompt_text": "Hello", "max_tokens": 3}]


def test_strict_stands_in_for_near_tie_on_text_but_never_for_kl(workspace: Workspace) -> None:
    """A text-only server cannot be judged by near-tie (it needs ids): strict on text gates instead.
    An engine without logprobs cannot be judged by KL or drift, and strict is no stand-in for a
    distribution: those gates stay, judge nothing, and the run is a skip (not a strict FAIL)."""
    from harness.capabilities import Capabilities
    from harness.kinds.parity.kind import suite_gates
    from harness.suites import find_suite

    text_only = Capabilities(token_ids=False, top_logprobs=False)
    no_logprobs = Capabilities(top_logprobs=False, reasons={"top_logprobs": vc.NO_LOGPROBS})
    extra: dict[str, object] = {}
    assert suite_gates(find_suite(workspace.suites, "smoke"), text_only, extra) == ("strict",)
    assert "near_tie is impossible" in str(extra["gates_instead"])
    extra = {}
    long = find_suite(workspace.suites, "long_horizon")
    assert suite_gates(long, no_logprobs, extra) == tuple(s.name for s in long.comparators if s.gate)
    assert "gates_instead" not in extra
    assert suite_gates(find_suite(workspace.suites, "smoke"), no_logprobs, {}) == ("near_tie",)
