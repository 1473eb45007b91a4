"""The parity gate (suite kind ``parity``): goldens -> candidate -> verdicts, the everyday gate.

* :mod:`.kind`    the :class:`~harness.kinds.base.GateKind`: prepare (goldens, cases), run (the
                  candidate generates and, where it can, scores the oracle's sequences), judge
* :mod:`.checks`  the candidate against itself before anything is compared with the oracle
                  (tokenizer, greedy), with their planted controls

Shared with other kinds: :mod:`harness.kinds.controls` (every comparator's planted mutations) and
:mod:`harness.kinds.distribution` (KL / drift / NMSE over the run, the table and the pictures).
Teacher forcing (:mod:`harness.teacher`) sits below the engines, which build their scores with it.
"""
