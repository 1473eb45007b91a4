"""What the engine did during one pass, as evidence that a run was under load.

Runs inside the phase process (:mod:`harness.kinds.kv.phase`) when its request asks for it
(``"observe": {"events": "ipc://..."}``), around each pass:

* vLLM's counters before and after (its Prometheus metrics, ``disable_log_stats=False``):
  preemptions, prefix-cache and connector (external) cache queries and hits;
* the requests the engine held unfinished (running + waiting) and running, sampled every
  :data:`SAMPLE_S` seconds while the pass runs: the peaks are lower bounds;
* vLLM's KV-cache events (``kv_events_config``, published over ZeroMQ on ``events``): blocks
  stored into and removed from (evicted out of) the prefix cache.

Standard library at import; zmq, msgspec and vLLM are imported only when a pass is observed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from harness.engines.vllm.phase import read_counters

SAMPLE_S = 0.02
COUNTERS = ("vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
            "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits")
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
SETTLE_S = 1.0
"""After a pass, how long the event subscriber may take to receive the last steps' events."""


class EventCounts:
    """Counts vLLM's KV-cache events from its ZeroMQ publisher (a background thread)."""

    def __init__(self, endpoint: str) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self.counts: Counter[str] = Counter()
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(100):
                    continue
                frames = self._sock.recv_multipart()
                batch = self._decode(frames[-1])
                with self._lock:
                    self.counts["batches"] += 1
                    for ev in batch.events:
                        self.counts[type(ev).__name__] += len(getattr(ev, "block_hashes", ()) or ()) or 1
        except Exception as e:  # noqa: BLE001 - reported in the result, never raised into the engine
            self.error = f"{type(e).__name__}: {e}"

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(linger=0)


class PassObserver:
    """Counters, sampled peaks and KV-cache events over one pass (use as a context manager)."""

    def __init__(self, llm: Any, events: EventCounts | None) -> None:
        self.llm = llm
        self.events = events
        self.peaks = {"in_flight": 0, "running": 0, "waiting": 0}
        self.samples = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="kv-load-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            g = read_counters(self.llm, GAUGES)
            if isinstance(g, str):
                return
            running, waiting = int(g[GAUGES[0]]), int(g[GAUGES[1]])
            self.samples += 1
            self.peaks["running"] = max(self.peaks["running"], running)
            self.peaks["waiting"] = max(self.peaks["waiting"], waiting)
            self.peaks["in_flight"] = max(self.peaks["in_flight"], running + waiting)

    def __enter__(self) -> PassObserver:
        self._before = read_counters(self.llm, COUNTERS)
        self._events_before = self.events.snapshot() if self.events else {}
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join(timeout=5)

    def result(self) -> dict[str, Any]:
        """The pass's counters (after - before), peaks and KV-cache events, for the result file."""
        after = read_counters(self.llm, COUNTERS)
        out: dict[str, Any] = {"peak_" + k: v for k, v in self.peaks.items()}
        out["samples"] = self.samples
        if isinstance(self._before, str) or isinstance(after, str):
            out["counters_unreadable"] = self._before if isinstance(self._before, str) else after
        else:
            out.update({k.removeprefix("vllm:"): after[k] - self._before[k] for k in COUNTERS})
        if self.events is not None:
            time.sleep(SETTLE_S)
            now = self.events.snapshot()
            for key, name in (("blocks_stored", "BlockStored"), ("blocks_evicted", "BlockRemoved"),
                              ("event_batches", "batches")):
                out[key] = now.get(name, 0) - self._events_before.get(name, 0)
            if self.events.error:
                out["events_error"] = self.events.error
        return out
