"""Run one vLLM engine over a whole workload, in its own process.

Standalone on purpose: it imports only the standard library and vLLM, so the same file runs under
the pinned oracle's virtualenv or under any other vLLM release's (``vllm@<version>``). The harness
talks to it through files:

    python vllm_worker.py REQUEST.json RESULT.jsonl

REQUEST.json: {"model", "engine": {LLM kwargs}, "sampling": {...}, "cases": [{"id", "prompt_ids"}]}
and optionally "concurrency": c, to replay the cases with at most c in flight (a closed loop, as c
clients load a server) and report each one's time to first token in the meta line ("ttft_s").
RESULT.jsonl: first line {"kind": "meta", "version", "timings", ...}, then one line per case
{"kind": "case", "id", "token_ids", "text", "top_ids", "top_logprobs", "chosen_logprobs",
"finish_reason"}. An optional "score": {"logprobs": k, "sequences": [{"id", "prompt_ids",
"continuation_ids"}]} in the request adds one {"kind": "score", ...} line per sequence: the
engine's logprobs at every position of the given continuation (teacher forcing); with "own": true
instead of "sequences" it scores its own generations. A last {"kind": "end"} line says every result
was written (the exit code after it does not matter). An engine start failure writes
{"kind": "refused"|"error", "reason", ...} and exits 3.

Whole distributions: with "full": {"dir": FOLDER} in the request, every case and score line also
carries "full": {"path", "rows", "vocab", "capture"}, a ``.npy`` float32 [rows, vocab] file in FOLDER
whose row t is the engine's log-softmax at position t, column = token id, bit for bit what vLLM
computes its own logprobs from ("full": {"dir", "raw": true}: the raw logits instead, before any
log-softmax: what a repetition penalty, whose effect depends on a logit's sign, applies to).
The rows are written by a hook in the engine-core process
(:class:`FullSink`, installed with ``collective_rpc``) straight into the files: no per-position
dict of the vocabulary is ever built. A release whose model runner lacks the hook's attributes falls
back to vLLM's own full logprob dicts ("capture": "logprob-dicts"; slow and memory-hungry on a large
vocabulary, but the same contract). The meta line's "peak_rss_kib" gives the peak resident memory of
this process and of the engine-core process.

One engine per process, every case batched into one ``generate`` call: start-up (~55 s on 2 CPU
cores) dominates, generation of a suite takes well under a second.
"""

from __future__ import annotations

import heapq
import json
import os
import sys
import time
import traceback
from typing import Any

# Run as a script, this file's folder heads sys.path, and its sibling vllm.py would shadow the real
# vLLM package: drop it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

# Start-up failures whose message means "this configuration is not supported here", not a crash.
REFUSAL_MARKERS = (
    "No common block size",
    "requires x86 with AVX-512",
    "is not supported",
    "not supported on",
    "Unsupported",
    "head_dim",
    "head size",
    "does not support",
    "requires",
)


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return "refused" if isinstance(exc, (ValueError, NotImplementedError)) and any(
        m in text for m in REFUSAL_MARKERS) else "error"


def write_line(fh: Any, obj: dict[str, Any]) -> None:
    fh.write(json.dumps(obj, sort_keys=True) + "\n")
    fh.flush()


def _logprob_rows(step: dict, chosen: int, k: int) -> tuple[list[int], list[float], float]:
    """Top-k (ids, logprobs) of one position, best first, and the chosen token's logprob."""
    pairs = ((tid, lp.logprob) for tid, lp in step.items())
    key = lambda x: (-x[1], x[0])  # noqa: E731
    items = heapq.nsmallest(k, pairs, key=key) if 0 < k < len(step) else sorted(pairs, key=key)
    chosen_lp = step[chosen].logprob if chosen in step else float("nan")
    top = items
    return [int(t) for t, _ in top], [float(v) for _, v in top], float(chosen_lp)


def start_llm(req: dict[str, Any], out: Any) -> Any:
    """``vllm.LLM(model, **engine)`` from a request, or None after writing why it did not start
    (a ``refused`` or ``error`` line with the traceback's tail): a start failure becomes a verdict."""
    try:
        from vllm import LLM

        return LLM(model=req["model"], **req.get("engine", {}))
    except BaseException as e:  # noqa: BLE001 - any start failure becomes a verdict
        write_line(out, {"kind": _classify(e), "reason": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc()[-6000:]})
        return None


