"""The host's side of a worker run that every worker-driven engine shares: write the request, run
the worker under the one launcher, read its result (:mod:`harness.engines.launch.worker_lines`),
and turn its lines into :class:`~harness.api.Output`\\ s.

:func:`run_worker` is the whole round trip: a worker that leaves no whole result becomes the
engine's own error (:class:`~harness.api.EngineRefused` for a refusal), with this machine's folders
named by what they are (``places``, see :func:`~harness.engines.launch.converted.without_paths`).
The decoders read the fields every worker writes for a case (:func:`output_from_fields`), a scored
sequence (:func:`score_from_line`) and the whole distributions written beside the result
(:func:`full_rows`): the vLLM worker, the KV round trip's phases, the invariance groups, the PyPI
engines' workers and vllm.cpp's worker write the same fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import Case, Output
from harness.engines.launch.converted import without_paths
from harness.engines.launch.procs import run_engine
from harness.engines.launch.worker_lines import Finished, WorkerFailed, check_result
from harness.excerpt import file_tail
from harness.teacher import scored_output


def run_worker(argv: Sequence[str], request: Mapping[str, Any], work: Path, *, timeout_s: float,
               env: Mapping[str, str], label: str, who: str, doing: str, name: str,
               places: Mapping[str, str]) -> Finished:
    """Write ``request`` to ``work/request.json``, run ``argv + [request, result]`` (stdout and stderr
    into ``work/engine.log``) and return the worker's whole result. ``who`` names the worker in a
    broken protocol's message, ``doing`` what it was doing when killed; a failure is raised as the
    engine's error prefixed with ``name``, with ``places`` replaced in every text it carries."""
    req, res, log = work / "request.json", work / "result.jsonl", work / "engine.log"
    req.write_text(json.dumps(request))
    exited = run_engine([*argv, str(req), str(res)], log, timeout_s, env, label=label)
    try:
        return check_result(res, who, exited, doing=doing)
    except WorkerFailed as e:
        e.reason, e.detail = without_paths(e.reason, places), without_paths(e.detail, places)
        raise e.engine_error(without_paths(file_tail(log), places), prefix=f"{name}: ") from None


def case_lines(cases: Sequence[Case], lines: Sequence[Mapping[str, Any]], title: str,
               served: dict[str, tuple[int, ...]]) -> Iterator[tuple[Case, Mapping[str, Any], Output | None]]:
    """Each case with its ``case`` line (empty: the worker wrote none) and, where the worker did not
    answer it, the error Output (``title: why``). The prompt ids an engine made of a text prompt
    (``served_prompt_ids``) go into ``served``."""
    got = {d["id"]: d for d in lines if d.get("kind") == "case"}
    for c in cases:
        d = got.get(c.id)
        if d is not None and d.get("served_prompt_ids") is not None:
            served[c.id] = tuple(int(t) for t in d["served_prompt_ids"])
        failed = None
        if d is None or d.get("error"):
            failed = Output(c.id, (), error=f"{title}: {(d or {}).get('error') or 'no result for this case'}")
        yield c, d or {}, failed


def output_from_fields(case_id: str, d: Mapping[str, Any], *, error: str | None = None,
                       full: Any = None) -> Output:
    """A worker's result fields (:func:`harness.engines.vllm.worker.output_fields`: generated ids,
    text, per-position top-k) as an :class:`Output`, for every worker the harness starts."""
    n = len(d["token_ids"])
    arr = d.get("top_ids") is not None
    if error is None and d.get("finish_reason") == "error":
        error = "the engine finished the request with an error"
    return Output(case_id, tuple(int(t) for t in d["token_ids"]), d.get("text", ""),
                  np.asarray(d["top_ids"], np.int32).reshape(n, -1) if arr else None,
                  np.asarray(d["top_logprobs"], np.float32).reshape(n, -1) if arr else None,
                  np.asarray(d["chosen_logprobs"], np.float32) if arr else None,
                  str(d.get("finish_reason", "")), error=error, full_logprobs=full)


def score_from_line(d: Mapping[str, Any], error_prefix: str = "") -> Output:
    """A worker's ``score`` line as the teacher-forced Output: its error (the worker's own, or its
    whole-distribution rows that could not be read), else the scored continuation."""
    if d.get("error"):
        return Output(d["id"], tuple(d["token_ids"]), error=f"{error_prefix}{d['error']}")
    full, why = full_rows(d)
    if why:
        return Output(d["id"], tuple(d["token_ids"]), error=why)
    return scored_output(d["id"], d["token_ids"], d["top_ids"], d["top_logprobs"], d["chosen_logprobs"], full)


def full_rows(line: Mapping[str, Any]) -> tuple[np.ndarray | None, str | None]:
    """(the read-only memory map of a result line's whole distributions, or why they are unusable)."""
    f = line.get("full")
    if not f:
        return None, None
    rows, path = int(f["rows"]), Path(f["path"])
    if f.get("written") is not None and int(f["written"]) != rows:
        return None, (f"whole distributions: the engine wrote {f['written']} rows of {rows} into "
                      f"{path.name} (the capture hook lost track of the request)")
    try:
        mm = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        return None, f"whole distributions: cannot read {path}: {e}"
    if mm.ndim != 2 or mm.shape[0] < rows or mm.shape[1] != int(f["vocab"]) or mm.dtype != np.float32:
        return None, (f"whole distributions: {path} holds {mm.dtype} {mm.shape}, expected float32 "
                      f"[{rows}, {f['vocab']}]")
    return mm[:rows], None
