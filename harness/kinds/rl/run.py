"""The RL gate's run: the trainer writes every step's weights, the engine goes through the session in
one start, the trainer scores what the engine sampled.

Prompts: case i's first ``shared_tokens`` ids, then ``tail_tokens`` ids drawn for the step (seeded),
so that each step's prompt shares >= 80 % of its tokens with the one served before the update (a
prefix cache that kept its blocks across the update serves them stale). An ``identity`` step reuses
the step before's prompts and seeds exactly: with unchanged weights its rollouts must come out the
same, token for token, and so must every figure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.kinds.rl.settings import RLSettings
from harness.kinds.rl.trainer import Trainer, checkpoint_tensors, hf_score, write_step
from harness.kinds.rl.updates import apply_step

LOW_ID = 4
"""Tail ids are drawn from [LOW_ID, min(vocab, TAIL_HIGH)): past the usual special tokens."""
TAIL_HIGH = 32_000


@dataclass(frozen=True, slots=True)
class Rollout:
    id: str
    prompt_ids: tuple[int, ...]
    seed: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "prompt_ids": list(self.prompt_ids), "seed": self.seed}


@dataclass(frozen=True, slots=True)
class StepPlan:
    index: int
    kind: str
    rollouts: tuple[Rollout, ...]
    reference: int | None = None
    """The step an identity step repeats."""


def plan_rollouts(s: RLSettings, heads: Sequence[Sequence[int]], vocab: int) -> list[StepPlan]:
    """Every step's rollouts (see the module's docstring)."""
    high = max(LOW_ID + 1, min(vocab, TAIL_HIGH))
    out: list[StepPlan] = []
    for k, kind in enumerate(s.steps):
        if kind == "identity":
            prev = out[k - 1]
            out.append(
                StepPlan(
                    k,
                    kind,
                    tuple(
                        Rollout(f"s{k}-{r.id.partition('-')[2]}", r.prompt_ids, r.seed) for r in prev.rollouts
                    ),
                    k - 1,
                )
            )
            continue
        rng = np.random.default_rng([s.seed, k])
        rolls = []
        for i, head in enumerate(heads):
            tail = rng.integers(LOW_ID, high, size=s.tail_tokens).tolist()
            rolls.append(
                Rollout(
                    f"s{k}-c{i}",
                    tuple(int(t) for t in head[: s.shared_tokens]) + tuple(tail),
                    s.seed * 100_000 + k * 100 + i,
                )
            )
        out.append(StepPlan(k, kind, tuple(rolls)))
    return out


@dataclass(slots=True)
class TrainerSide:
    """The trainer's weights through the steps: one checkpoint folder per step."""

    folders: list[Path] = field(default_factory=list)
    moved: list[list[str]] = field(default_factory=list)
    seconds: float = 0.0


MODE = "processed_logprobs"


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    s: RLSettings
    plans: tuple[StepPlan, ...]
    run_dir: Path
    dtype: str
    """The lane: the engine's dtype and the dtype the trainer declares."""
    trainer_dtype: str
    """What the trainer actually scores in (another than ``dtype`` only under the trainer_dtype control)."""
    trainer_name: str
    trainer: Any
    control: str | None
    moe: bool
    tied: bool
    top_k: int = 0
    """Experts per token (a MoE model's ``num_experts_per_tok``)."""
    repack: bool = False
    """The backend redoes the CPU repack vLLM's reload skips (``CANDIDATE=vllm:repack=cpu``)."""
    server: bool = False
    """The pinned server over HTTP (``CANDIDATE=vllm-server``), with the pause phase."""
    venv: Any = None
    """Another vLLM release's venv (``CANDIDATE=vllm@<version>``, a ``VenvInfo``); None: the pin."""


@dataclass(frozen=True, slots=True, eq=False)
class Ran:
    side: TrainerSide | None = None
    session: Any = None
    scores: Mapping[int, Mapping[str, np.ndarray]] = field(default_factory=dict)
    routes: Mapping[str, Any] = field(default_factory=dict)
    pause_scores: Mapping[str, Any] = field(default_factory=dict)
    """Over HTTP: mode -> request id -> {"old", "new"}, the trainer's logprob of every token each
    pause-phase request sampled, under the weights before and after that mode's update."""
    timings: Mapping[str, float] = field(default_factory=dict)
    failure: tuple[str, str, str] | None = None


def write_steps(model_dir: str, s: RLSettings, dtype: str, work: Path) -> TrainerSide:
    """Apply every step's update to float32 masters; write each step's checkpoint folder."""
    t0 = time.perf_counter()
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    masters = checkpoint_tensors(model_dir)
    side = TrainerSide()
    for k, kind in enumerate(s.steps):
        side.moved.append(apply_step(masters, kind, k, s.seed, s.relative, s.easy_relative, tied))
        side.folders.append(write_step(work / f"step-{k}", model_dir, masters, dtype))
    side.seconds = time.perf_counter() - t0
    return side


