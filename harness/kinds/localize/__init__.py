"""The ``localize`` kind: where a red parity gate's candidate parts from the oracle — the layer and
sub-block (attention, MLP) where two engines part. It runs on a parity suite.

* :mod:`.kind`     the :class:`~harness.kinds.base.GateKind`: the diverged cases of a parity record,
                   both engines teacher-forced on them, one diagnosis per case
* :mod:`.profile`  NMSE per tapped tensor, where the engines part, the controls
* :mod:`.oracle`   the pinned vLLM's tensors on the goldens' sequences, cached
* :mod:`.plant`    copies of a checkpoint with one weight perturbed (the proof)

``harness localize RECORD``, ``harness plant`` and the diagnosis that follows a failing ``harness
gate`` are :mod:`harness.commands.localize`; the taps, shared by every engine, are
:mod:`harness.engines.launch.layer_taps`. docs/localize.md tells the whole story.
"""
