"""The invariance gate's parts (the gate kind itself is :mod:`harness.kinds.invariance`).

* :mod:`.settings`  the suite's ``[invariance]`` and ``[rl]`` tables, the variants, verdict names
* :mod:`.plan`      variants -> engine groups (one engine start per distinct configuration)
* :mod:`.run`       the engines: vLLM children (:mod:`.phase`), the OpenAI server, the trainer
* :mod:`.pairs`     engine results -> each variant's (reference, variant) pairs and its evidence
* :mod:`.tiers`     bit-exact and near-tie per pair, the inverse control, planted faults
* :mod:`.trainer`   the trainer's logprobs in the rollout engine's logprob mode
"""
