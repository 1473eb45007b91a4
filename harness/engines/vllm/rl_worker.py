"""One vLLM engine through a whole RL weight-sync session, in its own process.

Standalone like :mod:`harness.engines.vllm.worker` (standard library and vLLM only; its helpers beside
it): ``python rl_worker.py REQUEST.json RESULT.jsonl``. The engine starts once, with
``weight_transfer_config={"backend": "harness_files"}`` (:mod:`harness.engines.vllm.rl_backend`,
registered when this file is imported: vLLM's engine-core process is spawned and imports this file
again as ``__mp_main__``, so the backend is in its factory too), and then, step by step:

1. an update through vLLM's RL API — ``start_weight_update``, ``update_weights`` with the step's file,
   ``finish_weight_update(weight_version=...)`` — unless the step has none (step 0, the checkpoint);
2. ``reset_prefix_cache()`` unless the step says not to (a planted control);
3. seeded rollouts, every request in one ``generate`` call;
4. the evidence: vLLM's own per-tensor checksums (where the release has them), the engine's
   reported weight version, what the backend loaded, and the harness's tap on the engine's weights
   (:mod:`harness.engines.vllm.rl_taps`);
5. with ``routes``, on its step: one prefill per rollout (prompt + sampled tokens; the prefix cache reset
   before each, so that every position is computed) with the routers tapped.

REQUEST.json: {"model", "engine": {LLM kwargs}, "init_info": {...}, "tap_dir", "routes": {"top_k", "step"},
"sampling": {"temperature", "top_p", "max_tokens"}, "steps": [{"index", "version", "update":
{"path", "names", "apply"} | null, "reset_prefix_cache": bool, "rollouts": [{"id", "prompt_ids",
"seed"}]}]}. RESULT.jsonl (:mod:`harness.engines.launch.worker_lines`): the meta line, then per step one
{"kind": "step", ...} line and one {"kind": "case", "step", ...} line per rollout, then the end line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:
    from harness.engines.launch import worker_lines
    from harness.engines.vllm import rl_backend as vllm_rl_backend
    from harness.engines.vllm import rl_taps as vllm_rl_taps
else:  # as a script: this folder and the shared launch/ last on the path (its siblings shadow packages)
    _LAUNCH = os.path.join(os.path.dirname(_HERE), "launch")
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in (_HERE, _LAUNCH)] + [
        _HERE, _LAUNCH]
    import rl_backend as vllm_rl_backend  # type: ignore[no-redef]
    import rl_taps as vllm_rl_taps  # type: ignore[no-redef]
    import worker_lines  # type: ignore[no-redef]

    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the taps travel by reference
    vllm_rl_backend.register()


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return "refused" if any(w in text for w in ("not supported", "Not supported", "requires")) else "error"


def _rollouts(llm: Any, sp_cls: Any, sampling: dict, rollouts: list[dict], step: int) -> list[dict]:
    prompts = [{"prompt_token_ids": list(r["prompt_ids"])} for r in rollouts]
    params = [
        sp_cls(
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            max_tokens=sampling["max_tokens"],
            seed=int(r["seed"]),
            logprobs=0,
            ignore_eos=True,
        )
        for r in rollouts
    ]
    results = llm.generate(prompts, params, use_tqdm=False) if prompts else []
    lines = []
    for r, res in zip(rollouts, results, strict=True):
        o = res.outputs[0]
        ids = [int(t) for t in o.token_ids]
        chosen = [
            float(step_lp[t].logprob) if t in step_lp else float("nan")
            for t, step_lp in zip(ids, o.logprobs or [], strict=False)
        ]
        lines.append(
            {
                "kind": "case",
                "step": step,
                "id": r["id"],
                "token_ids": ids,
                "chosen_logprobs": chosen,
                "finish_reason": o.finish_reason or "",
                "num_cached_tokens": getattr(res, "num_cached_tokens", None),
                "weight_versions": _spans(o),
            }
        )
    return lines


def _spans(o: Any) -> list[dict[str, Any]] | None:
    """Which weight version sampled which output tokens (``CompletionOutput.weight_versions``, set on
    the final output), or None where the engine does not say."""
    spans = getattr(o, "weight_versions", None)
    if spans is None:
        return None
    return [{"version": str(s.version), "start": int(s.start), "end": int(s.end)} for s in spans]


def _routes(llm: Any, sp_cls: Any, cases: list[dict], rollouts: list[dict]) -> dict[str, Any]:
    """Each rollout's prompt + sampled tokens, one prefill each, routers tapped: the experts chosen
    at every position the engine computed (a prefix it served from its cache is not computed)."""
    prompts = {r["id"]: list(r["prompt_ids"]) for r in rollouts}
    out = {}
    sp = sp_cls(temperature=0.0, max_tokens=1, detokenize=False)
    for c in cases:
        ids = prompts[c["id"]] + list(c["token_ids"])[:-1]
        llm.reset_prefix_cache()  # every position computed, none served from the cache
        llm.collective_rpc(vllm_rl_taps.arm_routes)
        res = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0]
        got = llm.collective_rpc(vllm_rl_taps.take_routes)[0]
        cached = int(getattr(res, "num_cached_tokens", 0) or 0)
        out[c["id"]] = {"offset": cached, "layers": {k: v["experts"] for k, v in got.items()}}
    return out


def _update(llm: Any, step: dict) -> dict[str, Any]:
    up = step["update"]
    t0 = time.perf_counter()
    llm.start_weight_update()
    if up.get("apply", True):
        llm.update_weights({"update_info": {"path": up["path"], "names": up.get("names")}})
    llm.finish_weight_update(weight_version=str(step["version"]))
    seconds = time.perf_counter() - t0
    received = llm.collective_rpc(vllm_rl_backend.received)[0]
    return {
        "update_s": seconds,
        "received": received,
        "repacked": llm.collective_rpc(vllm_rl_backend.repacked)[0],
        "memcpy_s": _memcpy_s(sum(r["bytes"] for r in received)),
    }


def _memcpy_s(nbytes: int) -> float | None:
    """Seconds to copy ``nbytes`` in memory (the floor an update's transfer is set beside): the
    fastest of three copies into a buffer already touched, so no page fault is counted."""
    if nbytes <= 0:
        return None
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return best


def official_routes(model: str, engine: dict[str, Any]) -> list[dict[str, str]]:
    """vLLM's own way to return routed experts (``enable_return_routed_experts``, what NeMo-RL's
    routing replay reads), asked for as a user would, as it is and with the model runner it names:
    what its configuration answers, in its words."""
    from vllm.engine.arg_utils import EngineArgs

    keep = {
        k: v
        for k, v in engine.items()
        if k in ("dtype", "block_size", "max_model_len", "seed", "enforce_eager", "enable_prefix_caching")
    }
    out = []
    for env in ({}, {"VLLM_USE_V2_MODEL_RUNNER": "1"}):
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            EngineArgs(model=model, enable_return_routed_experts=True, **keep).create_engine_config()
            answer = "accepted"
        except Exception as e:  # noqa: BLE001 - the refusal is the finding
            answer = f"{type(e).__name__}: {e}"
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        out.append({"env": " ".join(f"{k}={v}" for k, v in env.items()) or "(none)", "answer": answer[:500]})
    return out


def run_session(llm: Any, req: dict[str, Any]) -> tuple[list[dict], dict[str, float]]:
    from vllm import SamplingParams

    timings = {"update_s": 0.0, "rollout_s": 0.0, "tap_s": 0.0, "routes_s": 0.0}
    lines: list[dict] = []
    routes = req.get("routes") or {}
    route_layers = (
        llm.collective_rpc(vllm_rl_taps.install_routes, args=(int(routes.get("top_k", 0)),))[0]
        if routes
        else []
    )
    os.makedirs(req["tap_dir"], exist_ok=True)
    for step in req["steps"]:
        k = int(step["index"])
        info: dict[str, Any] = {"kind": "step", "index": k, "asked_version": str(step["version"])}
        if step.get("update"):
            info.update(_update(llm, step))
            timings["update_s"] += info["update_s"]
        elif k == 0:
            llm.update_weight_version(str(step["version"]))
        if step.get("reset_prefix_cache", True):
            info["reset_prefix_cache"] = bool(llm.reset_prefix_cache())
        info["weight_version"] = llm.get_weight_version()
        t0 = time.perf_counter()
        cases = _rollouts(llm, SamplingParams, req["sampling"], step["rollouts"], k)
        timings["rollout_s"] += (dt := time.perf_counter() - t0)
        info["rollout_s"] = dt
        t0 = time.perf_counter()
        info["checksums"] = llm.collective_rpc(vllm_rl_taps.vllm_checksums)[0]  # None: release has none
        path = os.path.join(req["tap_dir"], f"weights-{k}.safetensors")
        info["tap"] = {"path": path, "how": llm.collective_rpc(vllm_rl_taps.weights, args=(path,))[0]}
        timings["tap_s"] += time.perf_counter() - t0
        if route_layers and k == int(routes.get("step", 0)):
            t0 = time.perf_counter()
            info["routes"] = _routes(llm, SamplingParams, cases, step["rollouts"])
            info["route_layers"] = route_layers
            timings["routes_s"] += time.perf_counter() - t0
        lines.append(info)
        lines += cases
    return lines, timings


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    with open(result_path, "w") as out:
        t0 = time.perf_counter()
        try:
            from vllm import LLM

            llm = LLM(model=req["model"], **req["engine"])
            llm.init_weight_transfer_engine({"init_info": req.get("init_info", {})})
        except BaseException as e:  # noqa: BLE001 - a start failure becomes a verdict
            return worker_lines.write_start_failure(out, _classify(e), f"{type(e).__name__}: {e}", e)
        import vllm

        start_s = time.perf_counter() - t0
        lines, timings = run_session(llm, req)
        official = official_routes(req["model"], req["engine"]) if req.get("routes") else None
        sums = [d["checksums"] for d in lines if d.get("kind") == "step"]
        meta = {
            "version": vllm.__version__,
            "backend": vllm_rl_backend.BACKEND,
            "vllm_checksums": "absent" if all(c is None for c in sums) else "compute_weight_checksums",
            "timings": {"engine_start_s": start_s, **timings},
        }
        worker_lines.write_result(out, {**meta, **({"official_routes": official} if official else {})}, lines)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
