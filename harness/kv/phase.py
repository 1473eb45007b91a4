"""One phase of a KV round trip: ONE vLLM engine, in its own process, over a list of passes.

    python -m harness.kv.phase REQUEST.json RESULT.jsonl

REQUEST.json::

    {"model": ..., "engine": {LLM kwargs, with kv_transfer_config}, "sampling": {...},
     "passes": [{"name": "write", "requests": [{"case", "lane", "prompt_ids", "capture",
                                                "passive", "skip_reading"}]}]}

Each pass is one ``generate`` call with every request batched; requests carry their harness tags
in ``SamplingParams.extra_args["harness_kv"]`` and may skip reading any cache
(``skip_reading_prefix_cache``) to produce a reference generation inside the same engine.

RESULT.jsonl: ``{"kind": "meta", "version", "timings": {"engine_start_s", "pass_<name>_s", ...}}``
then one ``{"kind": "case", "pass", "case", "lane", "token_ids", ..., "num_cached_tokens"}`` per
request, then ``{"kind": "end"}``. A start failure writes
``{"kind": "error", "reason", "traceback"}`` and exits 3.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any


def _write(fh: Any, obj: dict[str, Any]) -> None:
    fh.write(json.dumps(obj, sort_keys=True) + "\n")
    fh.flush()


def _rows(step: dict[int, Any], chosen: int, k: int) -> tuple[list[int], list[float], float]:
    items = sorted(((int(t), float(lp.logprob)) for t, lp in step.items()), key=lambda x: (-x[1], x[0]))
    top = items[:k] if k > 0 else items
    chosen_lp = float(step[chosen].logprob) if chosen in step else float("nan")
    return [t for t, _ in top], [v for _, v in top], chosen_lp


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    with open(result_path, "w") as out:
        t0 = time.perf_counter()
        try:
            import vllm
            from vllm import LLM, SamplingParams

            llm = LLM(model=req["model"], **req.get("engine", {}))
        except BaseException as e:  # noqa: BLE001 - any start failure is reported, not raised
            _write(out, {"kind": "error", "reason": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc()[-6000:]})
            return 3
        timings = {"engine_start_s": time.perf_counter() - t0}
        s = req["sampling"]
        k = int(s.get("logprobs", 5))
        rows = []
        for p in req["passes"]:
            params, prompts = [], []
            for r in p["requests"]:
                tags = {"case": r["case"], "lane": r.get("lane", "clean"),
                        "capture": bool(r.get("capture", True)), "passive": bool(r.get("passive", False))}
                params.append(SamplingParams(
                    temperature=0.0, max_tokens=int(s["max_tokens"]), logprobs=k if k else None,
                    seed=int(s.get("seed", 0)), extra_args={"harness_kv": tags},
                    skip_reading_prefix_cache=bool(r.get("skip_reading", False)) or None))
                prompts.append({"prompt_token_ids": list(r["prompt_ids"])})
            t1 = time.perf_counter()
            results = llm.generate(prompts, params, use_tqdm=False)
            timings[f"pass_{p['name']}_s"] = time.perf_counter() - t1
            for r, res in zip(p["requests"], results, strict=True):
                o = res.outputs[0]
                ids = [int(t) for t in o.token_ids]
                top_ids, top_lps, chosen = [], [], []
                for tid, step in zip(ids, o.logprobs or [], strict=False):
                    a, b, c = _rows(step, tid, k)
                    top_ids.append(a)
                    top_lps.append(b)
                    chosen.append(c)
                rows.append({"kind": "case", "pass": p["name"], "case": r["case"],
                             "lane": r.get("lane", "clean"), "token_ids": ids, "text": o.text,
                             "top_ids": top_ids if o.logprobs else None,
                             "top_logprobs": top_lps if o.logprobs else None,
                             "chosen_logprobs": chosen if o.logprobs else None,
                             "finish_reason": o.finish_reason or "",
                             "num_cached_tokens": getattr(res, "num_cached_tokens", None)})
        cache = getattr(getattr(llm.llm_engine, "vllm_config", None), "cache_config", None)
        _write(out, {"kind": "meta", "version": vllm.__version__, "timings": timings,
                     "block_size": getattr(cache, "block_size", None),
                     "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None)})
        for row in rows:
            _write(out, row)
        del llm
        _write(out, {"kind": "end"})  # every result is written: the exit code no longer matters
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: vLLM's has been seen to abort there ("terminate called
    # without an active exception", exit -6) after every result was written. The parent kills
    # this process group (the engine-core processes) whatever happens.
    os._exit(rc)
