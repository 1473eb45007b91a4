"""What a sampler is, below the engines and the sampling gate (:mod:`harness.kinds.sampling`).

* :mod:`.transforms` the harness's own implementation of every sampling parameter, and each engine's
                     documented chain (order, which tokens a penalty sees): the engines declare
                     their chain here, the gate applies the reference to the oracle's logits

Each engine's sampler is an ability of its runner (:class:`~harness.abilities.Sampler`, in its
family's package under :mod:`harness.engines`; llama.cpp's draws run
``engines/llamacpp/draws_worker.py``).
"""
