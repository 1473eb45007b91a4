"""A complete `cmd:` engine: transformers, greedy. Reads the workload (JSONL) on stdin, writes one
JSON line per case on stdout.   make gate CANDIDATE='cmd:.venv/bin/python examples/cmd_engine.py {model}'
It also answers the optional tensors request (harness/engines/cmd/runner.py), with the harness's own taps
on transformers' modules: another engine would hook its own layers and name them alike."""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
t0 = time.perf_counter()
taps = None
for line in sys.stdin:
    case = json.loads(line)
    if "tensors" in case:  # every position of a whole sequence, per layer and sub-block
        from harness.engines.launch.layer_taps import LayerTaps, family_of

        taps = taps or LayerTaps(model, family_of(model.config.model_type))
        taps.arm()
        with torch.inference_mode():
            logits = model(torch.tensor([case["tensors"]["ids"]])).logits[0].float()
        rows = {k: v.tolist() for k, v in taps.take().items()}
        print(json.dumps({"id": case["id"], "tensors": {**rows, "logits": logits.tolist()}}), flush=True)
        continue
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
