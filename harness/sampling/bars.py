"""``[compare.sampling]``: the sampling gate's bars, as the comparator registry knows them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.api import Verdict


class SamplingBars:
    """``[compare.sampling]``: the sampling gate's bars. It judges whole tests of draws, which the
    gate kind (:mod:`harness.kinds.sampling`) does with :mod:`harness.sampling.judge`; per case it has
    nothing to say."""

    key = "sampling"
    needs_scores = False

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)

    def compare(self, oracle: Any, candidate: Any, case: Any) -> Verdict:
        return Verdict(
            getattr(case, "id", "?"),
            self.key,
            "skip",
            "sampling: judged over draws by the sampling gate kind, not per case",
        )
