"""What a re-pin changes, before it is made: ``harness repin --vllm <release>`` (``make repin``).

* :mod:`.whatif`  record goldens with that release into a scratch folder (``reports/repin/``, never
                  ``goldens/``), and compare them with the committed ones per model and suite
                  (strict, near-tie, KL: the comparators of :mod:`harness.compare`);
* :mod:`.stale`   every FEATURES.md cell that would turn ⌛ under the new pin, computed by the page
                  generator itself against a what-if of the tree (:mod:`harness.staleness`);
* :mod:`.cost`    what a full re-record would take, from the goldens' own recorded timings;
* :mod:`.accept`  ``--accept`` (``ACCEPT=1``): the pin, the goldens and the pages switch as one
                  change, with a record of the re-pin; without it nothing in the tree changes;
* :mod:`.record`  the ``repin`` records (one per model and suite); the subcommand is
                  :mod:`harness.commands.repin`.
"""


class RepinError(ValueError):
    """Bad input to a re-pin (an unknown release, model or suite, goldens missing, an incomplete
    accept); the message names it and the fix."""
