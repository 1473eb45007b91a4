"""Whole distributions from the real vLLM: the engine-core hook's rows are bit for bit vLLM's own.

One engine start (about a minute on 2 cores), or none when the session's engine pool still has
test_ab's arm A up (the same configuration: fp32, every logprob allowed). tiny-llama's vocabulary is 512 ids, so the same run
can ask vLLM for every logprob as its own dicts (top-512) and compare them with the rows the hook
wrote into the ``.npy`` files, for generated positions and for teacher-forced scores.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.api import Case, Sampling
from harness.compare.kernels.full import dense_from_topk
from harness.engines.vllm.runner import VLLMRunner
from harness.models import resolve_model
from harness.workspace import Workspace

pytestmark = pytest.mark.integration


def test_hook_rows_equal_vllms_own_logprobs(tmp_path) -> None:  # noqa: ANN001
    model = resolve_model("tiny-llama", Workspace.default())
    cases = [Case("a", tuple(model.encode("Once upon a time there was"))),
             Case("b", tuple(model.encode("def add(a, b):\n    return")))]
    runner = VLLMRunner(model, {}, run_dir=tmp_path)
    sampling = Sampling(max_tokens=24, logprobs=512, full_vocab=True)  # every id as a dict, and as rows
    outs, scores = runner.run_and_score(cases, sampling, None, 512)
    assert runner.meta["full_capture"] == "engine-hook" and runner.meta["full_vocab"] == 512
    assert runner.meta["peak_rss_kib"]["total"] > runner.meta["peak_rss_kib"]["worker"] > 0
    for o in [*outs, *scores]:
        assert o.error is None, o.error
        full = o.full_logprobs
        assert isinstance(full, np.memmap) and full.shape == (len(o.token_ids), 512)
        dicts = dense_from_topk(o.top_ids, o.top_logprobs)
        assert dicts is not None and np.array_equal(dicts, np.asarray(full)), o.case_id
        assert np.array_equal(full[np.arange(len(o.token_ids)), list(o.token_ids)], o.chosen_logprobs)
    assert [s.token_ids for s in scores] == [o.token_ids for o in outs]
