"""Since when: a binary search for the first point whose verdicts differ from a reference's.

``harness bisect`` (``make bisect``) answers "which vLLM release changed this behaviour" and "which
commit of my engine broke it". Every step is a normal gate record (:func:`harness.pipeline.run_gate`);
the bisect itself writes one record of kind ``bisect`` naming every step's record, the verdicts
that differ between the last point like the reference and the first one unlike it, the number of
steps and their time.

* :mod:`.index`    the vLLM releases the package index lists, cached with the date it was asked;
* :mod:`.search`   the search itself: ends, skips, the first differing point (pure; any probe);
* :mod:`.verdicts` a record as a verdict table (what "differ" means), and the diff of two;
* :mod:`.releases` a step = one gate on ``vllm@<release>`` in its venv (shared, created on use);
* :mod:`.history`  a step = a commit of a ``cmd:`` engine's repository, checked out and built;
* :mod:`.record`   the ``bisect`` record; the ``harness bisect`` subcommand
                  is :mod:`harness.commands.bisect`.
"""


class BisectError(ValueError):
    """Bad input to a bisect (unknown release, unknown commit, a suite it cannot bisect); the message
    names the field and the fix."""
