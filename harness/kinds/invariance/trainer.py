"""The trainer's logprobs in the rollout engine's logprob mode.

vLLM returns rollout logprobs in one of two modes (``logprobs_mode``, an engine option, read from
vllm/config/model.py and vllm/v1/sample/sampler.py of the pinned release):

* ``raw_logprobs`` (vLLM's default): ``log_softmax`` of the model's logits before any processing —
  not the distribution the token was sampled from when temperature != 1 or top-p < 1;
* ``processed_logprobs``: ``log_softmax`` after temperature (``logits / T``) and the top-k / top-p
  masks (masked tokens are -inf): the sampling distribution itself, what an importance ratio needs.

The trainer side computes the same mode from its own logits, in float32, with the same rule as
vLLM's CPU sampler (``apply_top_k_top_p_pytorch``: sort ascending, drop the tokens whose
cumulative probability stays at or below ``1 - top_p``, always keep the top token). The unit tests
check the rule against vLLM's own function.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def mode_logprobs(logits: np.ndarray, mode: str, temperature: float = 1.0, top_p: float = 1.0,
                  top_k: int = 0) -> np.ndarray:
    """``[T, V]`` logits -> ``[T, V]`` float32 logprobs in vLLM's ``mode``."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(logits, np.float32))
    if mode == "raw_logprobs":
        return x.log_softmax(dim=-1, dtype=torch.float32).numpy()
    if mode != "processed_logprobs":
        raise ValueError(f"logprobs mode {mode!r}: the trainer reproduces raw_logprobs and "
                         f"processed_logprobs")
    x = x / torch.tensor(temperature, dtype=torch.float32)
    x = top_k_top_p(x, top_k, top_p)
    return x.log_softmax(dim=-1, dtype=torch.float32).numpy()


def top_k_top_p(logits, top_k: int, top_p: float):  # noqa: ANN001, ANN201 - torch tensors
    """Mask with -inf what vLLM's sampler masks (top-k, then top-p over what is left)."""
    import torch

    if top_k <= 0 and top_p >= 1.0:
        return logits
    srt, idx = logits.sort(dim=-1, descending=False)
    if top_k > 0:
        kth = srt[:, -min(top_k, srt.shape[1])].unsqueeze(1)
        srt = srt.masked_fill(srt < kth, -float("inf"))
    if top_p < 1.0:
        cum = srt.softmax(dim=-1).cumsum(dim=-1)
        mask = cum <= 1 - torch.tensor(top_p, dtype=torch.float32)
        mask[:, -1] = False
        srt = srt.masked_fill(mask, -float("inf"))
    return torch.empty_like(logits).scatter_(dim=-1, index=idx, src=srt)


def transform(mode: str, temperature: float, top_p: float, top_k: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda logits: mode_logprobs(logits, mode, temperature, top_p, top_k)


def describe(mode: str, temperature: float, top_p: float, top_k: int) -> str:
    if mode == "raw_logprobs":
        return ("raw_logprobs: log_softmax of the unprocessed logits (before temperature "
                f"{temperature:g} and top-p {top_p:g}); the trainer computes the same")
    knobs = f"temperature {temperature:g}, top-p {top_p:g}" + (f", top-k {top_k}" if top_k else "")
    return (f"processed_logprobs: log_softmax after {knobs} (the sampling distribution); the trainer "
            f"applies the same temperature and masks to its own logits")
