"""The sampling drivers' plumbing (the draws themselves: the records and the integration test)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.api import EngineRefused, Sampler
from harness.engines import RunnerContext
from harness.models import resolve_model
from harness.sampling.engines import SAMPLERS, make_sampler
from harness.sampling.engines.base import PARAMS, samples
from harness.sampling.transforms import CHAINS, PARAMETERS
from harness.workspace import Workspace


def test_every_driver_is_a_sampler_and_names_a_known_chain(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    for spec in ("vllm", "vllm:logprobs_mode=processed_logprobs", "hf", "hf:logprobs=raw", "llamacpp",
                 "openai:http://127.0.0.1:9,chain=llama.cpp"):
        s = make_sampler(spec, model, RunnerContext(run_dir=workspace.runs))
        assert isinstance(s, Sampler), spec
        assert s.traits().chain in CHAINS
    assert make_sampler("vllm:logprobs_mode=processed_logprobs", model).traits().logprobs_mode == "processed_logprobs"
    assert make_sampler("hf:logprobs=raw", model).traits().logprobs_mode == "raw_logprobs"
    assert set(SAMPLERS) == {"vllm", "hf", "llamacpp", "openai"}


def test_an_engine_without_a_driver_is_refused_by_name(workspace: Workspace) -> None:
    model = resolve_model("tiny-llama", workspace)
    with pytest.raises(EngineRefused, match=r"no sampling driver for engine 'vllm@' \(there are: "):
        make_sampler("vllm@0.31.0", model)
    with pytest.raises(EngineRefused, match="chain 'vlm' is not one of"):
        make_sampler("openai:http://127.0.0.1:9,chain=vlm", model)
    with pytest.raises(EngineRefused, match="logprobs must be processed or raw"):
        make_sampler("hf:logprobs=maybe", model)


def test_every_driver_passes_every_parameter() -> None:
    assert set(PARAMS) == set(PARAMETERS)  # no engine default (a server's top_k 40) can sneak in


def test_draws_are_padded_where_they_stopped() -> None:
    s = samples("k", [[5, 6], [7], []], [[-0.1, -0.2], [-0.3], []], 2)
    assert s.tokens.tolist() == [[5, 6], [7, -1], [-1, -1]]
    assert s.logprobs is not None and np.isnan(s.logprobs[1, 1]) and s.logprobs[0, 1] == np.float32(-0.2)
    assert samples("k", [[1]], None, 1).logprobs is None
