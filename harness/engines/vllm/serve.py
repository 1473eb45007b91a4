"""A pooled vLLM engine: started once, then one workload after another (:mod:`harness.engines.vllm.pool`).

    python serve.py ACK_FD      # stdin: one "REQUEST.json<TAB>RESULT.jsonl" line per workload

Standalone like ``worker.py`` (the standard library and vLLM only: it runs under any release's
interpreter), whose code it runs: the first request's ``model`` and ``engine`` start the engine
(:func:`start_llm`), every request then runs as :func:`run_workload` would in a one-shot worker,
its result file complete with its ``end`` line; ``done`` on the file descriptor ``ACK_FD`` says so.
Before every workload but the first the prefix cache is reset, so that a workload finds the engine
as a fresh one leaves it. A start vLLM refuses (or that fails) is written as the one-shot worker
writes it, acknowledged, and the process exits; so does a workload that raises (the pool then
drops the engine). End of stdin: exit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
# its siblings (server.py, runner.py …) could shadow real packages; the worker puts the folder last
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

_spec = importlib.util.spec_from_file_location("harness_vllm_worker", os.path.join(_HERE, "worker.py"))
assert _spec is not None and _spec.loader is not None
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def serve(ack_fd: int) -> int:
    # the full-row hook reaches the engine-core process as a pickled function (collective_rpc);
    # whether a later workload wants it is not known at start
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    ack = os.fdopen(ack_fd, "w")
    llm, start_s, uses = None, 0.0, 0
    for line in sys.stdin:
        if not line.strip():
            continue
        request_path, result_path = line.rstrip("\n").split("\t")
        with open(request_path) as f:
            req = json.load(f)
        with open(result_path, "w") as out:
            if llm is None:
                t0 = time.perf_counter()
                llm = worker.start_llm(req, out)
                start_s = time.perf_counter() - t0
                if llm is None:  # refused or failed: said in the result file; nothing to serve
                    out.close()
                    ack.write("done\n")
                    ack.flush()
                    return 3
            else:
                llm.reset_prefix_cache()
            uses += 1
            print(f"[engine pool] workload {uses}: {request_path}", flush=True)
            worker.run_workload(llm, req, out, start_s if uses == 1 else 0.0,
                                engine={"pooled": True, "uses": uses, "start_s": start_s})
        ack.write("done\n")
        ack.flush()
    return 0


if __name__ == "__main__":
    worker.exit_without_teardown(serve(int(sys.argv[1])))
