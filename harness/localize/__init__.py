"""Diagnosis of a red gate: the layer and sub-block where two engines part.

* :mod:`harness.localize.profile`  NMSE per tapped tensor, where the engines part, the controls
* :mod:`harness.localize.oracle`   the pinned vLLM's tensors on the goldens' sequences, cached
* :mod:`harness.localize.plant`    copies of a checkpoint with one weight perturbed (the proof)

The gate kind itself is :mod:`harness.kinds.localize`; ``harness localize RECORD``, ``harness plant``
and the diagnosis that follows a failing ``harness gate`` are :mod:`harness.commands.localize`; the
taps, shared by every engine, are :mod:`harness.engines.launch.layer_taps`. docs/localize.md tells the
whole story. This package never imports the pipeline or the gate kind that use it.
"""
