"""The llamacpp candidate's options and GGUF choice, without building or starting llama.cpp (the
real server runs in tests/integration/test_llamacpp.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness.api import EngineRefused
from harness.engines.llamacpp.runner import LlamaCppRunner, LlamaCppServer
from harness.models import resolve_model
from harness.workspace import Workspace


def runner(ws: Workspace, tmp_path: Path, path: str | None = None, **opts: str) -> LlamaCppRunner:
    model = resolve_model(path or "tiny-llama", ws)
    return LlamaCppRunner(model, opts, run_dir=tmp_path / "runs", repo_root=tmp_path)


def test_greedy_request_fields_by_default_and_a_way_to_leave_them_to_the_server(
        workspace: Workspace, tmp_path: Path) -> None:
    r = runner(workspace, tmp_path)
    assert r.body == {"repeat_penalty": 1.0}
    assert r.flags == {"logits_all": "true", "n_ctx": "4096", "n_threads": str(os.cpu_count() or 1)}
    assert runner(workspace, tmp_path, **{"body.repeat_penalty": ""}).body == {}
    assert runner(workspace, tmp_path, **{"body.top_k": "1"}).body == {"repeat_penalty": 1.0, "top_k": 1}
    assert runner(workspace, tmp_path, n_ctx="8192").flags["n_ctx"] == "8192"


@pytest.mark.parametrize("opts, needle", [({"body.prompt": "x"}, "set by the harness"),
                                          ({"version": "0.3"}, "not a full release number"),
                                          ({"c": "many"}, "whole number")])
def test_bad_options_are_refused(workspace: Workspace, tmp_path: Path, opts: dict[str, str], needle: str) -> None:
    with pytest.raises(EngineRefused, match=needle):
        runner(workspace, tmp_path, **opts)


def test_the_gguf_choice(workspace: Workspace, tmp_path: Path) -> None:
    r = runner(workspace, tmp_path)
    f32 = r._gguf()
    assert f32.kind == "f32" and f32.path.exists() and f32.facts["model_digest"] == r.model.digest
    with pytest.raises(EngineRefused, match="has no GGUF it was built from"):
        runner(workspace, tmp_path, gguf="q4_1")._gguf()
    # a model folder holding the GGUF it came from: gguf=source serves it, gguf=q4_1 checks its type
    folder = tmp_path / "m"
    shutil.copytree(resolve_model("tiny-llama", workspace).path, folder)
    shutil.copy(f32.path, folder / "origin.gguf")
    src = runner(workspace, tmp_path, str(folder), gguf="source")._gguf()
    assert src.kind == "source" and src.path.name == "origin.gguf" and src.facts["tensor_type"] == "f32"
    with pytest.raises(EngineRefused, match="holds f32 tensors"):
        runner(workspace, tmp_path, str(folder), gguf="q4_1")._gguf()
    by_path = runner(workspace, tmp_path, gguf=str(folder / "origin.gguf"))._gguf()
    assert by_path.kind == "path"


def test_the_server_command(tmp_path: Path) -> None:
    s = LlamaCppServer("/py", tmp_path / "m.gguf", "tiny-llama", {"logits_all": "true", "n_ctx": "64"})
    s.port = 1234
    assert s.command() == ["/py", "-m", "llama_cpp.server", "--model", str(tmp_path / "m.gguf"),
                           "--model_alias", "tiny-llama", "--logits_all", "true", "--n_ctx", "64",
                           "--host", "127.0.0.1", "--port", "1234"]
