"""The host side of an RL weight-sync session over HTTP: the pinned vLLM server, started once, driven
through its RL routes (``candidate vllm-server``).

The same steps as the offline session (:mod:`harness.engines.vllm.rl`), the same result shape
(:class:`~harness.engines.vllm.rl.Session`), every call an HTTP request to the server
(:mod:`harness.engines.vllm.rl_serve`, ``VLLM_SERVER_DEV_MODE=1``):

* an update: ``POST /pause?mode=abort``, ``/start_weight_update``, ``/update_weights
  {"update_info": {"path", "names"}}``, ``/finish_weight_update {"weight_version"}``, then
  ``/reset_prefix_cache`` (unless the step says not to), ``/resume``; step 0 sets its version with
  ``/update_weight_version``; ``GET /weight_info`` reads it back;
* rollouts through the token-in/token-out route ``POST /inference/v1/generate`` (``--enable-scale-out``),
  every rollout of a step at once, each returning its tokens, its processed logprobs and
  ``weight_versions`` (which version sampled which tokens);
* evidence: ``POST /weight_checker {"action": "checksum"}`` (vLLM's per-tensor checksums) and the
  harness's taps through ``POST /collective_rpc`` on the worker extension
  (:mod:`harness.engines.vllm.rl_ext`);
* then the pause phase (:mod:`harness.engines.vllm.rl_pause`): an update with requests in
  flight, once per ``/pause`` mode.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.api import EngineFailed, EngineRefused
from harness.engines.launch.procs import engine_env
from harness.engines.vllm.preload import PreloadMissing, preload_env
from harness.engines.vllm.rl import RL_ENGINE_SETTINGS, Session
from harness.engines.vllm.rl_backend import BACKEND
from harness.engines.vllm.rl_pause import pause_phase
from harness.engines.vllm.rl_wire import Http, params, update
from harness.engines.vllm.server import VLLMServer, server_args
from harness.models import ModelRef

LAUNCHER = Path(__file__).with_name("rl_serve.py")
EXTENSION = "rl_ext.HarnessRLExtension"
"""The worker extension's qualified name, importable in the engine core (``rl_serve.py`` puts its
folder on the path)."""


class RLServer(VLLMServer):
    """The pinned api_server through the harness's launcher, with the RL routes on."""

    label = "vLLM RL server"

    def command(self) -> list[str]:
        return [
            self.python, str(LAUNCHER), "--model", self.model.path, "--served-model-name", self.model.name,
            *server_args(self.settings),
            "--weight-transfer-config", json.dumps({"backend": BACKEND}),
            "--worker-extension-cls", EXTENSION,
            "--enable-scale-out", "--enable-prompt-tokens-details",
            "--host", self.host, "--port", str(self.port),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return preload_env(self.python, {**engine_env(), "VLLM_SERVER_DEV_MODE": "1"})


def _case(step: int, rid: str, got: Mapping[str, Any]) -> dict[str, Any]:
    ch = got["choices"][0]
    content = (ch.get("logprobs") or {}).get("content") or []
    details = (got.get("usage") or {}).get("prompt_tokens_details") or {}
    return {
        "kind": "case",
        "step": step,
        "id": rid,
        "token_ids": [int(t) for t in ch.get("token_ids") or []],
        "chosen_logprobs": [float(c["logprob"]) for c in content],
        "finish_reason": ch.get("finish_reason") or "",
        "num_cached_tokens": details.get("cached_tokens"),
        "weight_versions": ch.get("weight_versions"),
    }


def rollouts(http: Http, sampling: Mapping[str, Any], rolls: Sequence[Mapping[str, Any]], step: int,
             model: str) -> list[dict[str, Any]]:
    """Every rollout of a step at once (one thread each), through ``/inference/v1/generate``."""
    got: dict[str, Any] = {}

    def one(r: Mapping[str, Any]) -> None:
        try:
            got[r["id"]] = http.post("/inference/v1/generate", {
                "request_id": f"{r['id']}-{time.monotonic_ns()}", "model": model,
                "token_ids": list(r["prompt_ids"]), "sampling_params": params(sampling, int(r["seed"]))})
        except EngineFailed as e:
            got[r["id"]] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in rolls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in rolls:
        if isinstance(got[r["id"]], EngineFailed):
            raise got[r["id"]]
    return [_case(step, r["id"], got[r["id"]]) for r in rolls]


def _routes(http: Http, cases: Sequence[Mapping[str, Any]], rolls: Sequence[Mapping[str, Any]],
            model: str) -> dict[str, Any]:
    prompts = {r["id"]: list(r["prompt_ids"]) for r in rolls}
    out = {}
    for c in cases:
        ids = prompts[c["id"]] + list(c["token_ids"])[:-1]
        http.post("/reset_prefix_cache")
        http.rpc("harness_arm_routes")
        got = http.post("/inference/v1/generate", {
            "model": model, "token_ids": ids,
            "sampling_params": {"temperature": 0.0, "max_tokens": 1, "detokenize": False}})
        taken = http.rpc("harness_take_routes")
        cached = ((got.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        out[c["id"]] = {"offset": int(cached), "layers": {k: v["experts"] for k, v in taken.items()}}
    return out


def steps_over_http(http: Http, req: Mapping[str, Any], model: str, tap_dir: Path) -> tuple[list[dict], dict]:
    """The steps of the offline worker (:func:`harness.engines.vllm.rl_worker.run_session`), over HTTP."""
    timings = {"update_s": 0.0, "rollout_s": 0.0, "tap_s": 0.0, "routes_s": 0.0}
    lines: list[dict] = []
    routes = req.get("routes") or {}
    route_layers = http.rpc("harness_install_routes", str(int(routes.get("top_k", 0)))) if routes else []
    tap_dir.mkdir(parents=True, exist_ok=True)
    for step in req["steps"]:
        k = int(step["index"])
        info: dict[str, Any] = {"kind": "step", "index": k, "asked_version": str(step["version"])}
        if step.get("update"):
            http.post("/pause?mode=abort&clear_cache=false")
            info.update(update(http, step["update"], str(step["version"])))
            timings["update_s"] += info["update_s"]
        elif k == 0:
            http.post("/update_weight_version", {"new_version": str(step["version"])})
        if step.get("reset_prefix_cache", True):
            info["reset_prefix_cache"] = bool(http.post("/reset_prefix_cache")["success"])
        if step.get("update"):
            http.post("/resume")
        info["weight_version"] = http.get("/weight_info")["weight_version"]
        t0 = time.perf_counter()
        cases = rollouts(http, req["sampling"], step["rollouts"], k, model)
        timings["rollout_s"] += (dt := time.perf_counter() - t0)
        info["rollout_s"] = dt
        t0 = time.perf_counter()
        info["checksums"] = http.post("/weight_checker", {"action": "checksum"})["checksums"]
        path = tap_dir / f"weights-{k}.safetensors"
        info["tap"] = {"path": str(path), "how": http.rpc("harness_tap_weights", str(path))}
        timings["tap_s"] += time.perf_counter() - t0
        if route_layers and k == int(routes.get("step", 0)):
            t0 = time.perf_counter()
            info["routes"] = _routes(http, cases, step["rollouts"], model)
            info["route_layers"] = route_layers
            timings["routes_s"] += time.perf_counter() - t0
        lines.append(info)
        lines += cases
    return lines, timings


def run_http_session(
    model: ModelRef,
    engine: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    sampling: Mapping[str, Any],
    work: Path,
    routes: Mapping[str, int] | None,
    pause: Mapping[str, Any] | None,
    timeout_s: float,
    python: str | None = None,
    repack: bool = False,
    unexercised: Callable[[Mapping[str, Any]], str | None] = lambda _ev: None,
) -> Session:
    """Start the server once, run ``steps`` and then the ``pause`` phase over HTTP (none where
    ``pause`` is None; ``unexercised``: see :func:`pause_phase`), stop it."""
    work.mkdir(parents=True, exist_ok=True)
    settings = {**engine, **RL_ENGINE_SETTINGS}
    server = RLServer(model, settings, python=python, log_path=work / "server.log", start_timeout_s=timeout_s)
    t0 = time.perf_counter()
    try:
        server.start()
    except PreloadMissing as e:
        raise EngineRefused(str(e)) from None
    start_s = time.perf_counter() - t0
    try:
        http = Http(server.base_url)
        http.post("/init_weight_transfer_engine", {"init_info": {"folder": str(work), "repack": repack}})
        req = {"steps": list(steps), "sampling": dict(sampling), "routes": routes}
        lines, timings = steps_over_http(http, req, model.name, work / "taps")
        t1 = time.perf_counter()
        paused = pause_phase(http, pause, sampling, model.name, unexercised) if pause else []
        timings["pause_s"] = time.perf_counter() - t1
        version = _server_version(http)
    except EngineFailed as e:
        raise EngineFailed(str(e), server.log_tail(20_000)) from None
    finally:
        log = server.log_tail(20_000)
        server.stop()
    steps_out = tuple(d for d in lines if d.get("kind") == "step")
    cases: dict[int, list[Mapping[str, Any]]] = {}
    for d in lines:
        if d.get("kind") == "case":
            cases.setdefault(int(d["step"]), []).append(d)
    meta = {"version": version, "backend": BACKEND, "transport": "http", "pause": paused,
            "timings": {"engine_start_s": start_s, **timings}}
    return Session(meta, steps_out, {k: tuple(v) for k, v in cases.items()}, log)


def _server_version(http: Http) -> str:
    try:
        return str(http.get("/version").get("version") or "unknown")
    except EngineFailed:
        return "unknown"


__all__ = ["RLServer", "run_http_session", "steps_over_http"]
