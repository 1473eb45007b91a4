"""transformers, one token per step through a chosen KV cache: greedy decoding and teacher forcing.

``hf:kv=quanto-int4`` (or ``quanto-int2``) runs transformers' quantized KV cache (optimum-quanto
backend, per-channel groups, the most recent ``residual_length`` tokens kept in full precision):
a real KV-cache quantisation on CPU. It needs stepping: in a single forward pass over a whole
sequence the attention reads the unquantized keys and values and the quantisation never shows.

The first use of ``quanto-int4`` builds optimum-quanto's C++ extension (about 90 s on 2 cores,
once per environment).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.api import EngineRefused

KV_CHOICES = ("plain", "quanto-int4", "quanto-int2")


def make_cache(kind: str, config: Any, residual_length: int = 128, q_group_size: int = 64) -> Any:
    """A fresh KV cache of ``kind``; an impossible one is an :class:`EngineRefused` with the reason."""
    from transformers import DynamicCache, QuantizedCache

    if kind == "plain":
        return DynamicCache(config=config)
    if kind not in KV_CHOICES:
        raise EngineRefused(f"hf: kv {kind!r} not one of {', '.join(KV_CHOICES)}")
    backend, _, bits = kind.partition("-int")
    try:
        return QuantizedCache(backend, config, nbits=int(bits), residual_length=residual_length,
                              q_group_size=q_group_size)
    except (ImportError, ValueError) as e:
        raise EngineRefused(f"hf: kv {kind!r} unavailable: {e}") from None


def tensor_bytes(t: Any) -> int:
    """Bytes a tensor really holds, looking inside quantized tensor subclasses (data, scales, shifts)."""
    if t is None:
        return 0
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None and type(t).__name__ != "Tensor":
        names, _ = flatten()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return int(t.numel() * t.element_size())


def kv_bytes(cache: Any) -> int:
    """Bytes held by every layer of ``cache`` now: quantized storage plus the full-precision residual."""
    total = 0
    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values", "_quantized_keys", "_quantized_values"):
            total += tensor_bytes(getattr(layer, name, None))
    return total


@dataclass(frozen=True, slots=True, eq=False)
class Decoded:
    tokens: list[int]
    top_ids: np.ndarray
    """[T, k] int32, best first."""
    top_logprobs: np.ndarray
    """[T, k] float32."""
    chosen: np.ndarray
    """[T] float32: logprob of ``tokens[t]``."""
    kv_bytes: int
    """Bytes the cache held after the last step."""
    cached_tokens: int
    full: np.ndarray | None = None
    """[T, V] float32 whole distributions (``full=True``), else None."""


def decode(lm: Any, prompt_ids: Sequence[int], steps: int, k: int, cache: Any,
           forced: Sequence[int] | None = None, eos: Sequence[int] = (), full: bool = False) -> Decoded:
    """Greedy decoding (``forced`` None) or teacher forcing of ``forced``, one token per step.

    Row t is the distribution after prompt + tokens[:t]. ``k`` <= 0 or >= the vocabulary keeps
    every logprob. Greedy decoding stops after an ``eos`` token, as ``generate`` does. ``full``
    also keeps every row whole (``Decoded.full``, one float32 array).
    """
    import torch

    device = next(lm.parameters()).device
    steps = len(forced) if forced is not None else steps
    ids = torch.tensor([list(prompt_ids)], device=device)
    rows_i, rows_l, chosen, tokens, whole = [], [], [], [], []
    with torch.inference_mode():
        out = lm(ids, past_key_values=cache, use_cache=True)
        for t in range(steps):
            lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            if full:
                whole.append(lp)
            kk = lp.shape[-1] if k <= 0 or k >= lp.shape[-1] else k
            top = lp.topk(kk)
            tok = int(forced[t]) if forced is not None else int(top.indices[0])
            rows_i.append(top.indices.cpu().numpy())
            rows_l.append(top.values.cpu().numpy())
            chosen.append(float(lp[tok]))
            tokens.append(tok)
            if t + 1 == steps or (forced is None and tok in eos):
                break
            out = lm(torch.tensor([[tok]], device=device), past_key_values=cache, use_cache=True)
    n = len(tokens)
    return Decoded(tokens, np.asarray(rows_i, np.int32).reshape(n, -1),
                   np.asarray(rows_l, np.float32).reshape(n, -1), np.asarray(chosen, np.float32),
                   kv_bytes(cache), len(prompt_ids) + max(n - 1, 0),
                   torch.stack(whole).cpu().numpy() if whole else None)


def score_forward(lm: Any, prompt_ids: Sequence[int], continuation: Sequence[int], k: int,
                  full: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Teacher forcing in one forward pass (plain cache only): (top_ids, top_logprobs, chosen, the
    whole ``[n, V]`` float32 distributions when ``full``, else None)."""
    import torch

    device = next(lm.parameters()).device
    p, n = len(prompt_ids), len(continuation)
    ids = torch.tensor([list(prompt_ids) + list(continuation)], device=device)
    with torch.inference_mode():
        logits = lm(ids).logits[0, p - 1:p - 1 + n].float()
    lp = torch.log_softmax(logits, dim=-1)
    kk = lp.shape[-1] if k <= 0 or k >= lp.shape[-1] else k
    top = lp.topk(kk, dim=-1)
    chosen = lp.gather(1, torch.tensor(list(continuation), device=device)[:, None])[:, 0]
    return (top.indices.cpu().numpy().astype(np.int32), top.values.cpu().numpy().astype(np.float32),
            chosen.cpu().numpy().astype(np.float32), lp.cpu().numpy() if full else None)


def tensors_forward(lm: Any, ids: Sequence[int], start: int) -> dict[str, np.ndarray]:
    """Logits and every layer's hidden states at positions ``start..`` of one forward pass over ``ids``
    (``[positions, ...]`` float32 each): the tensors NMSE compares across configurations."""
    import torch

    device = next(lm.parameters()).device
    with torch.inference_mode():
        out = lm(torch.tensor([list(ids)], device=device), output_hidden_states=True)
    t = {"logits": out.logits[0, start:].float().cpu().numpy()}
    for i, h in enumerate(out.hidden_states):
        t[f"hidden.{i}"] = h[0, start:].float().cpu().numpy()
    return t


def tensors_stepwise(lm: Any, ids: Sequence[int], start: int, cache: Any) -> dict[str, np.ndarray]:
    """As :func:`tensors_forward`, one token per step through ``cache`` (a quantized KV cache
    changes every layer's output only on this path)."""
    import torch

    device = next(lm.parameters()).device
    rows: dict[str, list[np.ndarray]] = {}
    with torch.inference_mode():
        out = lm(torch.tensor([list(ids[: start + 1])], device=device), past_key_values=cache,
                 use_cache=True, output_hidden_states=True)
        for pos in range(start, len(ids)):
            if pos > start:
                out = lm(torch.tensor([[ids[pos]]], device=device), past_key_values=cache, use_cache=True,
                         output_hidden_states=True)
            rows.setdefault("logits", []).append(out.logits[0, -1].float().cpu().numpy())
            for i, h in enumerate(out.hidden_states):
                rows.setdefault(f"hidden.{i}", []).append(h[0, -1].float().cpu().numpy())
    return {k: np.stack(v) for k, v in rows.items()}
