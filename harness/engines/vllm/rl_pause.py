"""The pause phase over HTTP: an update with requests in flight, once per ``/pause`` mode of the
pinned server (what each mode promises is judged in :mod:`harness.kinds.rl.pause`).

The requests stream through ``/inference/v1/generate``; once the server counts them all running
(or every stream has delivered a token, whichever is seen first) the server is paused in the mode,
the weights are updated, the prefix cache reset, the server resumed.
What the client saw is only half the evidence: the server's front end, the client and the engine
share the host's cores, and under load the engine can finish a request well before its tokens reach
the client. The server's own counts (``/metrics``: requests running and waiting, tokens generated,
requests finished by reason) are read before, at, during and after the pause, so the judge can tell
a request the engine still held from one it had finished."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.api import EngineFailed
from harness.engines.vllm.rl_wire import HTTP_TIMEOUT_S, Http, params, update

PAUSE_MODES = ("abort", "wait", "keep")
"""What the pinned server's ``/pause`` offers: abort the requests in flight; wait for them to
finish; keep them frozen and resume them on ``/resume``."""


def pause_phase(http: Http, plan: Mapping[str, Any], sampling: Mapping[str, Any], model: str,
                unexercised: Callable[[Mapping[str, Any]], str | None]) -> list[dict[str, Any]]:
    """One update with requests in flight per ``/pause`` mode (:data:`PAUSE_MODES`). ``plan``:
    {"modes": [{"mode", "rollouts": [{"id", "prompt_ids", "seed"}]}], "weights": {step: path} (two
    steps: each update moves the engine to the one it does not hold), "at" (the step it holds),
    "first_version", "max_tokens", "max_tokens_cap"}. The requests stream; once they have started
    (:func:`_await_start`) the server is paused in the mode, the update runs, the prefix cache is reset,
    the server resumes. Where ``unexercised`` says the mode did not meet a request in flight (the
    server had finished them before the pause took effect), the mode is tried again with twice the
    tokens, up to the cap; the tokens a mode needed carry over to the next. Each mode's last attempt
    is returned (its earlier ones in ``attempts``): each request's tokens, logprobs, finish reason,
    ``weight_versions``, the times it started, got its first token and ended; the times of the
    pause and update; and the server's own counts before, at and after the pause
    (:func:`engine_counts`)."""
    weights = {int(k): str(v) for k, v in plan["weights"].items()}
    at, version = int(plan["at"]), int(plan["first_version"])
    tokens, cap = int(plan["max_tokens"]), int(plan["max_tokens_cap"])
    out = []
    for m in plan["modes"]:
        attempts: list[dict[str, Any]] = []
        while True:
            to = next(k for k in sorted(weights) if k != at)
            run = {**m, "version": str(version), "from_step": at, "to_step": to, "max_tokens": tokens,
                   "update": {"path": weights[to], "names": None}}
            ev = _one_pause(http, run, sampling, model)
            at, version = to, version + 1
            why = unexercised(ev)
            if why is None or tokens >= cap:
                break
            attempts.append({"max_tokens": tokens, "version": ev["version"], "why": why,
                             "engine": {k: ev[k] for k in ENGINE_KEYS}})
            tokens = min(cap, 2 * tokens)
        ev["attempts"] = attempts
        out.append(ev)
    return out


ENGINE_KEYS = ("engine_before", "engine_at_pause", "engine_paused", "engine_after")
"""The server's own counts (:func:`engine_counts`) a pause-phase entry holds: before its requests,
just before ``/pause``, while paused (once settled) and after every request ended (once settled)."""


def engine_counts(http: Http) -> dict[str, Any]:
    """What the server's ``/metrics`` says of its requests, summed over engines: ``running`` and
    ``waiting`` (gauges), ``generation_tokens`` and ``finished`` by finish reason (counters)."""
    out: dict[str, Any] = {"running": 0.0, "waiting": 0.0, "generation_tokens": 0.0, "finished": {}}
    names = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
             "vllm:generation_tokens_total": "generation_tokens"}
    for line in http.text("/metrics").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, rest = line.partition("{")
        labels, _, value = rest.rpartition("}") if rest else ("", "", line.split()[-1])
        name = name.split()[0]
        if name in names:
            out[names[name]] += float(value)
        elif name == "vllm:request_success_total":
            tags = dict(kv.split("=", 1) for kv in labels.split(",") if "=" in kv)
            reason = tags.get("finished_reason", "").strip('"')
            out["finished"][reason] = out["finished"].get(reason, 0.0) + float(value)
    return out


def _settled(http: Http, done: Callable[[dict[str, Any]], bool] = lambda _c: True,
             wait_s: float = 20.0) -> dict[str, Any]:
    """The server's counts once they stop moving (the front end records what the engine did a
    little after it did it): two reads a quarter second apart agreeing, and ``done`` true."""
    end = time.monotonic() + wait_s
    last = engine_counts(http)
    while time.monotonic() < end:
        time.sleep(0.25)
        now = engine_counts(http)
        if now == last and done(now):
            return now
        last = now
    return last


def _await_start(http: Http, first: threading.Event, n: int, before: Mapping[str, Any]) -> str:
    """Wait until the ``n`` requests have started, and say who saw it first: the server (its counts:
    all ``n`` running or waiting, and at least ``n`` tokens generated since ``before``) or the client
    (every stream has delivered a token). The server's front end counts a token before the client
    reads it, and under load long before: a fast model can finish its requests while the client has
    read a few hundred tokens of each."""
    deadline = time.monotonic() + HTTP_TIMEOUT_S
    while not first.is_set() and time.monotonic() < deadline:
        c = engine_counts(http)
        if c["running"] + c["waiting"] >= n and c["generation_tokens"] - before["generation_tokens"] >= n:
            return "server"
        first.wait(0.05)
    return "client"


def _one_pause(http: Http, m: Mapping[str, Any], sampling: Mapping[str, Any], model: str) -> dict[str, Any]:
    clock = time.perf_counter
    t_origin = clock()
    state: dict[str, dict[str, Any]] = {}
    first = threading.Event()

    def one(r: Mapping[str, Any]) -> None:
        st = state[r["id"]]

        def chunk(d: Mapping[str, Any]) -> None:
            for ch in d.get("choices") or ():
                toks = ch.get("token_ids") or []
                st["token_ids"] += [int(t) for t in toks]
                content = (ch.get("logprobs") or {}).get("content") or []
                st["chosen_logprobs"] += [float(c["logprob"]) for c in content]
                if toks and st["first_token_t"] is None:
                    st["first_token_t"] = clock() - t_origin
                    if all(s["first_token_t"] is not None for s in state.values()):
                        first.set()
                if ch.get("finish_reason"):
                    st["finish_reason"] = ch["finish_reason"]
                if ch.get("weight_versions") is not None:
                    st["weight_versions"] = ch["weight_versions"]

        try:
            http.stream("/inference/v1/generate", {
                "request_id": f"{r['id']}-{time.monotonic_ns()}", "model": model, "stream": True,
                "token_ids": list(r["prompt_ids"]),
                "sampling_params": params(sampling, int(r["seed"]), int(m["max_tokens"]))}, chunk)
        except (EngineFailed, OSError) as e:
            st["error"] = str(e)[:500]
        st["end_t"] = clock() - t_origin
        if all(s["end_t"] is not None or s["first_token_t"] is not None for s in state.values()):
            first.set()

    for r in m["rollouts"]:
        state[r["id"]] = {"id": r["id"], "prompt_ids": list(r["prompt_ids"]),
                          "token_ids": [], "chosen_logprobs": [], "finish_reason": None,
                          "weight_versions": None, "first_token_t": None, "end_t": None, "error": None,
                          "tokens_at_pause": None}
    ev: dict[str, Any] = {"mode": m["mode"], "version": str(m["version"]), "from_step": m["from_step"],
                          "to_step": m["to_step"], "max_tokens": int(m["max_tokens"])}
    ev["version_before"] = http.get("/weight_info")["weight_version"]
    ev["engine_before"] = _settled(http)
    threads = [threading.Thread(target=one, args=(r,)) for r in m["rollouts"]]
    for t in threads:
        t.start()
    ev["paused_on"] = _await_start(http, first, len(m["rollouts"]), ev["engine_before"])
    for s in state.values():
        s["tokens_at_pause"] = len(s["token_ids"])
    ev["engine_at_pause"] = engine_counts(http)
    ev["pause_t"] = clock() - t_origin
    ev["in_flight_at_pause"] = sum(s["end_t"] is None for s in state.values())
    ev["pause_answer"] = http.post(f"/pause?mode={m['mode']}&clear_cache=false")
    ev["paused_t"] = clock() - t_origin
    ev["is_paused"] = http.get("/is_paused").get("is_paused")
    ev["update_start_t"] = clock() - t_origin
    up = update(http, m["update"], str(m["version"]))
    ev["update_end_t"] = clock() - t_origin
    ev["update_s"] = up["update_s"]
    ev["received"] = [{"names": len(x["names"]), "bytes": x["bytes"]} for x in up["received"]]
    ev["engine_paused"] = _settled(http)
    ev["reset_while_paused"] = http.post("/reset_prefix_cache")["success"]
    ev["resume_t"] = clock() - t_origin
    http.post("/resume")
    for t in threads:
        t.join(HTTP_TIMEOUT_S)
    n0 = sum(ev["engine_before"]["finished"].values())
    ev["engine_after"] = _settled(http, lambda c: sum(c["finished"].values()) - n0 >= len(state))
    ev["reset_after"] = http.post("/reset_prefix_cache")["success"]
    ev["version_after"] = http.get("/weight_info")["weight_version"]
    ev["requests"] = [state[r["id"]] for r in m["rollouts"]]
    return ev


__all__ = ["ENGINE_KEYS", "PAUSE_MODES", "engine_counts", "pause_phase"]
