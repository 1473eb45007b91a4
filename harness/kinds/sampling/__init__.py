"""The sampling gate (suite kind ``sampling``): a candidate's own sampler, judged draw by draw against
the harness's reference transforms of the oracle's raw logits.

* :mod:`.kind`      the :class:`~harness.kinds.base.GateKind`: prepare, run (the candidate's
                    :class:`~harness.abilities.Sampler` draws), judge, staleness
* :mod:`.settings`  the suite's ``[sampling_gate]`` table: settings and bars, validated
* :mod:`.oracle`    the oracle's raw logits at the tests' prefixes (teacher forcing, pinned vLLM)
* :mod:`.plan`      settings x the oracle's rows -> tests (case x position x setting)
* :mod:`.draws`     the oracle's rows, and each test's draw budget (judged draws, requests)
* :mod:`.sites`     control-site budgeting: where each setting's planted faults are judged
* :mod:`.gof`       goodness of fit: pooled cells, Pearson chi-square, exact binomial, Holm, power
* :mod:`.judge`     draws -> support checks, fit, determinism and logprob verdicts
* :mod:`.faults`    the planted faults of each parameter; :mod:`.doubles` planted samplers (the
                    controls) and the correct double's false-positive rate

The reference transforms and each engine's documented chain are :mod:`harness.sampling.transforms`,
below the engines, which declare their chain there.
"""
