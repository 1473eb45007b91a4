"""llama.cpp (llama-cpp-python's ``Llama.generate``) as the speculative-decoding gate's engine: the
same REQUEST and RESULT lines as :mod:`harness.engines.vllm.spec_phase` (``greedy``, ``rows``,
``draws`` passes, a ``counters`` line after each), so the spec kind judges it with the same code.

Standalone on purpose (the standard library, ``llama_cpp`` and numpy), run with the llama.cpp venv's
python::

    python spec_worker.py REQUEST.json RESULT.jsonl

REQUEST.json: the spec gate's request with ``gguf`` (the model's weights as a GGUF) beside it.
``speculative`` absent: the reference, plain ``Llama.generate``; ``{"method": "ngram",
"num_speculative_tokens": k, "prompt_lookup_max": n}``: ``Llama(draft_model=
LlamaPromptLookupDecoding(max_ngram_size=n, num_pred_tokens=k))``. llama-cpp-python ships no other
drafter (a draft model is refused, in its words). ``generate`` evaluates the drafted tokens in one
batch and samples each position from the target's own logits with the request's sampler chain,
keeping drafts while the sampled token equals them: so the draws are one sequence at a time
(concurrency 1), the state reset before each (no prefix held over), seed ``seed + i`` per draw.

Counters (vLLM's names, so the record reads them alike): every non-empty proposal the drafter
makes inside the finished sequence is a draft, its tokens are drafted tokens, and the leading ones
the sequence kept are accepted tokens.
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

DRAFTS, DRAFTED, ACCEPTED, EMITTED = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:generation_tokens",
)
PLAIN = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
         "frequency_penalty": 0.0, "presence_penalty": 0.0, "tfs_z": 1.0, "mirostat_mode": 0}
"""Every filter off: the draws must come from the temperature-scaled softmax alone."""


class Proposals:
    """The drafter's proposals as ``(first position, tokens)``, for the counters."""

    def __init__(self, drafter) -> None:  # noqa: ANN001 - a LlamaDraftModel
        self.drafter, self.made = drafter, []

    def __call__(self, input_ids, /, **kwargs):  # noqa: ANN001, ANN204
        out = self.drafter(input_ids, **kwargs)
        if len(out):
            self.made.append((int(len(input_ids)), [int(t) for t in out]))
        return out

    def count(self, seq: list[int]) -> dict[str, float]:
        drafts = drafted = accepted = 0
        for at, toks in self.made:
            if at >= len(seq):
                continue
            drafts += 1
            drafted += len(toks)
            for i, t in enumerate(toks[: len(seq) - at]):
                if seq[at + i] != t:
                    break
                accepted += 1
        self.made = []
        return {DRAFTS: drafts, DRAFTED: drafted, ACCEPTED: accepted}


def log_softmax(rows):  # noqa: ANN001, ANN201
    import numpy as np

    x = np.asarray(rows, np.float64)
    m = x.max(-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))).astype(np.float32)


def main(request_path: str, result_path: str) -> int:
    import numpy as np

    with open(request_path) as f:
        req = json.load(f)
    spec = req.get("speculative")
    t0 = time.perf_counter()
    with open(result_path, "w") as out:
        try:
            import llama_cpp
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            proposals = None
            if spec and spec.get("method") == "ngram":
                proposals = Proposals(LlamaPromptLookupDecoding(
                    max_ngram_size=int(spec.get("prompt_lookup_max", 2)),
                    num_pred_tokens=int(spec["num_speculative_tokens"])))
            elif spec:
                raise ValueError(
                    f"llama-cpp-python {llama_cpp.__version__} has no speculative method "
                    f"{spec.get('method')!r}: its one drafter is LlamaPromptLookupDecoding (n-gram)")
            llm = llama_cpp.Llama(model_path=req["gguf"], n_ctx=int(req.get("n_ctx", 1024)), logits_all=True,
                                  n_threads=int(req.get("n_threads") or os.cpu_count() or 1), seed=0,
                                  draft_model=proposals, verbose=False)
        except Exception as e:  # noqa: BLE001 - a start failure becomes a verdict
            worker_lines.write_start_failure(
                out, "refused" if isinstance(e, ValueError) else "error", f"{type(e).__name__}: {e}", e)
            return 3
        start_s = time.perf_counter() - t0

        def generate(ids: list[int], n: int, temp: float, seed: int) -> list[int]:
            llm.reset()
            llm.set_seed(seed)
            toks: list[int] = []
            gen = llm.generate(ids, temp=temp, reset=True, **PLAIN)
            try:
                for tok in gen:
                    toks.append(int(tok))
                    if len(toks) >= n:
                        break
            finally:
                gen.close()
            return toks

        def run_pass(p: dict) -> tuple[list[dict], float]:
            t = time.perf_counter()
            counts = {DRAFTS: 0.0, DRAFTED: 0.0, ACCEPTED: 0.0, EMITTED: 0.0}

            def counted(ids: list[int], toks: list[int]) -> None:
                counts[EMITTED] += len(toks)
                if proposals is not None:
                    for k, v in proposals.count(ids + toks).items():
                        counts[k] += v

            lines: list[dict] = []
            kind = p.get("kind")
            for i, r in enumerate(p["requests"]):
                ids = list(r["prompt_ids"])
                if kind in ("greedy", "rows"):
                    toks = generate(ids, int(p["max_tokens"]), 0.0, 0)
                    counted(ids, toks)
                    lp = log_softmax(llm.scores[len(ids) - 1: len(ids) - 1 + len(toks)])
                    if kind == "greedy":
                        k = int(p.get("logprobs", 5))
                        top = np.argsort(-lp, -1, kind="stable")[:, :k]
                        lines.append({"kind": "case", "pass": p["name"], "key": r["key"], "token_ids": toks,
                                      "top_ids": top.tolist(),
                                      "top_logprobs": np.take_along_axis(lp, top, -1).tolist()})
                    else:
                        path = f"{result_path}.rows-{i:04d}.npy"
                        np.save(path, lp)
                        lines.append({"kind": "rows", "pass": p["name"], "key": r["key"], "path": path,
                                      "token_ids": toks})
                else:
                    draws = []
                    for j in range(int(r["n"])):
                        seed = int(r["seed"]) + j
                        toks = generate(ids, int(p["max_tokens"]), float(p["temperature"]), seed)
                        counted(ids, toks)
                        draws.append(toks)
                    lines.append({"kind": "draws", "pass": p["name"], "key": r["key"], "tokens": draws})
            wall = time.perf_counter() - t
            lines.append({"kind": "counters", "pass": p["name"], "wall_s": wall, **counts,
                          **({"concurrency_run": 1} if kind == "draws" else {})})
            return lines, wall

        lines, timings = worker_lines.run_passes(req["passes"], run_pass)
        worker_lines.write_result(out, {"version": llama_cpp.__version__, "engine": "llama.cpp",
                                        "timings": {"engine_start_s": start_s, **timings}}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
