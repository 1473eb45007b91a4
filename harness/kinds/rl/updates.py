"""The trainer's weight updates, and how what it sent is found again in the engine.

A step's update is deterministic (the suite's seed and the step's index): an ``ordinary`` step moves
every tensor by a small relative amount (``w * (1 + relative * N(0, 1))``, elementwise), an
``identity`` step moves nothing, an ``easy`` step moves only the tensors a refit most often misses
(:func:`easy_tensors`). Every update sends every tensor (a full resync, as the IPC and NCCL
backends do), in checkpoint names; vLLM fuses q/k/v, gate/up and a MoE layer's experts itself.

:func:`engine_view` maps checkpoint names to where the engine keeps them (vLLM's parameter and the
slice of it), so the engine's weights (:mod:`harness.engines.vllm.rl_taps`) can be compared with
what was sent, tensor by tensor.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FUSED = (
    (".self_attn.q_proj.", ".self_attn.qkv_proj.", 0),
    (".self_attn.k_proj.", ".self_attn.qkv_proj.", 1),
    (".self_attn.v_proj.", ".self_attn.qkv_proj.", 2),
    (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
    (".mlp.up_proj.", ".mlp.gate_up_proj.", 1),
)
"""(checkpoint part, vLLM's fused parameter, order of the part inside it)."""
EXPERT = re.compile(r"^(?P<pre>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<w>gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True, slots=True)
class Place:
    """Where a checkpoint tensor lies in the engine: ``param`` rows ``[start, stop)`` (of expert
    ``expert`` for a stacked MoE parameter), or the whole parameter (``start`` None)."""

    param: str
    start: int | None = None
    stop: int | None = None
    expert: int | None = None

    def take(self, t: Any) -> Any:
        x = t[self.expert] if self.expert is not None else t
        return x if self.start is None else x[self.start : self.stop]

    def to_json(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "rows": None if self.start is None else [self.start, self.stop],
            "expert": self.expert,
        }


def engine_view(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Place]:
    """Checkpoint name -> its place among vLLM's parameters, for the Llama / Qwen3 / Qwen3-MoE layout
    (``shapes``: every checkpoint tensor's shape; the rows of a fused part follow from them)."""
    out: dict[str, Place] = {}
    for name in shapes:
        m = EXPERT.match(name)
        if m:
            pre, e, w = m["pre"], int(m["e"]), m["w"]
            if w == "down_proj":
                out[name] = Place(f"{pre}.w2_weight", expert=e)
            else:
                rows = shapes[name][0]
                start = 0 if w == "gate_proj" else shapes[f"{pre}.{e}.gate_proj.weight"][0]
                out[name] = Place(f"{pre}.w13_weight", start, start + rows, expert=e)
            continue
        for part, fused, order in FUSED:
            if part in name:
                siblings = [name.replace(part, p) for p, f, _ in FUSED if f == fused]
                start = sum(shapes[s][0] for s in siblings[:order] if s in shapes)
                out[name] = Place(name.replace(part, fused), start, start + shapes[name][0])
                break
        else:
            out[name] = Place(name)
    return out


def easy_tensors(names: Iterable[str], tied: bool) -> list[str]:
    """The tensors an ``easy`` step moves: the LM head (the embedding when the two are tied), the
    final norm, one fused slice of the first layer (its ``k_proj``, the middle of q/k/v; its
    ``up_proj``, the second half of gate/up, on a dense MLP) and, on a MoE model, one expert's
    ``up_proj`` (the second expert of the first MoE layer)."""
    names = list(names)
    want = ["model.embed_tokens.weight" if tied else "lm_head.weight", "model.norm.weight"]
    first = sorted({m.group(1) for n in names if (m := re.match(r"^(.*\.layers\.0)\.", n))})
    for prefix in first:
        want += [f"{prefix}.self_attn.k_proj.weight", f"{prefix}.mlp.up_proj.weight"]
    experts = sorted(n for n in names if (m := EXPERT.match(n)) and m["w"] == "up_proj")
    if experts:
        layer0 = EXPERT.match(experts[0])["pre"]  # type: ignore[index]
        want.append(f"{layer0}.1.up_proj.weight" if f"{layer0}.1.up_proj.weight" in names else experts[0])
    return [n for n in want if n in names]


def step_seed(seed: int, step: int) -> int:
    return seed * 1000 + step


def apply_step(
    params: Mapping[str, Any],
    kind: str,
    step: int,
    seed: int,
    relative: float,
    easy_relative: float,
    tied: bool,
) -> list[str]:
    """Move the trainer's ``params`` (name -> torch parameter, changed in place) by step ``step`` of
    kind ``kind``; the names moved."""
    import torch

    if kind in ("checkpoint", "identity"):
        return []
    names = list(params) if kind == "ordinary" else easy_tensors(params, tied)
    rel = relative if kind == "ordinary" else easy_relative
    g = torch.Generator().manual_seed(step_seed(seed, step))
    with torch.no_grad():
        for n in names:
            p = params[n]
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_((p.float() * (1.0 + rel * noise)).to(p.dtype))
    return names


@dataclass(frozen=True, slots=True)
class Arrival:
    """One checkpoint tensor at one step, as the engine holds it."""

    name: str
    place: Place
    max_abs: float
    """max |engine - sent|."""
    scale: float
    """max |sent|."""
    read: str
    """How the engine's value was read: ``kernel`` (through the packed GEMM) or ``param``."""
    checksum: str
    """vLLM's own checksum of the parameter: ``vacuous`` (SHA-256 of zero bytes), ``agrees`` or ``differs``
    (with the harness's SHA-256 of what was sent, for a parameter that holds exactly one tensor),
    ``fused`` (a parameter holding several: not comparable tensor by tensor)."""
    same_as_before: bool | None = None
    """The engine still holds the previous step's value where the trainer sent a new one."""

    def arrived(self, tol: float) -> bool:
        return self.max_abs <= tol * max(self.scale, 1e-30)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.place.to_json(),
            "max_abs": self.max_abs,
            "scale": self.scale,
            "read": self.read,
            "checksum": self.checksum,
            "same_as_before": self.same_as_before,
        }


def _sha256(t: Any) -> str:
    import hashlib

    import torch

    return hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def _resolve(place: Place, engine_names: set[str]) -> Place:
    """vLLM's name for the place where it differs from the plain layout: a MoE layer's expert stacks
    live under ``mlp.experts.routed_experts.`` in 0.32 (``mlp.experts.`` elsewhere)."""
    if place.param in engine_names or ".experts." not in place.param:
        return place
    head, _, leaf = place.param.rpartition(".")
    found = sorted(n for n in engine_names if n.startswith(head + ".") and n.endswith("." + leaf))
    return Place(found[0], place.start, place.stop, place.expert) if len(found) == 1 else place


def arrivals(
    sent: str | Path,
    previous: str | Path | None,
    tap: str | Path,
    read: Mapping[str, str],
    checksums: Mapping[str, str],
) -> list[Arrival]:
    """Each tensor of the checkpoint file ``sent`` against the engine's weights read by the tap
    (``tap``: vLLM's names, float32; ``read``: how each was read); ``previous``: the file sent one
    step before (to say that the engine still holds it); ``checksums``: vLLM's own, by its name."""
    import torch
    from safetensors import safe_open

    from harness.engines.vllm.rl_taps import EMPTY_SHA256

    vllm_sums = {k.rpartition(":")[2]: v for k, v in checksums.items()}
    with safe_open(str(sent), "pt") as fs, safe_open(str(tap), "pt") as ft:
        shapes = {k: tuple(fs.get_slice(k).get_shape()) for k in fs.keys()}  # noqa: SIM118 - not a dict
        view = engine_view(shapes)
        by_param: dict[str, list[str]] = {}
        for k, p in view.items():
            by_param.setdefault(p.param, []).append(k)
        engine_names = set(ft.keys())  # noqa: SIM118
        prev = safe_open(str(previous), "pt") if previous is not None else None
        out = []
        for name, place in view.items():
            s = fs.get_tensor(name)
            fused_with = len(by_param[place.param])
            place = _resolve(place, engine_names)
            if place.param not in engine_names:
                out.append(Arrival(name, place, float("inf"), float(s.abs().max()), "absent", "absent"))
                continue
            e = place.take(ft.get_tensor(place.param))
            diff = float((e - s.float()).abs().max()) if e.shape == s.shape else float("inf")
            same = None
            if prev is not None and diff > 0:
                p = prev.get_tensor(name).float()
                same = bool(p.shape == e.shape and not torch.equal(p, s.float()) and torch.equal(p, e))
            got = vllm_sums.get(place.param)
            if got == EMPTY_SHA256:
                ck = "vacuous"
            elif fused_with > 1 or got is None:
                ck = "fused" if got is not None else "absent"
            else:
                ck = "agrees" if got == _sha256(s) else "differs"
            out.append(
                Arrival(name, place, diff, float(s.float().abs().max()), read.get(place.param, "?"), ck, same)
            )
    return out
