"""The KV round-trip gate (suite kind ``kv_roundtrip``): capture what the engine wrote, restore it in
a fresh engine, compare page by page.

Read in this order (the pages themselves — identity, layout, digests, evidence — are
:mod:`harness.kv_pages`, below this package: the comparators judge them too):

* ``kind.py``          the :class:`~harness.kinds.base.GateKind`: prepare, run, judge, staleness
* ``settings.py``      the suite's ``[kv]`` table and the engine settings each phase starts with
* ``config.py``        the harness connectors' settings, how a third-party connector is named and
                       found, and the alias table of moved connector module paths
* ``compat.py``        what the installed vLLM release offers: the one place release differences go
* ``store.py``         the harness's chunk store, every page verified on read
* ``plan.py``          scheduler-side bookkeeping: which pages each engine step must read
* ``capture.py``       the capture format (page bytes + one JSON line per page) and its reader;
                       ``capture_write.py`` the writer the connectors call inside the engine
* ``connector.py``     ``HarnessKVConnector``: stores chunks and records written/restored pages
* ``tap.py``           ``HarnessTapConnector``: wraps a third-party connector and records the same
* ``phase.py``         one engine process running passes of requests (producer, consumer, probe);
                       ``observe.py`` what the engine did during a pass (evidence of load)
* ``passes.py``        the passes each phase runs, and the phase's process seen from the host
* ``roundtrip.py``     producer -> fresh consumer -> evidence -> verdicts, controls and figures
* ``judge.py``         captures -> evidence, verdicts, controls, figures; ``refusal.py`` the probe's
* ``load.py``          the round trip under load (``[kv.load]``); ``load_judge.py`` its verdicts
* ``cuda_only.py``     a connector that moves KV to CUDA on a host without CUDA: a named skip
* ``faults/``          planted and real storage faults: ``store.py`` the planted-fault stores (flip
                       one byte, drop one page) that prove byte-equal bites; the storage-fault suite
                       (``[kv.faults]``): ``inject.py`` the faults and the preloaded ``shim.c``,
                       ``run.py`` the connector under them, ``verdict.py`` one row's verdict,
                       ``doubles.py`` and ``controls.py`` its controls, ``table.py`` the docs table
* ``bench.py``         compare throughput next to memcpy

The modules vLLM imports inside its processes (``connector``, ``tap`` and what they use) need only
torch, numpy, vLLM and the standard library: they load in any vLLM's virtualenv that has this
repository on its path. So this package's ``__init__`` (and :mod:`harness.kinds`'s) imports nothing.
"""
