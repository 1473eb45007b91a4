"""What a sampler is, below the engines and the sampling gate (:mod:`harness.kinds.sampling`).

* :mod:`.transforms` the harness's own implementation of every sampling parameter, and each engine's
                     documented chain (order, which tokens a penalty sees): the engines declare
                     their chain here, the gate applies the reference to the oracle's logits
* :mod:`.engines`    the llama.cpp draws' worker; each engine's sampler is an ability of its runner
                     (:class:`~harness.abilities.Sampler`, in :mod:`harness.engines`)
"""
