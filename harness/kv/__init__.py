"""KV bytes: capture what the engine wrote, restore it in a fresh engine, compare page by page.

Read in this order:

* ``pages.py``     page identity (a hash of the token prefix, never a block id), the hit rule
* ``digest.py``    page digests in plain torch integer ops: on the GPU for a GPU cache
* ``store.py``     the harness's chunk store, every page verified on read; ``faults.py`` its
                   planted-fault doubles (flip one byte, drop one page)
* ``plan.py``      scheduler-side bookkeeping: which pages each engine step must read
* ``capture.py``   what the connectors record (page bytes + one JSON line per page), read back
* ``connector.py`` ``HarnessKVConnector``: stores chunks and records written/restored pages
* ``tap.py``       ``HarnessTapConnector``: wraps a third-party connector and records the same
* ``phase.py``     one engine process running passes of requests (producer, consumer, probe)
* ``roundtrip.py`` producer -> fresh consumer -> evidence -> verdicts, controls and figures
* ``evidence.py``  what the comparators judge (``harness.compare.byte_equal``, ``kv_hits``)
* ``gate.py``      the record; ``bench.py`` compare throughput next to memcpy

The modules vLLM imports inside its processes (``connector``, ``tap`` and what they use) need only
torch, numpy, vLLM and ``harness.registry`` (standard library): they load in any vLLM's virtualenv
that has this repository on its path.
"""
