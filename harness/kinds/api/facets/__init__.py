"""The facets of the API surface, one module each, registered in :data:`FACETS` in the order a run
sends them (robustness last: its requests may kill the server)."""

from harness.kinds.api.facets import (  # noqa: F401 - each module registers its facet
    detokenization,
    logprob_values,
    logprobs,
    robustness,
    schema,
    stop,
    streaming,
    structured,
    template,
    tools,
)
from harness.kinds.api.facets.base import FACETS, Context, Facet, Observed, Probe, comparator

__all__ = ["FACETS", "Context", "Facet", "Observed", "Probe", "comparator"]
