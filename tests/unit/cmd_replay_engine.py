"""A `cmd:` engine for the tests: answers each workload line from a JSON file of known outputs,
with one planted fault.   python cmd_replay_engine.py ANSWERS.json FAULT [WORKLOAD.jsonl]

FAULT: ok | not-json (c03's line is garbage) | missing (no line for c05) | short (c02 has one
top_ids row too few) | twice (c04 answered twice) | crash (exits 1 after four cases) | hang (sleeps
after two cases, with a child process of its own) | no-ids (c06 without token_ids) | reported
(c07 says it failed) | no-logprobs (no logprob fields at all)
"""

import json
import subprocess
import sys
import time

answers = json.load(open(sys.argv[1]))
fault = sys.argv[2]
lines = open(sys.argv[3]).read().splitlines() if len(sys.argv) > 3 else sys.stdin.read().splitlines()
print(f"replaying {len(lines)} cases with fault {fault}", file=sys.stderr)
for n, line in enumerate(lines):
    case = json.loads(line)
    out = {"id": case["id"], **answers[case["id"]]}
    if fault == "hang" and n == 2:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child {child.pid}", file=sys.stderr, flush=True)
        time.sleep(600)
    if fault == "crash" and n == 4:
        print("engine crashed: out of cheese", file=sys.stderr)
        sys.exit(1)
    if fault == "not-json" and case["id"] == "c03":
        print("garbage <not json>")
        continue
    if fault == "missing" and case["id"] == "c05":
        continue
    if fault == "short" and case["id"] == "c02":
        out["top_ids"] = out["top_ids"][:-1]
    if fault == "no-ids" and case["id"] == "c06":
        del out["token_ids"]
    if fault == "reported" and case["id"] == "c07":
        out = {"id": case["id"], "error": "CUDA out of memory (planted)"}
    if fault == "no-logprobs":
        for f in ("top_ids", "top_logprobs", "chosen_logprobs"):
            out.pop(f)
    print(json.dumps(out), flush=True)
    if fault == "twice" and case["id"] == "c04":
        print(json.dumps(out), flush=True)
print(json.dumps({"stats": {"generate_s": 0.01}}))
