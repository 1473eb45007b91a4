"""Run one vLLM engine over a whole workload, in its own process.

Standalone on purpose: it imports only the standard library and vLLM, so the same file runs under
the pinned oracle's virtualenv or under any other vLLM release's (``vllm@<version>``). Its helpers
sit beside it, standard library only at import as well: :mod:`harness.engines.vllm.full` (whole
distributions), :mod:`harness.engines.vllm.facts` (kernels and memory of the engine's processes),
:mod:`harness.engines.launch.layer_taps` (per-layer tensors). The harness talks to it through files:

    python worker.py REQUEST.json RESULT.jsonl

REQUEST.json: {"model", "engine": {LLM kwargs}, "sampling": {...}, "cases": [{"id", "prompt_ids"}]}
and optionally "concurrency": c, to replay the cases with at most c in flight (a closed loop, as c
clients load a server) and report each one's time to first token in the meta line ("ttft_s").
RESULT.jsonl (:mod:`harness.engines.launch.worker_lines`, the one protocol of every worker): first line
{"kind": "meta", "version", "timings", ...}, then one line per case
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
computes its own logprobs from (see :mod:`harness.engines.vllm.full`; "full": {"dir", "raw": true}:
the raw logits instead, before any log-softmax: what a repetition penalty, whose effect depends on
a logit's sign, applies to). The meta line's
"peak_rss_kib" gives the peak resident memory of this process and of the engine-core process.

Per-layer tensors: "tensors": {"dir": FOLDER, "sequences": [{"id", "ids"}]} adds one
{"kind": "tensors", "id", "path", "positions", "rows", "calls", "names"} line per sequence, its
``.npz`` in FOLDER holding every name of :mod:`harness.engines.launch.layer_taps` at every position, or one
{"kind": "tensors", "refused": reason} line when the taps cannot be installed. The harness asks for
an eager engine without a prefix cache for such a run (see :func:`_layer_tensors`).

One engine per process, every case batched into one ``generate`` call: start-up (~55 s on 2 CPU
cores) dominates, generation of a suite takes well under a second. ``serve.py`` runs the same
workloads (:func:`run_workload`) one after another on one engine, for the engine pool
(:mod:`harness.engines.vllm.pool`).
"""

from __future__ import annotations

import heapq
import json
import os
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported by the harness (harness.engines.vllm.worker)
    from harness.engines.launch import layer_taps, worker_lines
    from harness.engines.vllm import facts as vllm_facts
    from harness.engines.vllm import full as vllm_full
else:
    # Run as a script by a vLLM release's python: this file's folder heads sys.path, and its siblings
    # (server.py, runner.py …) could shadow real packages. Put the folder last instead, and the
    # shared launch/ folder after it, so that only the helpers there (standard library only at
    # import) resolve; vLLM's engine processes inherit this path and unpickle the hooks by reference.
    _LAUNCH = os.path.join(os.path.dirname(_HERE), "launch")
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in (_HERE, _LAUNCH)] + [
        _HERE, _LAUNCH]
    import facts as vllm_facts  # type: ignore[no-redef]
    import full as vllm_full  # type: ignore[no-redef]
    import layer_taps  # type: ignore[no-redef]
    import worker_lines  # type: ignore[no-redef]

FullFiles = vllm_full.FullFiles
write_line, write_result, NOT_STARTED = (worker_lines.write_line, worker_lines.write_result,
                                          worker_lines.NOT_STARTED)
kernel_facts, peak_rss_kib = vllm_facts.kernel_facts, vllm_facts.peak_rss_kib

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
        worker_lines.write_start_failure(out, _classify(e), f"{type(e).__name__}: {e}", e)
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
            detokenize=False, seed=seed,
            extra_args={vllm_full.FULL_TAG: tag} if tag and files.hooked else None))
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
    return {**extra, "extra_args": {**(extra.get("extra_args") or {}), vllm_full.FULL_TAG: tag}}


def _full_files(llm: Any, full: dict | None) -> tuple[FullFiles | None, str | None]:
    """The run's whole-distribution files, with the engine-core hook installed when it can be."""
    if not full:
        return None, None
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    raw = bool(full.get("raw"))
    try:
        llm.collective_rpc(vllm_full.install_full_sink)
        return FullFiles(full["dir"], vocab, True, raw), None
    except Exception as e:  # noqa: BLE001 - an older runner: fall back to vLLM's own dicts
        if raw:  # vLLM's dicts hold logprobs: raw logits need the hook
            raise
        return FullFiles(full["dir"], vocab, False), f"{type(e).__name__}: {e}"[:300]


def _layer_tensors(llm: Any, sampling_params: Any, tensors: dict | None) -> tuple[list[dict], float]:
    """Per sequence, every layer's sub-block stream, the final norm and the logits at every position
    (:mod:`harness.engines.launch.layer_taps`, tapped in the engine's worker process). One request per
    ``generate`` call (``max_tokens`` 1: its prefill is the only forward pass), so the rows of one
    forward pass are one sequence's; the engine runs eager (compiled graphs skip module hooks) and
    without a prefix cache (a cached prefix would skip rows), which the request's engine settings
    say. A family the taps do not know, or modules not where they expect them, is one ``tensors``
    line with ``refused``."""
    if not tensors:
        return [], 0.0
    t0 = time.perf_counter()
    hf = llm.llm_engine.model_config.hf_config
    model_type = getattr(getattr(hf, "get_text_config", lambda: hf)(), "model_type", None)
    try:
        llm.collective_rpc(layer_taps.vllm_install, args=(model_type,))
    except Exception as e:  # noqa: BLE001 - the reason goes to the harness
        return [{"kind": "tensors", "refused": f"{type(e).__name__}: {e}"[:1000]}], 0.0
    os.makedirs(tensors["dir"], exist_ok=True)
    params = sampling_params(temperature=0.0, max_tokens=1, detokenize=False)
    lines = []
    for i, q in enumerate(tensors["sequences"]):
        llm.collective_rpc(layer_taps.vllm_arm)
        llm.generate([{"prompt_token_ids": list(q["ids"])}], params, use_tqdm=False)
        path = os.path.join(tensors["dir"], f"tensors-{i:04d}.npz")
        got = llm.collective_rpc(layer_taps.vllm_take, args=(path,))[0]
        lines.append({"kind": "tensors", "id": q["id"], "path": path, "positions": len(q["ids"]), **got})
    return lines, time.perf_counter() - t0