def output_fields(result: Any, k: int) -> dict[str, Any]:
    """The JSON fields of one vLLM RequestOutput: generated ids, text, per-position top-k."""
    o = result.outputs[0]
    ids = [int(t) for t in o.token_ids]
    top_ids, top_lps, chosen = [], [], []
    for tid, step in zip(ids, o.logprobs or [], strict=False):
        ti, tl, c = _logprob_rows(step, tid, k)
        top_ids.append(ti)
        top_lps.append(tl)
        chosen.append(c)
    return {"token_ids": ids, "text": o.text,
            "top_ids": top_ids if o.logprobs else None,
            "top_logprobs": top_lps if o.logprobs else None,
            "chosen_logprobs": chosen if o.logprobs else None,
            "finish_reason": o.finish_reason or "",
            "num_cached_tokens": getattr(result, "num_cached_tokens", None)}


def _process_tree(root: int) -> list[int]:
    """``root`` and its live descendants (vLLM's engine-core and worker processes), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parent[int(entry)] = int(fh.read().rsplit(")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, todo = [root], [root]
    while todo:
        me = todo.pop()
        kids = [pid for pid, ppid in parent.items() if ppid == me]
        tree += kids
        todo += kids
    return tree


def kernel_facts() -> dict[str, Any]:
    """Which CPU kernels this engine really uses: vLLM's compiled libraries (``_C``,
    ``_C_AVX512``, ``_C_AVX2``: the one ``import_kernels`` chose) mapped into this process or its
    engine-core / worker processes (their /proc/<pid>/maps; Linux only), torch's ATen CPU
    capability, and what ``torch.cpu``'s feature probes answer (vLLM chooses libraries and
    attention/GEMM paths by them)."""
    libs: set[str] = set()
    seen = 0
    try:
        for pid in _process_tree(os.getpid()):
            try:
                with open(f"/proc/{pid}/maps") as fh:
                    names = {line.rsplit("/", 1)[-1].strip() for line in fh if "/vllm/_C" in line}
            except OSError:
                continue
            found = {n.split(".", 1)[0] for n in names if n.endswith(".so")}
            seen += bool(found)
            libs |= found
    except OSError:
        pass
    facts: dict[str, Any] = {"kernel_libraries": sorted(libs), "processes_with_kernels": seen}
    try:
        import torch

        facts["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        facts["cpu_probes"] = {name: bool(getattr(torch.cpu, f"_is_{name}_supported")())
                               for name in ("avx2", "avx512", "avx512_bf16", "amx_tile")
                               if hasattr(torch.cpu, f"_is_{name}_supported")}
    except Exception as e:  # noqa: BLE001 - facts for the record, never a reason to fail the run
        facts["error"] = f"{type(e).__name__}: {e}"
    return facts


# ---------------------------------------------------------------------------------------------
# Whole distributions as arrays (suites with logprobs = "full")

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
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        import resource

        return {"written": dict(self.written), "seconds": self.seconds,
                "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def install_full_sink(worker: Any) -> str:
    """Runs in the engine-core process (``collective_rpc``): wrap the model runner's sampling and
    prompt-logprob steps with a :class:`FullSink`."""
    runner = worker.model_runner
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


def exit_without_teardown(rc: int) -> None:
    """Leave now. vLLM's interpreter teardown has been seen to abort ("terminate called without an
    active exception", exit -6) after every result was written; the parent kills this process
    group (the engine-core processes) whatever happens."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _score(llm, sampling_params, score: dict | None, seed: int, files: FullFiles | None = None
           ) -> tuple[list[dict], float]:
    """Teacher forcing: the engine's logprobs at every position of prompt + given continuation.

    One prefill per sequence with ``prompt_logprobs`` (vLLM skips its prefix cache for these), so
    row t is the distribution the engine predicts continuation token t from. ``logprobs`` -1 keeps
    the whole vocabulary (the engine needs ``max_logprobs=-1``). With ``files`` the whole rows of
    the continuation go into one ``.npy`` file per sequence.
    """
    if not score or not score.get("sequences"):
        return [], 0.0
    k = int(score.get("logprobs", 5))
    seqs = score["sequences"]
    tags, params = [], []
    for i, q in enumerate(seqs):
        tag = files.new(f"score-{i:04d}", "score", len(q["continuation_ids"]), len(q["prompt_ids"]) - 1) \
            if files else None
        tags.append(tag)
        params.append(sampling_params(
            temperature=0.0, max_tokens=1,
            prompt_logprobs=-1 if k <= 0 or (files and not files.hooked) else k,
            detokenize=False, seed=seed, extra_args={FULL_TAG: tag} if tag and files.hooked else None))
    t0 = time.perf_counter()
    results = llm.generate([{"prompt_token_ids": q["prompt_ids"] + q["continuation_ids"]} for q in seqs],
                           params, use_tqdm=False)
    lines = []
    for q, r, tag in zip(seqs, results, tags, strict=True):
        start, cont = len(q["prompt_ids"]), [int(t) for t in q["continuation_ids"]]
        rows = (r.prompt_logprobs or [])[start:start + len(cont)]
        top_ids, top_lps, chosen = [], [], []
        for tid, step in zip(cont, rows, strict=True):
            ti, tl, c = _logprob_rows(step or {}, tid, k)
            top_ids.append(ti)
            top_lps.append(tl)
            chosen.append(c)
        line = {"kind": "score", "id": q["id"], "token_ids": cont, "top_ids": top_ids,
                "top_logprobs": top_lps, "chosen_logprobs": chosen}
        if tag is not None and files is not None:
            if not files.hooked:
                files.fill_from_dicts(tag, rows)
            line["full"] = files.line(tag, len(cont))
        lines.append(line)
    return lines, time.perf_counter() - t0


