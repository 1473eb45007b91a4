"""JSON over HTTP to the pinned server's RL routes (``VLLM_SERVER_DEV_MODE=1``): the client the RL
session (:mod:`harness.engines.vllm.rl_http`) and its pause phase (:mod:`harness.engines.vllm.rl_pause`)
share, the sampling parameters of a rollout, and one weight update."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from harness.api import EngineFailed

HTTP_TIMEOUT_S = 600.0


class Http:
    """JSON over HTTP to one server; a refusal raises :class:`EngineFailed` with the route and body."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def call(self, method: str, path: str, body: Any = None, timeout: float = HTTP_TIMEOUT_S) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise EngineFailed(f"{method} {path}: HTTP {e.code}: {_body(e)}") from None
        except OSError as e:
            raise EngineFailed(f"{method} {path}: {e}") from None
        return json.loads(raw) if raw.strip() else None

    def post(self, path: str, body: Any = None, timeout: float = HTTP_TIMEOUT_S) -> Any:
        return self.call("POST", path, {} if body is None else body, timeout)

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def text(self, path: str) -> str:
        """A GET answered in plain text (``/metrics``)."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=HTTP_TIMEOUT_S) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            raise EngineFailed(f"GET {path}: HTTP {e.code}: {_body(e)}") from None
        except OSError as e:
            raise EngineFailed(f"GET {path}: {e}") from None

    def rpc(self, method: str, *args: str) -> Any:
        got = self.post("/collective_rpc", {"method": method, "args": list(args)})
        return None if got is None else got["results"][0]

    def stream(self, path: str, body: Any, on_chunk: Any, timeout: float = HTTP_TIMEOUT_S) -> None:
        """A server-sent-events POST: ``on_chunk(dict)`` per ``data:`` line until ``[DONE]``."""
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        return
                    on_chunk(json.loads(payload))
        except urllib.error.HTTPError as e:
            raise EngineFailed(f"POST {path}: HTTP {e.code}: {_body(e)}") from None


def _body(e: urllib.error.HTTPError) -> str:
    return e.read().decode(errors="replace")[:800]


def params(sampling: Mapping[str, Any], seed: int, max_tokens: int | None = None) -> dict[str, Any]:
    return {
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "max_tokens": int(max_tokens or sampling["max_tokens"]),
        "seed": int(seed),
        "logprobs": 0,
        "ignore_eos": True,
    }


def update(http: Http, up: Mapping[str, Any], version: str) -> dict[str, Any]:
    """``start_weight_update`` … ``finish_weight_update``; what the backend received and repacked."""
    t0 = time.perf_counter()
    http.post("/start_weight_update")
    if up.get("apply", True):
        http.post("/update_weights", {"update_info": {"path": up["path"], "names": up.get("names")}})
    http.post("/finish_weight_update", {"weight_version": version})
    seconds = time.perf_counter() - t0
    return {"update_s": seconds, "received": http.rpc("harness_received") or [],
            "repacked": http.rpc("harness_repacked") or []}


__all__ = ["HTTP_TIMEOUT_S", "Http", "params", "update"]
