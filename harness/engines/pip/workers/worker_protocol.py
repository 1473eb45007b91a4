"""The side of a PyPI engine's worker that every engine shares: files in, JSON lines out.

Standalone on purpose: it imports only the standard library and numpy, because it runs under the
engine's own venv (``.venvs/<package>-<version>/``), which holds neither the harness nor its
dependencies. An engine's worker (``ct2_worker.py``, ``ortgenai_worker.py`` ...) is a file beside
this one that defines an :class:`Engine` and calls :func:`main`::

    python ct2_worker.py run REQUEST.json RESULT.jsonl
    python ct2_worker.py convert SOURCE_FOLDER DEST_FOLDER OPTIONS_JSON

REQUEST.json: {"model": converted folder, "source": the model's own folder, "options": {...},
"sampling": {...}, "cases": [{"id", "prompt_ids"}], "full": {"dir"} (optional: whole distributions
into ``.npy`` files), "score": {"logprobs": k, "sequences": [{"id", "prompt_ids",
"continuation_ids"}]} (optional: teacher forcing)}.

RESULT.jsonl (:mod:`harness.engines.launch.worker_lines`, loaded by its path: the harness is not installed
in an engine's venv): a ``meta`` line ({"kind": "meta", "engine_version", "timings", "output_tokens",
"notes"}), one ``case`` line per case ({"id", "token_ids", "text", "top_ids", "top_logprobs",
"chosen_logprobs", "finish_reason", "full"}), one ``score`` line per scored sequence, then
{"kind": "end"}. A start failure is one {"kind": "refused"|"error", "reason", "traceback"} line and
exit code 3; a failure on one case is {"kind": "case", "id", "error"}.

``convert`` writes DEST_FOLDER and prints one JSON line of facts (the converter and its settings).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_ENGINES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LINES = os.path.join(_ENGINES, "launch", "worker_lines.py")
_spec = importlib.util.spec_from_file_location("worker_lines", _LINES)
assert _spec is not None and _spec.loader is not None
worker_lines = importlib.util.module_from_spec(_spec)
sys.modules["worker_lines"] = worker_lines  # dataclasses look their module up there
_spec.loader.exec_module(worker_lines)


class Refused(Exception):
    """The engine cannot run this model or configuration; the message says why."""


@dataclass
class Generated:
    """What an engine produced for one case, before it is written as a line."""

    token_ids: list[int]
    text: str = ""
    finish_reason: str = ""
    logits: np.ndarray | None = None
    """[T, V] raw logits (or log-probabilities) of every generated position, when the engine gives
    them: the top-k rows and the whole distributions are computed from these."""
    top: tuple[list[list[int]], list[list[float]], list[float]] | None = None
    """(top ids, top logprobs, chosen logprobs) when the engine gives top-k rows itself."""
    notes: list[str] = field(default_factory=list)
    served_prompt_ids: list[int] | None = None
    """Engines fed text: the ids the engine made of the prompt text (the tokenizer verdict)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Other per-case facts for the case line (e.g. the engine's own prompt token count)."""


class Engine:
    """One engine in its venv. ``convert`` is a static step (its own process); ``start`` loads the
    converted model once; ``generate`` and ``score`` run per case."""

    def __init__(self, req: dict[str, Any]) -> None:
        self.req = req
        self.options: dict[str, Any] = dict(req.get("options", {}))
        self.notes: list[str] = []
        """Findings for the record (a default the worker overrode, a limit it met)."""

    @staticmethod
    def convert(source: str, dest: str, options: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def generate(self, prompt_ids: list[int], max_tokens: int, k: int) -> Generated:
        raise NotImplementedError

    def score(self, prompt_ids: list[int], continuation: list[int]) -> np.ndarray:
        """[len(continuation), V] logits (or log-probabilities) predicting each continuation token."""
        raise Refused("this engine cannot score given sequences")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64, returned as float32 (-inf logits stay -inf)."""
    x = np.asarray(logits, np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    z = x - m
    return (z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))).astype(np.float32)


def top_rows(logprobs: np.ndarray, chosen: Sequence[int], k: int
             ) -> tuple[list[list[int]], list[list[float]], list[float]]:
    """Per row of ``logprobs`` [T, V]: the k best ids (ties: smaller id first), their logprobs, and
    the logprob of ``chosen[t]``."""
    lp = np.asarray(logprobs, np.float32)
    ids_out, lps_out, ch_out = [], [], []
    for t in range(lp.shape[0]):
        row = lp[t]
        k_eff = min(k, row.shape[0])
        part = np.argpartition(-row, k_eff - 1)[:k_eff] if k_eff < row.shape[0] else np.arange(row.shape[0])
        order = sorted(part.tolist(), key=lambda i: (-float(row[i]), i))
        ids_out.append([int(i) for i in order])
        lps_out.append([float(row[i]) for i in order])
        ch_out.append(float(row[chosen[t]]) if t < len(chosen) else float("nan"))
    return ids_out, lps_out, ch_out


class FullFiles:
    """Whole distributions of a run: one float32 ``.npy`` file [rows, V] per case or score."""

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.folder = folder

    def write(self, name: str, logprobs: np.ndarray) -> dict[str, Any]:
        path = os.path.join(self.folder, f"{name}.npy")
        arr = np.ascontiguousarray(logprobs, np.float32)
        tmp = path + ".tmp.npy"
        np.save(tmp, arr)
        os.replace(tmp, path)
        return {"path": path, "rows": int(arr.shape[0]), "vocab": int(arr.shape[1]),
                "capture": "engine-logits"}


def case_fields(g: Generated, k: int, full: FullFiles | None, name: str) -> dict[str, Any]:
    """A :class:`Generated` as the fields of a case line (top-k from the logits where given)."""
    out: dict[str, Any] = {"token_ids": [int(t) for t in g.token_ids], "text": g.text,
                           "finish_reason": g.finish_reason, "top_ids": None, "top_logprobs": None,
                           "chosen_logprobs": None}
    if g.served_prompt_ids is not None:
        out["served_prompt_ids"] = [int(t) for t in g.served_prompt_ids]
    out.update(g.extra)
    if g.logits is not None:
        lp = log_softmax(g.logits)
        if lp.shape[0] != len(g.token_ids):
            raise ValueError(f"{lp.shape[0]} logit rows for {len(g.token_ids)} generated tokens")
        out["top_ids"], out["top_logprobs"], out["chosen_logprobs"] = top_rows(lp, g.token_ids, k)
        if full is not None:
            out["full"] = full.write(name, lp)
    elif g.top is not None:
        out["top_ids"], out["top_logprobs"], out["chosen_logprobs"] = g.top
    return out


def run(engine_cls: type[Engine], request: str, result: str) -> int:
    with open(request) as fh:
        req = json.load(fh)
    req["result"] = result
    sampling = req["sampling"]
    k = max(int(sampling.get("logprobs", 5)), 1)
    full = FullFiles(req["full"]["dir"]) if req.get("full") else None
    with open(result, "w") as out:
        t0 = time.perf_counter()
        try:
            engine = engine_cls(req)
            engine.start()
        except BaseException as e:  # noqa: BLE001 - a start failure becomes a verdict
            if isinstance(e, Refused):
                return worker_lines.write_start_failure(out, "refused", str(e), e)
            return worker_lines.write_start_failure(out, "error", f"{type(e).__name__}: {e}", e)
        timings = {"engine_start_s": time.perf_counter() - t0}
        lines, n_tokens = [], 0
        t0 = time.perf_counter()
        for case in req["cases"]:
            try:
                g = engine.generate(list(case["prompt_ids"]), int(sampling["max_tokens"]), k)
                fields = case_fields(g, k, full, f"case-{case['id']}")
                lines.append({"kind": "case", "id": case["id"], **fields})
                n_tokens += len(g.token_ids)
                engine.notes.extend(n for n in g.notes if n not in engine.notes)
            except Exception as e:  # noqa: BLE001 - one case's failure is that case's error
                lines.append({"kind": "case", "id": case["id"], "token_ids": [],
                              "error": f"{type(e).__name__}: {e}",
                              "traceback": traceback.format_exc()[-3000:]})
        timings["generate_s"] = time.perf_counter() - t0
        score = req.get("score") or {}
        t0 = time.perf_counter()
        ks = max(int(score.get("logprobs", k)), 1)
        for seq in score.get("sequences", []):
            cont = [int(t) for t in seq["continuation_ids"]]
            try:
                lp = log_softmax(engine.score(list(seq["prompt_ids"]), cont))
                if lp.shape[0] != len(cont):
                    raise ValueError(f"{lp.shape[0]} score rows for {len(cont)} continuation tokens")
                ti, tl, ch = top_rows(lp, cont, ks)
                line = {"kind": "score", "id": seq["id"], "token_ids": cont, "top_ids": ti,
                        "top_logprobs": tl, "chosen_logprobs": ch}
                if full is not None:
                    line["full"] = full.write(f"score-{seq['id']}", lp)
            except Exception as e:  # noqa: BLE001
                line = {"kind": "score", "id": seq["id"], "token_ids": cont,
                        "error": f"{type(e).__name__}: {e}"}
            lines.append(line)
        if score.get("sequences"):
            timings["score_s"] = time.perf_counter() - t0
        worker_lines.write_result(out, {"engine_version": engine.version(), "timings": timings,
                                        "output_tokens": n_tokens, "notes": engine.notes}, lines)
    return 0


def main(engine_cls: type[Engine]) -> None:
    args = sys.argv[1:]
    if args[:1] == ["run"] and len(args) == 3:
        sys.exit(run(engine_cls, args[1], args[2]))
    if args[:1] == ["convert"] and len(args) == 4:
        try:
            facts = engine_cls.convert(args[1], args[2], json.loads(args[3]))
        except Refused as e:
            print(json.dumps({"refused": str(e)}))
            sys.exit(3)
        print(json.dumps(facts, sort_keys=True))
        sys.exit(0)
    sys.exit(f"usage: {sys.argv[0]} run REQUEST.json RESULT.jsonl | convert SOURCE DEST OPTIONS_JSON")
