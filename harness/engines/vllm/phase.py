"""One engine of an invariance run: ONE vLLM engine, in its own process, over a list of passes.

    python -m harness.engines.vllm.phase REQUEST.json RESULT.jsonl

Beside :mod:`harness.engines.vllm.worker` (whose engine start, output fields and exit path it
reuses), because an invariance run asks more of one engine start than a gate does: the same
prompts one at a time and all at once, twice to warm the prefix cache, after a cache reset, with
sampling overrides (seeded rollouts), under KV-connector lanes, then rescored by prefill, with the
engine's own counters (preemptions, speculative drafts) read around each pass.

REQUEST.json::

    {"model": ..., "engine": {LLM kwargs}, "sampling": {"max_tokens", "logprobs", "seed"},
     "passes": [{"name": "alone", "mode": "alone" | "together", "reset_prefix_cache": false,
                 "score_own": false,
                 "requests": [{"key": "c01", "prompt_ids": [...], "skip_reading": true,
                               "sampling": {"temperature": 0.8, "top_p": 0.9, "seed": 1},
                               "harness_kv": {"case": "c01", "lane": "clean", ...}}],
                 "score": [{"key", "prompt_ids", "continuation_ids"}]}]}

``mode`` ``alone`` submits the requests one ``generate`` call at a time, ``together`` in one call.
``score_own`` rescores every generation of the pass by prefill (``prompt_logprobs``); ``score``
scores given sequences. ``sampling`` overrides the greedy defaults of one request.

RESULT.jsonl (:mod:`harness.engines.launch.worker_lines`): ``{"kind": "meta", "version", "timings",
"logprobs_mode", ...}``, then per pass one
``{"kind": "case", "pass", "key", "token_ids", ..., "num_cached_tokens"}`` per request, one
``{"kind": "score", "pass", "key", ...}`` per scored sequence and one ``{"kind": "counters",
"pass", ...}`` (the change of vLLM's counters over the pass), then ``{"kind": "end"}``. A start
failure writes ``{"kind": "refused"|"error", "reason", "traceback"}`` and exits 3.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from harness.engines.vllm.worker import _score, exit_without_teardown, generate, output_fields, serve_passes

COUNTERS = ("vllm:num_preemptions", "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
"""vLLM's counters an invariance variant needs as evidence (its Prometheus names)."""


def read_counters(llm: Any, names: Sequence[str] = COUNTERS) -> dict[str, float] | str:
    """The counters (or gauges) ``names`` now, summed over their labels, or why they cannot be read
    (an engine started with ``disable_log_stats=True`` keeps none)."""
    try:
        metrics = llm.get_metrics()
    except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
        return f"{type(e).__name__}: {e}"
    out = dict.fromkeys(names, 0.0)
    for m in metrics:
        if m.name in out and isinstance(getattr(m, "value", None), int | float):
            out[m.name] += float(m.value)
    return out


def _params(sampling_params: Any, base: dict[str, Any], r: dict[str, Any]) -> Any:
    k = int(base.get("logprobs", 5))
    over = dict(r.get("sampling") or {})
    kw: dict[str, Any] = {
        "temperature": float(over.pop("temperature", 0.0)),
        "max_tokens": int(over.pop("max_tokens", base["max_tokens"])),
        "logprobs": k if k != 0 else None,
        "seed": int(over.pop("seed", base.get("seed", 0))),
        **over,
    }
    if r.get("skip_reading"):
        kw["skip_reading_prefix_cache"] = True
    if r.get("harness_kv") is not None:
        kw["extra_args"] = {"harness_kv": dict(r["harness_kv"])}
    return sampling_params(**kw)


def run_pass(llm: Any, sampling_params: Any, base: dict[str, Any], p: dict[str, Any]
             ) -> tuple[list[dict[str, Any]], float]:
    """One pass: its generations, the prefill scores it asks for, its counters; and its seconds."""
    reqs = p["requests"]
    k = int(base.get("logprobs", 5))
    if p.get("reset_prefix_cache"):
        llm.reset_prefix_cache()
    before = read_counters(llm)
    prompts = [{"prompt_token_ids": list(r["prompt_ids"])} for r in reqs]
    params = [_params(sampling_params, base, r) for r in reqs]
    results, wall = generate(llm, prompts, params, alone=p.get("mode", "together") == "alone")
    after = read_counters(llm)
    lines = [{"kind": "case", "pass": p["name"], "key": r["key"], **output_fields(res, k)}
             for r, res in zip(reqs, results, strict=True)]
    seqs = [{"id": s["key"], "prompt_ids": list(s["prompt_ids"]),
             "continuation_ids": [int(t) for t in s["continuation_ids"]]} for s in p.get("score") or ()]
    if p.get("score_own"):
        seqs += [{"id": r["key"], "prompt_ids": list(r["prompt_ids"]),
                  "continuation_ids": [int(t) for t in res.outputs[0].token_ids]}
                 for r, res in zip(reqs, results, strict=True)]
    scored, _ = _score(llm, sampling_params, {"logprobs": k, "sequences": seqs} if seqs else None,
                       int(base.get("seed", 0)))
    lines += [{**{k: v for k, v in s.items() if k != "id"}, "pass": p["name"], "key": s["id"]}
              for s in scored]
    if isinstance(before, str) or isinstance(after, str):
        counters: dict[str, Any] = {"unreadable": before if isinstance(before, str) else after}
    else:
        counters = {name: after[name] - before[name] for name in COUNTERS}
    lines.append({"kind": "counters", "pass": p["name"], **counters})
    return lines, wall


def _logprobs_mode(llm: Any) -> dict[str, str]:
    config = getattr(llm.llm_engine, "vllm_config", None)
    return {"logprobs_mode": str(getattr(getattr(config, "model_config", None), "logprobs_mode", ""))}


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    with open(result_path, "w") as out:
        return serve_passes(req, out, lambda llm, sp, p: run_pass(llm, sp, req["sampling"], p),
                            meta=_logprobs_mode)


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1], sys.argv[2]))
