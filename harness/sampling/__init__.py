"""The sampling gate's parts (the gate kind itself is :mod:`harness.kinds.sampling`).

* :mod:`.transforms` the harness's own implementation of every sampling parameter, and each engine's
                     documented chain (order, which tokens a penalty sees)
* :mod:`.gof`        goodness of fit: pooled cells, Pearson chi-square, exact binomial, Holm, power
* :mod:`.settings`   the suite's ``[sampling_gate]`` table: settings and bars, validated
* :mod:`.plan`       settings x the oracle's rows -> tests (case x position x setting), draws
* :mod:`.oracle`     the oracle's raw logits at the tests' prefixes (teacher forcing, pinned vLLM)
* :mod:`.judge`      draws -> support checks, fit, determinism and logprob verdicts
* :mod:`.doubles`    planted samplers (the controls) and the correct double's false-positive rate
* :mod:`.engines`    the llama.cpp draws' worker; each engine's sampler is an ability of its runner
                     (:class:`~harness.abilities.Sampler`, in :mod:`harness.engines`)
"""
