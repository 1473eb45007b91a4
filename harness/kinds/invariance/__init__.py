"""The invariance gate (suite kind ``invariance``): configurations that must not change one token
(bit-exact / near-tie), and trainer-vs-rollout logprobs.

* :mod:`.kind`      the :class:`~harness.kinds.base.GateKind`: prepare, run, judge, staleness
* :mod:`.settings`  the suite's ``[invariance]`` and ``[rl]`` tables, the variants, verdict names
* :mod:`.plan`      variants -> engine groups (one engine start per distinct configuration)
* :mod:`.run`       the engines: vLLM children (:mod:`harness.engines.vllm.phase`, through
                    :mod:`harness.engines.vllm.passes`), the OpenAI server, the trainer
* :mod:`.pairs`     engine results -> each variant's (reference, variant) pairs and its evidence
* :mod:`.tiers`     bit-exact and near-tie per pair, the inverse control, planted faults
* :mod:`.trainer`   the trainer's logprobs in the rollout engine's logprob mode
"""
