"""KV bytes: capture what the engine wrote, restore it in a fresh engine, compare page by page.

Read in this order:

* :mod:`harness.kv_pages.identity` (below this package: the comparators use it too) page identity (a hash
                   of the token prefix, never a block id), the hit rule
* ``digest.py``    page digests in plain torch integer ops: on the GPU for a GPU cache
* ``layout.py``    which dimension of a layer's cache tensor counts blocks, read from its shape
* ``store.py``     the harness's chunk store, every page verified on read; ``faults.py`` its
                   planted-fault doubles (flip one byte, drop one page)
* ``plan.py``      scheduler-side bookkeeping: which pages each engine step must read
* ``capture.py``   the capture format (page bytes + one JSON line per page) and its reader;
                   ``capture_write.py`` the writer the connectors call inside the engine
* ``connector.py`` ``HarnessKVConnector``: stores chunks and records written/restored pages
* ``tap.py``       ``HarnessTapConnector``: wraps a third-party connector and records the same
* ``phase.py``     one engine process running passes of requests (producer, consumer, probe)
* ``settings.py``  the suite's ``[kv]`` table and the engine settings each phase starts with
* ``passes.py``    the passes each phase runs, and the phase's process seen from the host
* ``roundtrip.py`` producer -> fresh consumer -> evidence -> verdicts, controls and figures
* ``cuda_only.py`` a connector that moves KV to CUDA on a host without CUDA: a named skip
* ``judge.py``     captures -> evidence, verdicts, controls, figures; ``refusal.py`` the probe's
* :mod:`harness.kv_pages.evidence` (below this package too) what the comparators judge
                   (``harness.compare.byte_equal``, ``kv_hits``)
* ``bench.py``     compare throughput next to memcpy

The modules vLLM imports inside its processes (``connector``, ``tap`` and what they use) need only
torch, numpy, vLLM and ``harness.registry`` (standard library): they load in any vLLM's virtualenv
that has this repository on its path.
"""
