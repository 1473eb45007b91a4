"""One phase of a KV round trip: ONE vLLM engine, in its own process, over a list of passes.

    python -m harness.kinds.kv.phase REQUEST.json RESULT.jsonl

REQUEST.json::

    {"model": ..., "engine": {LLM kwargs, with kv_transfer_config}, "sampling": {...},
     "passes": [{"name": "write", "requests": [{"case", "lane", "prompt_ids", "capture",
                                                "passive", "skip_reading"}]}]}

Each pass is one ``generate`` call with every request batched; requests carry their harness tags
in ``SamplingParams.extra_args["harness_kv"]`` and may skip reading any cache
(``skip_reading_prefix_cache``) to produce a reference generation inside the same engine.

A pass with ``"list_files": {"root", "out"}`` writes, after it, every file under ``root`` to
``out`` (JSON list): which files of a store a pass's requests wrote (:mod:`harness.kinds.kv.faults.run`).

A pass with ``"mode": "alone"`` sends its requests one at a time (the reference a load pass is
judged against). With ``"observe": {"events": "ipc://..."}`` every pass is observed
(:mod:`harness.kinds.kv.observe`: vLLM's counters, peak requests in flight, KV-cache events).

RESULT.jsonl (:mod:`harness.engines.launch.worker_lines`): ``{"kind": "meta", "version", "timings":
{"engine_start_s", "pass_<name>_s", ...}, "compat": {...}, "observed": {pass: {...}}}``
(``compat``: what :mod:`harness.kinds.kv.compat` adapted to the installed vLLM), then one
``{"kind": "case", "pass", "case", "lane", "token_ids", ..., "num_cached_tokens"}`` per request,
then ``{"kind": "end"}``. A start failure writes ``{"kind": "refused"|"error", "reason",
"traceback"}`` and exits 3; a release that lacks a hook the gate needs writes ``{"kind": "skip",
"reason", "compat"}`` (which hook, which release) and exits 3.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from harness.engines.launch.worker_lines import write_start_failure
from harness.engines.vllm.worker import exit_without_teardown, generate, output_fields, serve_passes


@contextmanager
def observing(llm: Any, events: Any, name: str, into: dict[str, dict[str, object]]) -> Iterator[None]:
    """Observe the pass (counters, peaks, KV-cache events: :mod:`harness.kinds.kv.observe`) when the
    request asked for it (``observe``), into ``into[name]``."""
    if events is None:
        yield
        return
    from harness.kinds.kv.observe import PassObserver

    with PassObserver(llm, events) as obs:
        yield
    into[name] = obs.result()


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    with open(result_path, "w") as out:
        from harness.kinds.kv.compat import adapt

        engine, compat = adapt(req.get("engine", {}))
        if compat.missing:
            lacks = f"vLLM {compat.version} lacks {', '.join(compat.missing)}"
            return write_start_failure(out, "skip", lacks, compat=compat.to_json())
        events = None
        if (endpoint := (req.get("observe") or {}).get("events")) is not None:
            from harness.kinds.kv.observe import EventCounts

            events = EventCounts(endpoint)  # subscribed before the engine publishes its first event
        observed: dict[str, dict[str, object]] = {}
        skip_option = "skip_reading_prefix_cache" in compat.sampling_kwargs
        s = req["sampling"]
        k = int(s.get("logprobs", 5))

        def run_pass(llm: Any, sampling_params: Any, p: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
            # a release without skip_reading_prefix_cache cannot run a no-cache reference
            # (harness.kinds.kv.compat)
            ran = [r for r in p["requests"] if skip_option or not r.get("skip_reading")]
            params = [sampling_params(
                temperature=0.0, max_tokens=int(s["max_tokens"]), logprobs=k if k else None,
                seed=int(s.get("seed", 0)), extra_args={"harness_kv": {
                    "case": r["case"], "lane": r.get("lane", "clean"),
                    "capture": bool(r.get("capture", True)), "passive": bool(r.get("passive", False))}},
                **({"skip_reading_prefix_cache": bool(r.get("skip_reading"))} if skip_option else {}))
                for r in ran]
            with observing(llm, events, p["name"], observed):
                results, seconds = generate(llm, [{"prompt_token_ids": list(r["prompt_ids"])} for r in ran],
                                            params, alone=p.get("mode") == "alone")
            if (listing := p.get("list_files")) is not None:  # what the pass left in a store folder
                from pathlib import Path

                from harness.kinds.kv.faults.inject import list_files

                Path(listing["out"]).write_text(json.dumps(list_files(Path(listing["root"]))))
            return [{"kind": "case", "pass": p["name"], "case": r["case"], "lane": r.get("lane", "clean"),
                     **output_fields(res, k)} for r, res in zip(ran, results, strict=True)], seconds

        def meta(llm: Any) -> dict[str, Any]:
            if events is not None:
                events.close()
            return {"compat": compat.to_json(), **({"observed": observed} if observed else {})}

        return serve_passes(req, out, run_pass, engine=engine, meta=meta, release=True)


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1], sys.argv[2]))
