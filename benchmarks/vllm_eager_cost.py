"""What tapping vLLM costs: the pinned vLLM on a suite as the gates run it (compiled: the CPU
platform's Dynamo-traced, inductor-compiled graph) and in eager mode (``enforce_eager=True``, which a
per-layer capture needs), side by side in one run: engine start, generation, and how far the two
modes' logprobs are apart (rounding only: a compiled graph fuses element-wise work).

    .venv/bin/python benchmarks/vllm_eager_cost.py [--model tiny-llama] [--suite smoke]

Prints one JSON object. Two engine starts (eager first, so that a warm page cache favours the
compiled run, not the eager one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from harness.engines import RunnerContext, make_runner  # noqa: E402
from harness.models import resolve_model  # noqa: E402
from harness.suites import find_suite  # noqa: E402
from harness.workspace import Workspace  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--suite", default="smoke")
    a = ap.parse_args()
    ws = Workspace.default()
    model = resolve_model(a.model, ws)
    suite = find_suite(ws.suites, a.suite)
    cases = suite.build_cases(model.encode, model.limits)
    ws.runs.mkdir(parents=True, exist_ok=True)
    got = {}
    for label, spec in (("eager", "vllm:enforce_eager=true"), ("compiled", "vllm")):
        runner = make_runner(spec, model, RunnerContext(run_dir=ws.runs))
        runner.start()
        outs = runner.run(cases, suite.sampling)
        t = runner.facts().timings
        got[label] = {"engine_start_s": t["engine_start_s"], "generate_s": t["generate_s"],
                      "outputs": {o.case_id: o for o in outs}}
        runner.close()
    e, c = got["eager"], got["compiled"]
    same = sum(e["outputs"][k].token_ids == c["outputs"][k].token_ids for k in e["outputs"])
    deltas = [float(np.max(np.abs(e["outputs"][k].chosen_logprobs - c["outputs"][k].chosen_logprobs)))
              for k in e["outputs"] if e["outputs"][k].token_ids == c["outputs"][k].token_ids]
    print(json.dumps({
        "model": a.model, "suite": a.suite, "cases": len(cases),
        "engine_start_s": {"eager": e["engine_start_s"], "compiled": c["engine_start_s"],
                           "ratio_eager_over_compiled": e["engine_start_s"] / c["engine_start_s"]},
        "generate_s": {"eager": e["generate_s"], "compiled": c["generate_s"],
                       "ratio_eager_over_compiled": e["generate_s"] / c["generate_s"]},
        "same_tokens": f"{same}/{len(cases)}", "max_abs_logprob_delta": max(deltas, default=None),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
