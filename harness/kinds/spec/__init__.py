"""The speculative-decoding gate (``kind = "spec"``): see :mod:`harness.kinds.spec.kind`."""