def generate(llm: Any, prompts: list[dict[str, Any]], params: list[Any], alone: bool = False
             ) -> tuple[list[Any], float]:
    """Every request in one ``generate`` call (all together), or one call per request (one at a
    time: the reference a batch is judged against); and the seconds it took."""
    t0 = time.perf_counter()
    if alone:
        results = [llm.generate([q], [sp], use_tqdm=False)[0] for q, sp in zip(prompts, params, strict=True)]
    else:
        results = llm.generate(prompts, params, use_tqdm=False) if prompts else []
    return results, time.perf_counter() - t0


def serve_passes(req: dict[str, Any], out: Any, run_pass: Any, engine: dict[str, Any] | None = None,
                 meta: Any = None, release: bool = False) -> int:
    """Start the request's engine (``engine``: its settings, else the request's) and run its
    ``passes`` (:func:`worker_lines.run_passes`): ``run_pass(llm, SamplingParams, p)`` gives a
    pass's lines and seconds, ``meta(llm)`` what the worker adds to the meta line. ``release``:
    drop the engine (its connector shuts down) before the end line."""
    t0 = time.perf_counter()
    llm = start_llm({**req, "engine": req.get("engine", {}) if engine is None else engine}, out)
    if llm is None:
        return NOT_STARTED
    import vllm
    from vllm import SamplingParams

    start_s = time.perf_counter() - t0
    lines, timings = worker_lines.run_passes(req["passes"], lambda p: run_pass(llm, SamplingParams, p))
    cache = getattr(getattr(llm.llm_engine, "vllm_config", None), "cache_config", None)
    write_result(out, {"version": vllm.__version__, "timings": {"engine_start_s": start_s, **timings},
                       "block_size": getattr(cache, "block_size", None),
                       "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
                       **(meta(llm) if meta is not None else {})}, lines, end=not release)
    if release:
        del llm
        write_line(out, worker_lines.END)
    return 0


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    full = req.get("full")
    if full or req.get("tensors"):  # hooks reach the engine's processes as pickled functions
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    with open(result_path, "w") as out:
        t0 = time.perf_counter()
        llm = start_llm(req, out)
        if llm is None:
            return NOT_STARTED
        run_workload(llm, req, out, time.perf_counter() - t0)
    return 0


def run_workload(llm: Any, req: dict[str, Any], out: Any, start_s: float,
                 engine: dict[str, Any] | None = None) -> None:
    """Everything a request asks of a started engine, its result lines written to ``out``.
    ``start_s``: what starting the engine cost this workload (0 for a pooled engine's later ones);
    ``engine``: facts about a pooled engine for the meta line."""
    import vllm
    from vllm import SamplingParams

    full = req.get("full")
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
    sink = llm.collective_rpc(vllm_full.full_sink_report)[0] if files and files.hooked else {}
    written = sink.get("written", {})
    levels = []
    plain = params if not files else [SamplingParams(  # speed replays write no rows
        temperature=0.0, max_tokens=int(s["max_tokens"]), logprobs=k if k != 0 else None,
        seed=int(s.get("seed", 0)), **req.get("sampling_extra", {})) for _ in prompts]
    for c in req.get("speed_levels") or ():  # the same workload again at each concurrency
        res_c, ttft_c, t_c = _closed_loop(llm, prompts, plain, int(c))
        levels.append({"concurrency": int(c), "wall_s": time.perf_counter() - t_c, "ttft_s": ttft_c,
                       "output_tokens": sum(len(r.outputs[0].token_ids) for r in res_c)})
    layers, t_layers = _layer_tensors(llm, SamplingParams, req.get("tensors"))
    cache = getattr(getattr(llm.llm_engine, "vllm_config", None), "cache_config", None)
    meta = {
        "version": vllm.__version__, "pid": os.getpid(),
        "timings": {"engine_start_s": start_s, "generate_s": t_gen,
                    **({"score_s": t_score} if scored else {}),
                    **({"full_hook_s": sink["seconds"]} if sink else {}),
                    **({"tensors_s": t_layers} if layers else {})},
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
        **({"engine": engine} if engine else {}),
    }
    body = []
    for case, r, tag in zip(req["cases"], results, gen_tags, strict=True):
        line = {"kind": "case", "id": case["id"], **output_fields(r, k)}
        if tag is not None and files is not None:
            if not files.hooked:
                files.fill_from_dicts(tag, r.outputs[0].logprobs or [])
            line["full"] = {**files.line(tag, len(line["token_ids"])),
                            "written": written.get(tag["path"]) if files.hooked else None}
        body.append(line)
    for line in scored:
        if "full" in line and files is not None and files.hooked:
            line["full"]["written"] = written.get(line["full"]["path"])
        body.append(line)
    write_result(out, meta, body + layers)


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1], sys.argv[2]))
