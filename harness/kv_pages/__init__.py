"""KV pages: what the KV comparators judge and what the KV connectors write, below both.

* :mod:`.identity`       page identity (a hash of the token prefix, never a block id), the hit rule
* :mod:`.layout`         which dimension of a layer's cache tensor counts blocks, read from its shape
* :mod:`.digest`         page digests: XXH3-128 of host bytes, plain torch integer ops on a cache
* :mod:`.digest_triton`  the GPU digest kernel :mod:`.digest` uses on a CUDA cache
* :mod:`.evidence`       one case's captured pages as the comparators see them
                         (:mod:`harness.compare.byte_equal`, :mod:`harness.compare.kv_hits`)

The KV gate (:mod:`harness.kinds.kv`) captures and restores pages; the comparators judge them.
Everything here loads inside any vLLM's virtualenv that has this repository on its path (torch,
numpy, xxhash and the standard library): the connectors import it inside the engine.
"""
