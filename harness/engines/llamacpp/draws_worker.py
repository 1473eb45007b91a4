"""Draw seeded samples with llama-cpp-python's own sampler chain, in the engine's venv.

Standalone on purpose (the standard library, ``llama_cpp`` and numpy): the harness runs it with the
llama.cpp venv's python::

    python draws_worker.py REQUEST.json RESULT.jsonl

REQUEST.json: {"gguf", "n_ctx", "n_threads", "prefix_cache", "passes": [{"name", "requests": [{"key",
"prompt_ids", "path", "via", "sampling": {"temperature", "top_k", "top_p", "min_p", "repetition_penalty",
"presence_penalty", "frequency_penalty", "max_tokens", "seed"}, "n"}]}]}

Draw i of a request has seed ``seed + i`` (``Llama.set_seed``, as ``create_completion(seed=...)``
does) and a sampler chain built by ``Llama._init_sampler`` — the chain ``Llama.generate`` builds per
request: penalties (its ring buffer empty: the prompt is never accepted), top_k, typical, top_p,
min_p, temp, dist — with every parameter passed (the server's defaults, top_k 40, top_p 0.95,
min_p 0.05, repeat_penalty 1.1, never apply). Two ways to run it:

* ``via: "chain"`` (the statistical draws): the prompt and the oracle's ``path`` are evaluated once
  (``logits_all``), and each draw applies the chain to the engine's logits there
  (``llama_sampler_apply``, then ``llama_sampler_accept``: what ``llama_sampler_sample`` does),
  stopping once it leaves the path (nothing after that is judged). A step of generate() that
  evaluates the drawn token and, for the next request, the prompt's last token again, costs a
  second of a contended CPU; this costs a millisecond.
* ``via: "generate"`` (the requests the determinism lanes replay): ``Llama.generate`` itself, the
  loop ``create_completion`` and the server run, with its prefix cache (``"prefix_cache": false``:
  ``Llama.reset`` first, so every prompt is evaluated whole).

Logprobs are ``log_softmax`` of the raw logits each token was drawn from, as create_completion
reports them. RESULT.jsonl (:mod:`harness.engines.launch.worker_lines`, loaded by its path: the harness is
not installed in the engine's venv): {"kind": "meta", "version", "timings"}, one {"kind": "draws",
"pass", "key", "tokens", "logprobs"} per request, then {"kind": "end"}.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
_LINES = os.path.join(os.path.dirname(_HERE), "launch", "worker_lines.py")
_spec = importlib.util.spec_from_file_location("worker_lines", _LINES)
assert _spec is not None and _spec.loader is not None
worker_lines = importlib.util.module_from_spec(_spec)
sys.modules["worker_lines"] = worker_lines  # dataclasses look their module up there
_spec.loader.exec_module(worker_lines)


def _log_softmax_at(row, token: int) -> float:
    import numpy as np

    x = np.asarray(row, np.float64)
    m = float(x.max())
    return float(x[token] - m - np.log(np.exp(x - m).sum()))


def _sampler_kwargs(s: dict) -> dict:
    """The request's sampling settings as llama-cpp-python's sampler arguments (the chain and
    ``generate`` take the same ones); typical-p, tail-free and mirostat off."""
    return {"top_k": int(s["top_k"]), "top_p": float(s["top_p"]), "min_p": float(s["min_p"]),
            "typical_p": 1.0, "temp": float(s["temperature"]),
            "repeat_penalty": float(s["repetition_penalty"]),
            "frequency_penalty": float(s["frequency_penalty"]),
            "presence_penalty": float(s["presence_penalty"]), "tfs_z": 1.0, "mirostat_mode": 0}


def _chain(llm, s: dict, seed: int):
    llm.set_seed(seed)
    return llm._init_sampler(**_sampler_kwargs(s))


def generate(llm, prompt: list[int], s: dict, seed: int, eos: int,
             prefix_cache: bool = True) -> tuple[list[int], list[float]]:
    if not prefix_cache:
        llm.reset()  # nothing held: the whole prompt is evaluated in one batch, as on a cold start
    llm.set_seed(seed)
    steps = int(s["max_tokens"])
    gen = llm.generate(prompt, **_sampler_kwargs(s))
    toks: list[int] = []
    lps: list[float] = []
    try:
        for tok in gen:
            lps.append(_log_softmax_at(llm.scores[len(prompt) - 1 + len(toks)], int(tok)))
            toks.append(int(tok))
            if len(toks) >= steps or tok == eos:
                break
    finally:
        gen.close()
    return toks, lps


def chain_draws(llm, r: dict, eos: int) -> tuple[list[list[int]], list[list[float]]]:
    import ctypes

    import llama_cpp
    from llama_cpp._internals import LlamaTokenDataArray

    prompt, path, s = list(r["prompt_ids"]), list(r.get("path") or []), r["sampling"]
    steps = int(s["max_tokens"])
    llm.reset()
    llm.eval(prompt + path[: steps - 1])
    rows = [llm.scores[len(prompt) - 1 + j].copy() for j in range(min(steps, len(path) + 1))]
    arr = LlamaTokenDataArray(n_vocab=llm.n_vocab())
    toks_all, lps_all = [], []
    for i in range(int(r["n"])):
        smpl = _chain(llm, s, int(s["seed"]) + i)
        toks, lps = [], []
        for j, row in enumerate(rows):
            arr.copy_logits(row)
            llama_cpp.llama_sampler_apply(smpl.sampler, ctypes.byref(arr.candidates))
            tok = int(arr.candidates_data.id[arr.candidates.selected])
            llama_cpp.llama_sampler_accept(smpl.sampler, tok)
            toks.append(tok)
            lps.append(_log_softmax_at(row, tok))
            if tok == eos or j >= len(path) or tok != path[j]:
                break
        smpl.close()
        toks_all.append(toks)
        lps_all.append(lps)
    return toks_all, lps_all


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    t0 = time.perf_counter()
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=req["gguf"],
        n_ctx=int(req.get("n_ctx", 4096)),
        logits_all=True,
        n_threads=int(req.get("n_threads") or os.cpu_count() or 1),
        seed=0,
        verbose=False,
    )
    eos = int(llm.token_eos())
    start = time.perf_counter() - t0

    def draws(r: dict) -> tuple[list[list[int]], list[list[float]]]:
        if r.get("via", "chain") == "chain":
            return chain_draws(llm, r, eos)
        got = [generate(llm, list(r["prompt_ids"]), r["sampling"], int(r["sampling"]["seed"]) + i, eos,
                        bool(req.get("prefix_cache", True)))
               for i in range(int(r["n"]))]
        return [t for t, _ in got], [lp for _, lp in got]

    def run_pass(p: dict) -> tuple[list[dict], float]:
        t1 = time.perf_counter()
        lines = []
        for r in p["requests"]:
            toks, lps = draws(r)
            lines.append({"kind": "draws", "pass": p["name"], "key": r["key"], "tokens": toks,
                          "logprobs": lps})
        return lines, time.perf_counter() - t1

    lines, timings = worker_lines.run_passes(req["passes"], run_pass)
    with open(result_path, "w") as out:
        worker_lines.write_result(out, {"version": llama_cpp.__version__,
                                        "timings": {"engine_start_s": start, **timings}}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
