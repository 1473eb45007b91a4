"""Whole distributions as arrays (suites with ``logprobs = "full"``), on the engine side.

A hook in vLLM's engine-core process (:class:`FullSink`, installed with ``collective_rpc``) writes
every log-softmax row of a tagged request straight into its ``.npy`` file; :class:`FullFiles`
creates those files in the worker process first. A release whose model runner lacks the hook's
attributes falls back to vLLM's own full logprob dicts (:meth:`FullFiles.fill_from_dicts`).

Standard library only at import (torch and numpy inside): run by
:mod:`harness.engines.vllm.worker` under any vLLM release's interpreter.
"""

from __future__ import annotations

import os
import time
from typing import Any

FULL_TAG = "harness_full"
"""``SamplingParams.extra_args`` key naming a request's ``.npy`` file (and which rows go in it)."""


class FullSink:
    """Engine-core side: writes the log-softmax rows of tagged requests into their ``.npy`` files.

    Wraps two model-runner methods: ``_sample`` (one row per generated token, row order
    ``input_batch.req_ids``, rows of a request still in chunked prefill discarded, as vLLM does) and
    ``_get_prompt_logprobs_dict`` (teacher forcing: the rows of the prompt positions, recomputed
    from the same hidden states for the positions the harness asked for). Rows are computed with
    the sampler's own ``compute_logprobs``, so they equal vLLM's reported logprobs bit for bit.
    """

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.tags: dict[str, Any] = {}
        self.next_row: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.fds: dict[str, int] = {}
        self.seconds = 0.0

    def tag(self, req_id: str) -> dict | None:
        if req_id not in self.tags:
            state = self.runner.requests.get(req_id)
            extra = getattr(getattr(state, "sampling_params", None), "extra_args", None) or {}
            self.tags[req_id] = extra.get(FULL_TAG)
        return self.tags[req_id]

    def _write(self, tag: dict, row: int, values: Any) -> None:
        if not 0 <= row < int(tag["rows"]):
            return
        fd = self.fds.get(tag["path"])
        if fd is None:
            fd = self.fds[tag["path"]] = os.open(tag["path"], os.O_WRONLY)
        data = values.contiguous().numpy().tobytes()
        os.pwrite(fd, data, int(tag["offset"]) + row * len(data))
        self.written[tag["path"]] = self.written.get(tag["path"], 0) + 1

    def sampled(self, logits: Any) -> None:
        import torch

        t0 = time.perf_counter()
        batch = self.runner.input_batch
        n = batch.num_reqs
        discard = self.runner.discard_request_mask.np[:n]
        rows = [i for i, r in enumerate(batch.req_ids[:n])
                if not discard[i] and (self.tag(r) or {}).get("kind") == "gen"]
        if rows:
            picked = logits.index_select(0, torch.tensor(rows, device=logits.device))
            raw = bool(self.tags[batch.req_ids[rows[0]]].get("raw"))
            lp = (picked.float() if raw else self.runner.sampler.compute_logprobs(picked)).cpu()
            for j, i in enumerate(rows):
                req = batch.req_ids[i]
                pos = self.next_row.get(req, 0)
                self.next_row[req] = pos + 1
                self._write(self.tags[req], pos, lp[j])
        self.seconds += time.perf_counter() - t0

    def prompt_plan(self, scheduled: dict) -> list[tuple[dict, int, int, int]]:
        """(tag, first prompt position, offset in the hidden states, count) for this step, taken
        before vLLM's own pass forgets the requests whose prompt is done."""
        plan = []
        for req_id in list(self.runner.num_prompt_logprobs):
            tag, n = self.tag(req_id), scheduled.get(req_id)
            if not tag or tag.get("kind") != "score" or n is None:
                continue
            state = self.runner.requests[req_id]
            start = int(state.num_computed_tokens)
            count = min(int(n), len(state.prompt_token_ids) - start - 1)
            if count <= 0:
                continue
            idx = self.runner.input_batch.req_id_to_index[req_id]
            plan.append((tag, start, int(self.runner.query_start_loc.np[idx].item()), count))
        return plan

    def prompt_rows(self, hidden: Any, plan: list[tuple[dict, int, int, int]]) -> None:
        t0 = time.perf_counter()
        for tag, start, offset, count in plan:
            first, want = int(tag["first"]), int(tag["rows"])
            lo, hi = max(start, first), min(start + count, first + want)
            if lo >= hi:
                continue
            h = hidden[offset + lo - start: offset + hi - start]
            logits = self.runner.model.compute_logits(h)
            lp = (logits.float() if tag.get("raw") else self.runner.sampler.compute_logprobs(logits)).cpu()
            for j in range(hi - lo):
                self._write(tag, lo + j - first, lp[j])
        self.seconds += time.perf_counter() - t0

    def report(self) -> dict[str, Any]:
        """This workload's rows and seconds; then start afresh (a pooled engine runs more)."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        import resource

        out = {"written": dict(self.written), "seconds": self.seconds,
               "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
        self.tags, self.next_row, self.written, self.seconds = {}, {}, {}, 0.0
        return out


def install_full_sink(worker: Any) -> str:
    """Runs in the engine-core process (``collective_rpc``): wrap the model runner's sampling and
    prompt-logprob steps with a :class:`FullSink` (once: a pooled engine keeps it)."""
    runner = worker.model_runner
    if getattr(runner, "harness_full_sink", None) is not None:
        return type(runner).__name__
    for need in ("_sample", "_get_prompt_logprobs_dict", "input_batch", "requests", "sampler",
                 "num_prompt_logprobs", "query_start_loc", "discard_request_mask", "model"):
        if not hasattr(runner, need):
            raise AttributeError(f"{type(runner).__name__} has no {need!r}")
    sink = FullSink(runner)
    sample, prompt = runner._sample, runner._get_prompt_logprobs_dict

    def _sample(logits: Any, spec_decode_metadata: Any) -> Any:
        out = sample(logits, spec_decode_metadata)
        if logits is not None and spec_decode_metadata is None:
            sink.sampled(logits)
        return out

    def _prompt(hidden_states: Any, num_scheduled_tokens: dict) -> Any:
        plan = sink.prompt_plan(num_scheduled_tokens)
        out = prompt(hidden_states, num_scheduled_tokens)
        sink.prompt_rows(hidden_states, plan)
        return out

    runner._sample, runner._get_prompt_logprobs_dict = _sample, _prompt
    runner.harness_full_sink = sink
    return type(runner).__name__


def full_sink_report(worker: Any) -> dict[str, Any]:
    """Runs in the engine-core process: rows written per file, seconds spent, peak RSS."""
    sink = getattr(worker.model_runner, "harness_full_sink", None)
    if sink is None:
        import resource

        return {"written": {}, "seconds": 0.0,
                "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    return sink.report()


class FullFiles:
    """Worker side: the ``.npy`` files of one run, created before the engine writes into them."""

    def __init__(self, folder: str, vocab: int, hooked: bool, raw: bool = False) -> None:
        os.makedirs(folder, exist_ok=True)
        self.folder, self.vocab, self.hooked, self.raw = folder, vocab, hooked, raw
        self.files: dict[str, dict[str, Any]] = {}

    def new(self, name: str, kind: str, rows: int, first: int = 0) -> dict[str, Any]:
        """Create ``<name>.npy`` ([rows, vocab] float32, zero-filled, sparse); returns its tag."""
        import numpy as np

        path = os.path.join(self.folder, f"{name}.npy")
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(max(rows, 1), self.vocab))
        tag = {"path": path, "kind": kind, "rows": rows, "first": first, "offset": int(mm.offset),
               **({"raw": True} if self.raw else {})}
        del mm
        self.files[path] = tag
        return tag

    def fill_from_dicts(self, tag: dict[str, Any], steps: list) -> None:
        """The fallback: rows from vLLM's own full logprob dicts (``logprobs=-1``)."""
        import numpy as np

        mm = np.load(tag["path"], mmap_mode="r+")
        for t, step in enumerate(steps[: int(tag["rows"])]):
            row = np.full(self.vocab, -np.inf, np.float32)
            ids = np.fromiter(step.keys(), np.int64, len(step))
            row[ids] = np.fromiter((v.logprob for v in step.values()), np.float32, len(step))
            mm[t] = row
        mm.flush()
        del mm

    def line(self, tag: dict[str, Any], rows: int) -> dict[str, Any]:
        return {"path": tag["path"], "rows": rows, "vocab": self.vocab,
                "capture": "engine-hook" if self.hooked else "logprob-dicts"}

