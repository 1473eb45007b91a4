"""Does llama.cpp's prefix cache move a seeded draw? The same seeded request through
``Llama.generate``, on the F32 GGUF of the oracle's weights, in three ways:

* ``cold/cold``: the cache emptied (``Llama.reset``) before each of two draws;
* ``cold/warm``: cold, then after another request that shares all but the prompt's last ``--cut``
  tokens (a prefix hit: only those are evaluated, in a batch of their own);
* ``warm/warm``: after two different requests (another case, then the shared prefix).

    .venv/bin/python benchmarks/llamacpp_seed_cache.py [--model smollm2-135m] [--seeds 100] [--threads N]

Prompts: each case of ``--suite`` followed by llama.cpp's own greedy continuation of ``--extend``
tokens (what the sampling gate's prefixes look like). Settings: ``rep13`` (repetition penalty 1.3,
two tokens, the finding's) and ``t07`` (temperature 0.7, one token: no penalty involved). Prints one
JSON object: per setting, how many seeds gave different tokens each way, and the largest difference
of the prompt's last logits between a cold and a warm evaluation. The draws run in the llama.cpp
venv (``--child``: standard library, numpy and ``llama_cpp`` only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "rep13": {"temp": 1.0, "repeat_penalty": 1.3, "max_tokens": 2},
    "t07": {"temp": 0.7, "repeat_penalty": 1.0, "max_tokens": 1},
}


def child(request: dict) -> dict:
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=request["gguf"], n_ctx=2048, logits_all=True,
                          n_threads=request["threads"], seed=0, verbose=False)
    prompts = []
    for ids in request["prompts"]:
        llm.reset()
        out = list(ids)
        for tok in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            out.append(int(tok))
            if len(out) >= len(ids) + max(request["extend"]):
                break
        prompts += [out[: len(ids) + k] for k in request["extend"]]

    def draw(p: list[int], seed: int, s: dict, cold: bool, before: list[int] | None = None):
        kw = dict(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temp=s["temp"],
                  repeat_penalty=s["repeat_penalty"], frequency_penalty=0.0, presence_penalty=0.0,
                  tfs_z=1.0, mirostat_mode=0)
        if before is not None:  # another request leaves its tokens in the cache
            llm.set_seed(seed + 1)
            g = llm.generate(before, **kw)
            next(g)
            g.close()
        if cold:
            llm.reset()
        llm.set_seed(seed)
        g = llm.generate(p, **kw)
        toks: list[int] = []
        for tok in g:
            toks.append(int(tok))
            if len(toks) >= s["max_tokens"]:
                break
        g.close()
        return toks, llm.scores[len(p) - 1].copy()

    out = {}
    cut = request["cut"]
    for name, s in SETTINGS.items():
        counts = {"cold/cold": 0, "cold/warm": 0, "warm/warm": 0}
        shift, seeds, example = 0.0, 0, None
        for i, p in enumerate(prompts):
            other = prompts[(i + 1) % len(prompts)]
            for j in range(request["seeds"]):
                seed = 5_000_000 + j
                c1, row_c = draw(p, seed, s, True)
                c2, _ = draw(p, seed, s, True)
                w1, row_w = draw(p, seed, s, False, p[:-cut])
                w2, _ = draw(p, seed, s, False, other)
                counts["cold/cold"] += c1 != c2
                counts["cold/warm"] += c1 != w1
                counts["warm/warm"] += w1 != w2
                shift = max(shift, float(np.abs(row_c - row_w).max()))
                if c1 != w1 and example is None:
                    example = {"prompt_tokens": len(p), "seed": seed, "cold": c1, "warm": w1}
                seeds += 1
        out[name] = {**counts, "seeds": seeds, "max_logit_shift_cold_vs_warm": shift,
                     "first_difference": example}
    return {"llama_cpp": llama_cpp.__version__, "prompts": len(prompts), "cut": cut, "settings": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--suite", default="sampling_small")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--extend", type=int, nargs="+", default=[19, 30])
    ap.add_argument("--cut", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: every core)")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(Path(a.child).read_text()))))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import os

    from harness.engines.llamacpp.runner import LlamaCppRunner
    from harness.models import resolve_model
    from harness.suites import find_suite
    from harness.workspace import Workspace

    ws = Workspace.default()
    model = resolve_model(a.model, ws)
    cases = find_suite(ws.suites, a.suite).build_cases(model.encode, model.limits)
    ws.runs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ws.runs) as tmp:
        venv, gguf = LlamaCppRunner(model, {}, run_dir=Path(tmp)).prepare()
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps({"gguf": str(gguf.path), "threads": a.threads or os.cpu_count() or 1,
                                   "prompts": [list(c.prompt_ids) for c in cases], "extend": a.extend,
                                   "seeds": a.seeds, "cut": a.cut}))
        t0 = time.perf_counter()
        got = subprocess.run([str(venv.python), __file__, "--child", str(req)], check=True,
                             capture_output=True, text=True)
        result = json.loads(got.stdout.strip().splitlines()[-1])
    print(json.dumps({"model": a.model, "suite": a.suite, "gguf": "f32", **result,
                      "wall_s": round(time.perf_counter() - t0, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
