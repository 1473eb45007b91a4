"""The comparators' kernels: array code several comparators (and their controls) share. None of these
is a comparator; each is imported by the comparator modules beside this package.

* :mod:`.aligned`   two outputs lined up position by position (teacher-forced or until divergence)
* :mod:`.full`      full-vocabulary rows as arrays: KL, NMSE, top token and mass of ``[n, V]`` rows
* :mod:`.compiled`  the compiled one-pass kernel behind :mod:`.full` (every per-row fact at once)
* :mod:`.batch`     strict, near-tie and vLLM's logprob rule over a whole run of equal-length cases
* :mod:`.fused`     one pass over a run: strict, near-tie, the mutual-top-k rule and top-k KL together
* :mod:`.planting`  planting primitives the comparators' controls share
"""