def engine_steps(
    plans: Sequence[StepPlan], side: TrainerSide, names: Sequence[str], control: str | None, drop: str | None
) -> list[dict[str, Any]]:
    """The worker's steps: step 0 on the checkpoint the engine loaded, then an update per step with
    the step's file (``control`` plants its fault here)."""
    out = []
    for p in plans:
        d: dict[str, Any] = {
            "index": p.index,
            "version": str(p.index),
            "update": None,
            "reset_prefix_cache": not (control == "no_reset" and p.index > 0),
            "rollouts": [r.to_json() for r in p.rollouts],
        }
        if p.index > 0:
            send = [n for n in names if not (control == "drop_tensor" and n == drop)]
            d["update"] = {
                "path": str(side.folders[p.index] / "model.safetensors"),
                "names": send,
                "apply": control != "not_applied",
            }
        out.append(d)
    return out


def score(
    trainer: Trainer,
    side: TrainerSide,
    plans: Sequence[StepPlan],
    cases: Mapping[int, Sequence[Mapping[str, Any]]],
    dtype: str,
    to_logprobs: Any,
) -> dict[int, dict[str, np.ndarray]]:
    """The trainer's logprob of every sampled token, per step and rollout, in the rollout's mode."""
    out: dict[int, dict[str, np.ndarray]] = {}
    for p in plans:
        got = {str(c["id"]): c for c in cases.get(p.index, ())}
        rolls = [r for r in p.rollouts if r.id in got and got[r.id]["token_ids"]]
        seqs = [(list(r.prompt_ids), list(got[r.id]["token_ids"])) for r in rolls]
        logits = trainer(side.folders[p.index], seqs, dtype) if seqs else []
        out[p.index] = {}
        for r, (_, sampled), lg in zip(rolls, seqs, logits, strict=True):
            lp = to_logprobs(np.asarray(lg, np.float32))
            out[p.index][r.id] = lp[np.arange(len(sampled)), np.asarray(sampled, np.int64)].astype(np.float64)
    return out


def score_pause(
    trainer: Trainer, side: TrainerSide, paused: Sequence[Mapping[str, Any]], dtype: str, to_logprobs: Any
) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """The trainer's logprob of every token of every pause-phase request, under the weights before
    (``old``: the step it came from) and after (``new``) the mode's update."""
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for ev in paused:
        reqs = [r for r in ev["requests"] if r.get("token_ids")]
        seqs = [(list(r["prompt_ids"]), list(r["token_ids"])) for r in reqs]
        got: dict[str, dict[str, np.ndarray]] = {str(r["id"]): {} for r in reqs}
        for side_name, step in (("old", ev["from_step"]), ("new", ev["to_step"])):
            logits = trainer(side.folders[int(step)], seqs, dtype) if seqs else []
            for r, (_, sampled), lg in zip(reqs, seqs, logits, strict=True):
                lp = to_logprobs(np.asarray(lg, np.float32))
                got[str(r["id"])][side_name] = lp[
                    np.arange(len(sampled)), np.asarray(sampled, np.int64)
                ].astype(np.float64)
        out[str(ev["mode"])] = got
    return out


def score_routes(
    side: TrainerSide,
    plans: Sequence[StepPlan],
    cases: Mapping[int, Sequence[Mapping[str, Any]]],
    dtype: str,
    to_logprobs: Any,
    engine_routes: Mapping[int, Mapping[str, Any]],
    step: int,
) -> dict[str, Any]:
    """On one step: the trainer's own routes, and its logprobs with the engine's routes replayed (R3)
    — with the engine's true routes, with another request's, and with all-zero routes (controls)."""
    from harness.kinds.rl.routing import replay_sets

    p = plans[step]
    got = {str(c["id"]): c for c in cases.get(step, ())}
    rolls = [r for r in p.rollouts if r.id in got and got[r.id]["token_ids"]]
    seqs = [(list(r.prompt_ids), list(got[r.id]["token_ids"])) for r in rolls]
    out: dict[str, Any] = {"ids": [r.id for r in rolls]}
    logits, routes = hf_score(side.folders[step], seqs, dtype)
    out["own_routes"] = routes
    out["own"] = _chosen(logits, seqs, to_logprobs)
    for name, replay in replay_sets(rolls, seqs, engine_routes.get(step, {})).items():
        lg, _ = hf_score(side.folders[step], seqs, dtype, replay)
        out[name] = _chosen(lg, seqs, to_logprobs)
    return out


def _chosen(
    logits: Sequence[np.ndarray], seqs: Sequence[tuple[list[int], list[int]]], to_logprobs: Any
) -> list[np.ndarray]:
    res = []
    for lg, (_, sampled) in zip(logits, seqs, strict=True):
        lp = to_logprobs(np.asarray(lg, np.float32))
        res.append(lp[np.arange(len(sampled)), np.asarray(sampled, np.int64)].astype(np.float64))
    return res
