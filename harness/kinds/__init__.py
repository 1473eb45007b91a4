"""Gate kinds, registered by suite kind: ``parity``, ``kv_roundtrip``, ``ab``, ``invariance``,
``sampling``, ``api``; and ``localize``, which runs on a parity suite (``run_gate(..., kind="localize")``).

Each is a prepare -> run -> judge, plus its staleness rule (:class:`~harness.kinds.base.GateKind`);
the pipeline (:mod:`harness.pipeline`) runs them and builds the one record. One kind is one package
holding its settings, run, judge and controls, its :class:`~harness.kinds.base.GateKind` in
``kind.py``; :mod:`.registered` imports every kind (a new kind is one import there).

Beside the kinds, what several of them share: :mod:`.base` (the contract), :mod:`.controls` (planted
mutations of every comparator, run for the record), :mod:`.distribution` (the run-level distribution
verdicts of the parity and A/B gates) and :mod:`.summary` (summary record kinds).

This file imports nothing: vLLM loads the KV connectors (:mod:`harness.kinds.kv.connector`) inside
its engine processes by module path, and loading one must not load every gate kind.
"""
