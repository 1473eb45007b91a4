"""MoE routing parity: the experts the engine chose (the harness's taps on its routers,
:mod:`harness.engines.vllm.rl_taps`) against the trainer's router top-k on the same ids, and the
trainer's logprobs with the engine's routes replayed (rollout routing replay, R3).

The engine's routes of a rollout come from one prefill of prompt + sampled tokens (all but the last),
rows from ``offset`` on (a prefix its cache served is not computed); the trainer's from its one
forward pass over prompt + sampled tokens. Position p of one is position p of the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _engine_rows(route: Mapping[str, Any], layer: str) -> tuple[int, np.ndarray]:
    rows = np.asarray(route["layers"].get(layer, []), np.int64)
    return int(route.get("offset", 0)), rows.reshape(len(rows), -1) if rows.size else rows.reshape(0, 0)


def agreement(
    engine: Mapping[str, Mapping[str, Any]], trainer: Mapping[str, Mapping[int, np.ndarray]]
) -> dict[str, Any]:
    """Per layer: the share of (rollout, position) whose expert set is the same on both sides; the
    first layer and position where they differ (by layer, then rollout, then position)."""
    per: dict[str, list[int]] = {}
    first: dict[str, Any] | None = None
    for rid, route in engine.items():
        mine = trainer.get(rid)
        if mine is None:
            continue
        for layer in sorted(route["layers"], key=int):
            off, rows = _engine_rows(route, layer)
            t = np.asarray(mine.get(int(layer), np.zeros((0, 0))), np.int64)
            n = min(len(rows), max(0, len(t) - off))
            same = (
                (np.sort(rows[:n], axis=1) == np.sort(t[off : off + n], axis=1)).all(axis=1)
                if n
                else np.zeros(0, bool)
            )
            tally = per.setdefault(layer, [0, 0])
            tally[0] += int(same.sum())
            tally[1] += int(n)
            if n and not same.all():
                pos = int(np.argmin(same))
                cand = {
                    "layer": int(layer),
                    "rollout": rid,
                    "position": off + pos,
                    "engine": rows[pos].tolist(),
                    "trainer": t[off + pos].tolist(),
                }
                if first is None or (cand["layer"], cand["position"]) < (first["layer"], first["position"]):
                    first = cand
    return {
        "per_layer": {
            k: (v[0] / v[1] if v[1] else None) for k, v in sorted(per.items(), key=lambda x: int(x[0]))
        },
        "tokens": {k: v[1] for k, v in per.items()},
        "first_difference": first,
    }


def forced(route: Mapping[str, Any], total: int, k: int) -> dict[int, np.ndarray]:
    """The engine's routes of one rollout as the trainer's replay input: layer -> ``[total, k]``
    expert ids, -1 where the engine computed nothing (the trainer keeps its own there)."""
    out = {}
    for layer in route["layers"]:
        off, rows = _engine_rows(route, layer)
        f = np.full((total, k), -1, np.int64)
        n = min(len(rows), total - off)
        if n > 0:
            f[off : off + n] = rows[:n]
        out[int(layer)] = f
    return out


def replay_sets(
    rolls: Sequence[Any], seqs: Sequence[tuple[list[int], list[int]]], engine: Mapping[str, Mapping[str, Any]]
) -> dict[str, list[dict[int, np.ndarray]]]:
    """``r3``: each rollout's own engine routes; ``r3_other``: the next rollout's routes (a replay
    that took another request's); ``r3_zero``: every token to expert 0 (all-zero routes)."""
    ids = [r.id for r in rolls]
    if not ids or any(i not in engine for i in ids):
        return {}
    k = max((len(r[0]) for route in engine.values() for r in route["layers"].values() if r), default=1)
    totals = [len(p) + len(s) for p, s in seqs]
    own = [forced(engine[i], n, k) for i, n in zip(ids, totals, strict=True)]
    other = []
    for j, n in enumerate(totals):
        src = forced(engine[ids[(j + 1) % len(ids)]], n, k) if len(ids) > 1 else {}
        other.append(
            {
                layer: np.where((own[j][layer] >= 0) & (v >= 0), v, own[j][layer])
                for layer, v in src.items()
                if layer in own[j]
            }
        )
    zero = [{layer: np.where(v >= 0, 0, -1) for layer, v in o.items()} for o in own]
    return {"r3": own, "r3_other": other, "r3_zero": zero}
