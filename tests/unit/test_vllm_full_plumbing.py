"""The vLLM side of whole distributions, without an engine: the worker's files (and its fallback from
vLLM's own dicts), reading them back as memory maps, the KV cache sized by the model, peak RSS."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.engines.launch.worker_run import full_rows
from harness.engines.vllm.runner import default_engine_settings, kv_bytes_per_token
from harness.engines.vllm.worker import FullFiles, peak_rss_kib
from harness.models import resolve_model
from harness.workspace import Workspace


def test_fallback_rows_from_vllms_dicts_read_back_as_a_memory_map(tmp_path: Path) -> None:
    files = FullFiles(str(tmp_path), vocab=6, hooked=False)
    tag = files.new("gen-0000", "gen", rows=4)
    steps = [{t: SimpleNamespace(logprob=-float(t + r)) for t in range(6)} for r in range(3)]  # 3 of 4 rows
    files.fill_from_dicts(tag, steps)
    line = {"full": {**files.line(tag, 3), "written": None}}
    assert line["full"]["capture"] == "logprob-dicts"
    mm, why = full_rows(line)
    assert why is None and isinstance(mm, np.memmap) and mm.shape == (3, 6)
    assert np.array_equal(mm, -(np.arange(6)[None, :] + np.arange(3)[:, None]).astype(np.float32))


def test_rows_the_engine_did_not_write_are_an_error_naming_the_file(tmp_path: Path) -> None:
    files = FullFiles(str(tmp_path), vocab=8, hooked=True)
    tag = files.new("score-0001", "score", rows=5, first=11)
    assert tag["first"] == 11 and tag["offset"] > 0 and os.path.getsize(tag["path"]) == tag["offset"] + 5 * 8 * 4
    _, why = full_rows({"full": {**files.line(tag, 5), "written": 4}})
    assert why is not None and "wrote 4 rows of 5" in why and "score-0001.npy" in why
    _, why = full_rows({"full": {**files.line(tag, 5), "vocab": 9, "written": 5}})
    assert why is not None and "expected float32 [5, 9]" in why
    _, why = full_rows({"full": {"path": str(tmp_path / "gone.npy"), "rows": 1, "vocab": 8}})
    assert why is not None and "gone.npy" in why


def test_the_kv_cache_is_sized_by_the_model_not_the_host() -> None:
    cfg = {"num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "num_hidden_layers": 30,
           "hidden_size": 576}
    assert kv_bytes_per_token(cfg) == 2 * 30 * 3 * 64 * 4  # smollm2-135m: 46 KB a token at float32
    assert kv_bytes_per_token({"num_attention_heads": 2, "hidden_size": 128, "num_hidden_layers": 2}) == 2 * 2 * 2 * 64 * 4
    assert kv_bytes_per_token({"hidden_size": 128}) is None
    model = resolve_model("tiny-llama", Workspace.default())
    s = default_engine_settings(model)
    config = json.loads((Path(model.path) / "config.json").read_text())
    assert s["kv_cache_memory_bytes"] == kv_bytes_per_token(config) * s["max_model_len"] * 4


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_peak_rss_names_this_process_and_its_children() -> None:
    r = peak_rss_kib()
    assert r["worker"] > 0 and r["total"] >= r["worker"] and isinstance(r["children"], dict)
