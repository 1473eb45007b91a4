"""The A/B gate (suite kind ``ab``): one engine, two configurations, the same workload, no goldens.

* :mod:`.kind`   the :class:`~harness.kinds.base.GateKind`: both arms run now (A first, then B),
                 B is judged against A (agreement, KL / drift / NMSE, throughput, KV capacity)
* :mod:`.stats`  task-accuracy thresholds with stated error rates
"""
