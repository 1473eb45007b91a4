"""transformers' assisted generation as the speculative-decoding gate's engine: the same REQUEST and
RESULT lines as :mod:`harness.engines.vllm.spec_phase` (``greedy``, ``rows``, ``draws`` passes, a
``counters`` line after each), so the spec kind judges it with the same code.

    python -m harness.engines.hf.spec_worker REQUEST.json RESULT.jsonl

``speculative`` in the request (absent: the reference, plain ``generate``):
``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n}`` -> transformers'
prompt lookup (``prompt_lookup_num_tokens=k, max_matching_ngram_size=n``);
``{"method": "draft_model", "model": FOLDER, "num_speculative_tokens": k}`` -> ``assistant_model``
(a constant ``num_assistant_tokens`` = k). Assisted generation takes one sequence at a time, so a
``draws`` pass runs at concurrency 1 whatever it asks (its counters line says so).

Counters (vLLM's names, so the record reads them alike): every verification step a candidate
generator's ``update_candidate_strategy`` sees adds one draft, its candidate length as drafted
tokens and its matches as accepted tokens.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from harness.engines.launch import worker_lines

COUNTS = {
    "vllm:spec_decode_num_drafts": 0.0,
    "vllm:spec_decode_num_draft_tokens": 0.0,
    "vllm:spec_decode_num_accepted_tokens": 0.0,
    "vllm:generation_tokens": 0.0,
}


def _count_steps() -> None:
    from transformers.generation import candidate_generator as cg

    for cls in (cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator):
        original = cls.update_candidate_strategy

        def counted(self: Any, input_ids: Any, scores: Any, num_matches: Any, _o: Any = original) -> Any:
            drafted = int(scores.shape[1]) - 1
            if drafted > 0:
                COUNTS["vllm:spec_decode_num_drafts"] += 1
                COUNTS["vllm:spec_decode_num_draft_tokens"] += drafted
                COUNTS["vllm:spec_decode_num_accepted_tokens"] += int(num_matches)
            return _o(self, input_ids, scores, num_matches)

        cls.update_candidate_strategy = counted


def main(request_path: str, result_path: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    with open(request_path) as f:
        req = json.load(f)
    spec = req.get("speculative")
    with open(result_path, "w") as out:
        t0 = time.perf_counter()
        try:
            torch.set_num_threads(1)
            model = AutoModelForCausalLM.from_pretrained(req["model"], dtype=torch.float32).eval()
            model.generation_config.eos_token_id = None  # like vLLM's ignore_eos: no stop, no masked token
            model.generation_config.top_k, model.generation_config.top_p = 0, 1.0  # no default top-k 50
            kw: dict[str, Any] = {}
            if spec and spec.get("method") == "ngram":
                kw = {
                    "prompt_lookup_num_tokens": int(spec["num_speculative_tokens"]),
                    "max_matching_ngram_size": int(spec.get("prompt_lookup_max", 2)),
                }
            elif spec and spec.get("method") == "draft_model":
                draft = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
                draft.generation_config.eos_token_id = None
                draft.generation_config.num_assistant_tokens = int(spec["num_speculative_tokens"])
                draft.generation_config.num_assistant_tokens_schedule = "constant"
                kw = {"assistant_model": draft}
            elif spec:
                raise ValueError(
                    f"transformers has no speculative method {spec.get('method')!r} here "
                    "(ngram: prompt lookup, draft_model: assistant_model)"
                )
            _count_steps()
        except Exception as e:  # noqa: BLE001 - a start failure becomes a verdict
            worker_lines.write_start_failure(
                out, "refused" if isinstance(e, ValueError) else "error", f"{type(e).__name__}: {e}", e
            )
            return 3
        start_s = time.perf_counter() - t0

        def gen(ids: list[int], n: int, **extra: Any) -> Any:
            x = torch.tensor([ids])
            with torch.no_grad():
                return model.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=n,
                    output_logits=True,
                    return_dict_in_generate=True,
                    pad_token_id=0,
                    **extra,
                )

        def run_pass(p: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
            import numpy as np

            before = dict(COUNTS)
            t = time.perf_counter()
            lines: list[dict[str, Any]] = []
            kind = p.get("kind")
            for i, r in enumerate(p["requests"]):
                ids = list(r["prompt_ids"])
                if kind == "greedy":
                    g = gen(ids, int(p["max_tokens"]), do_sample=False, **kw)
                    toks = [int(x) for x in g.sequences[0, len(ids) :]]
                    lp = torch.log_softmax(torch.stack(g.logits, 1)[0].float(), -1)
                    top = lp.topk(int(p.get("logprobs", 5)), -1)
                    lines.append(
                        {
                            "kind": "case",
                            "pass": p["name"],
                            "key": r["key"],
                            "token_ids": toks,
                            "top_ids": top.indices.tolist(),
                            "top_logprobs": top.values.tolist(),
                        }
                    )
                elif kind == "rows":
                    g = gen(ids, int(p["max_tokens"]), do_sample=False)
                    rows = torch.log_softmax(torch.stack(g.logits, 1)[0].float(), -1).numpy()
                    path = f"{result_path}.rows-{i:04d}.npy"
                    np.save(path, rows)
                    lines.append(
                        {
                            "kind": "rows",
                            "pass": p["name"],
                            "key": r["key"],
                            "path": path,
                            "token_ids": [int(x) for x in g.sequences[0, len(ids) :]],
                        }
                    )
                else:
                    draws = []
                    for j in range(int(r["n"])):
                        torch.manual_seed(int(r["seed"]) + j)
                        g = gen(
                            ids,
                            int(p["max_tokens"]),
                            do_sample=True,
                            temperature=float(p["temperature"]),
                            **kw,
                        )
                        draws.append([int(x) for x in g.sequences[0, len(ids) :]])
                    lines.append({"kind": "draws", "pass": p["name"], "key": r["key"], "tokens": draws})
            wall = time.perf_counter() - t
            emitted = sum(
                len(d.get("token_ids") or []) + sum(len(x) for x in d.get("tokens") or []) for d in lines
            )
            COUNTS["vllm:generation_tokens"] += emitted
            counters = {k: COUNTS[k] - before[k] for k in COUNTS}
            lines.append(
                {
                    "kind": "counters",
                    "pass": p["name"],
                    "wall_s": wall,
                    **counters,
                    **({"concurrency_run": 1} if kind == "draws" else {}),
                }
            )
            return lines, wall

        import transformers

        lines, timings = worker_lines.run_passes(req["passes"], run_pass)
        worker_lines.write_result(
            out,
            {
                "version": transformers.__version__,
                "engine": "transformers",
                "timings": {"engine_start_s": start_s, **timings},
            },
            lines,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