def _closed_loop(llm, prompts: list, params: list, concurrency: int) -> tuple[list, list, float]:
    """Keep ``concurrency`` requests in flight until all are done (how a server is loaded by c
    clients). Returns the outputs in prompt order, each request's time to first token (s) and
    when the clock started (after a warm-up)."""
    engine = llm.llm_engine
    # Warm-up outside the clock (first-step compilation at this batch size), each prompt shorter
    # than a KV block so that nothing of it can be served from the prefix cache later.
    warm = [{"prompt_token_ids": p["prompt_token_ids"][:8]} for p in prompts[:concurrency]]
    llm.generate(warm, type(params[0])(temperature=0.0, max_tokens=2), use_tqdm=False)
    todo = list(range(len(prompts)))[::-1]
    index, sent, first, done = {}, {}, {}, {}

    def submit() -> None:
        i = todo.pop()
        rid = f"case-{i}"
        sent[i] = time.perf_counter()
        got = engine.add_request(rid, prompts[i], params[i])
        index[rid] = i
        if isinstance(got, str):
            index[got] = i  # releases that rename the request answer with the new id

    t_start = time.perf_counter()
    while todo and len(sent) - len(done) < concurrency:
        submit()
    while len(done) < len(prompts):
        for r in engine.step():
            i = index.get(r.request_id)
            if i is None or i in done:
                continue
            if i not in first and r.outputs and len(r.outputs[0].token_ids) > 0:
                first[i] = time.perf_counter() - sent[i]
            if r.finished:
                done[i] = r
                if todo:
                    submit()
    return [done[i] for i in range(len(prompts))], [first.get(i) for i in range(len(prompts))], t_start


def _with_tag(extra: dict, tag: dict | None) -> dict:
    """``SamplingParams`` keyword arguments with a request's full-row tag in its ``extra_args``."""
    if tag is None:
        return dict(extra)
    return {**extra, "extra_args": {**(extra.get("extra_args") or {}), FULL_TAG: tag}}


def _full_files(llm: Any, full: dict | None) -> tuple[FullFiles | None, str | None]:
    """The run's whole-distribution files, with the engine-core hook installed when it can be."""
    if not full:
        return None, None
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    raw = bool(full.get("raw"))
    try:
        llm.collective_rpc(install_full_sink)
        return FullFiles(full["dir"], vocab, True, raw), None
    except Exception as e:  # noqa: BLE001 - an older runner: fall back to vLLM's own dicts
        if raw:  # vLLM's dicts hold logprobs: raw logits need the hook
            raise
        return FullFiles(full["dir"], vocab, False), f"{type(e).__name__}: {e}"[:300]


