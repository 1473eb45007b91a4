"""A complete `cmd:` engine: transformers, greedy. Reads the workload (JSONL) on stdin, writes one
JSON line per case on stdout.   make gate CANDIDATE='cmd:.venv/bin/python examples/cmd_engine.py {model}'"""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
t0 = time.perf_counter()
for line in sys.stdin:
    case = json.loads(line)
    ids = torch.tensor([case["prompt_ids"]])
    with torch.inference_mode():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=case["max_tokens"],
                           do_sample=False, output_logits=True, return_dict_in_generate=True)
    gen = g.sequences[0, ids.shape[1]:].tolist()
    lp = torch.log_softmax(torch.stack(g.logits, 1)[0].float(), -1)[: len(gen)]
    top = lp.topk(case["logprobs"], -1)
    print(json.dumps({"id": case["id"], "token_ids": gen, "top_ids": top.indices.tolist(),
                      "top_logprobs": top.values.tolist(),
                      "chosen_logprobs": lp[range(len(gen)), gen].tolist()}), flush=True)
print(json.dumps({"stats": {"generate_s": time.perf_counter() - t0}}))