def peak_rss_kib() -> dict[str, Any]:
    """Peak resident memory (``VmHWM``) of this process and of every process it started (vLLM's
    engine core), read from /proc while they still run."""
    def hwm(pid: int | str) -> int | None:
        try:
            with open(f"/proc/{pid}/status") as f:
                return next((int(x.split()[1]) for x in f if x.startswith("VmHWM:")), None)
        except OSError:
            return None

    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    me, kids, todo = os.getpid(), {}, [os.getpid()]
    while todo:
        p = todo.pop()
        for c, pp in parents.items():
            if pp == p and c not in kids:
                kids[c] = hwm(c)
                todo.append(c)
    own = hwm(me) or 0
    children = {str(c): v for c, v in kids.items() if v}
    return {"worker": own, "children": children, "total": own + sum(children.values())}


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    full = req.get("full")
    if full:  # the hook reaches the engine-core process as a pickled function (collective_rpc)
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    with open(result_path, "w") as out:
        t0 = time.perf_counter()
        llm = start_llm(req, out)
        if llm is None:
            return 3
        import vllm
        from vllm import SamplingParams
        t_start = time.perf_counter() - t0
        files, no_hook = _full_files(llm, full)
        s = req["sampling"]
        k = int(s.get("logprobs", 5))
        gen_tags = [files.new(f"gen-{i:04d}", "gen", int(s["max_tokens"])) if files else None
                    for i in range(len(req["cases"]))]
        lp_k = -1 if files and not files.hooked else (k if k != 0 else None)
        params = [SamplingParams(
            temperature=0.0, max_tokens=int(s["max_tokens"]), logprobs=lp_k, seed=int(s.get("seed", 0)),
            **_with_tag(req.get("sampling_extra", {}), tag if files and files.hooked else None))
            for tag in gen_tags] or [SamplingParams(temperature=0.0, max_tokens=1)]
        prompts = [{"prompt_token_ids": c["prompt_ids"]} for c in req["cases"]]
        t1 = time.perf_counter()
        conc = req.get("concurrency")
        ttft: list = []
        if conc and prompts:
            results, ttft, t1 = _closed_loop(llm, prompts, params, int(conc))
        else:
            results = llm.generate(prompts, params, use_tqdm=False) if prompts else []
        t_gen = time.perf_counter() - t1
        n_out = sum(len(r.outputs[0].token_ids) for r in results)
        score = req.get("score")
        if score and score.get("own"):  # score the sequences just generated (an A/B arm's control)
            score = {**score, "sequences": [
                {"id": c["id"], "prompt_ids": c["prompt_ids"],
                 "continuation_ids": [int(t) for t in r.outputs[0].token_ids]}
                for c, r in zip(req["cases"], results, strict=True)]}
        scored, t_score = _score(llm, SamplingParams, score, int(s.get("seed", 0)), files)
        sink = llm.collective_rpc(full_sink_report)[0] if files and files.hooked else {}
        written = sink.get("written", {})
        levels = []
        plain = params if not files else [SamplingParams(  # speed replays write no rows
            temperature=0.0, max_tokens=int(s["max_tokens"]), logprobs=k if k != 0 else None,
            seed=int(s.get("seed", 0)), **req.get("sampling_extra", {})) for _ in prompts]
        for c in req.get("speed_levels") or ():  # the same workload again at each concurrency
            res_c, ttft_c, t_c = _closed_loop(llm, prompts, plain, int(c))
            levels.append({"concurrency": int(c), "wall_s": time.perf_counter() - t_c, "ttft_s": ttft_c,
                           "output_tokens": sum(len(r.outputs[0].token_ids) for r in res_c)})
        cache = getattr(getattr(llm.llm_engine, "vllm_config", None), "cache_config", None)
        write_line(out, {
            "kind": "meta", "version": vllm.__version__, "pid": os.getpid(),
            "timings": {"engine_start_s": t_start, "generate_s": t_gen,
                        **({"score_s": t_score} if scored else {}),
                        **({"full_hook_s": sink["seconds"]} if sink else {})},
            "output_tokens": n_out,
            **({"concurrency": int(conc), "ttft_s": ttft} if conc and prompts else {}),
            **({"speed_levels": levels} if levels else {}),
            "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
            "block_size": getattr(cache, "block_size", None),
            "cache_dtype": str(getattr(cache, "cache_dtype", "")),
            "kernel": kernel_facts(),
            **({"full_capture": "engine-hook" if files.hooked else "logprob-dicts",
                "full_vocab": files.vocab, **({"full_no_hook": no_hook} if no_hook else {})}
               if files else {}),
            "peak_rss_kib": peak_rss_kib(),
        })
        for case, r, tag in zip(req["cases"], results, gen_tags, strict=True):
            line = {"kind": "case", "id": case["id"], **output_fields(r, k)}
            if tag is not None and files is not None:
                if not files.hooked:
                    files.fill_from_dicts(tag, r.outputs[0].logprobs or [])
                line["full"] = {**files.line(tag, len(line["token_ids"])),
                                "written": written.get(tag["path"]) if files.hooked else None}
            write_line(out, line)
        for line in scored:
            if "full" in line and files is not None and files.hooked:
                line["full"]["written"] = written.get(line["full"]["path"])
            write_line(out, line)
        write_line(out, {"kind": "end"})  # every result is written: the exit code no longer matters
    return 0


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1], sys.argv[2]))
