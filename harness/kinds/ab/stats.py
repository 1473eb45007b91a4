"""Task-accuracy thresholds with stated error rates (TensorRT-LLM's form).

Arm A (reference) and arm B (under test) each score ``n`` exact-match items whose per-item score
has standard deviation ``sigma`` (for 0/1 scores at accuracy p, sigma = sqrt(p(1-p)); in percent
points, 100 times that). Their difference then has standard deviation ``sqrt(2 sigma^2 / n)``, and

* B passes when ``B >= A - threshold`` with ``threshold = z_(1-alpha) * sqrt(2 sigma^2 / n)``:
  an unchanged B fails with probability alpha (one-sided);
* the minimum detectable effect ``(z_(1-alpha) + z_(1-beta)) * sqrt(2 sigma^2 / n)`` is the drop
  the test catches with probability 1 - beta. A smaller regression can slip through: say so.

The arithmetic lives here; :func:`accuracy_verdict` applies it to two lists of per-item scores.
A tiny random model cannot do tasks, so the tests exercise this on synthetic scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from harness.api import Verdict


class StatsError(ValueError):
    """Impossible test parameters (alpha outside (0, 0.5], n < 1, sigma < 0); names the field."""


def z(p: float) -> float:
    """The standard normal quantile: P(Z <= z(p)) = p."""
    return NormalDist().inv_cdf(p)


@dataclass(frozen=True, slots=True)
class AccuracyTest:
    """A one-sided non-inferiority test of B against A."""

    sigma: float
    """Per-item standard deviation of the score, in the units of the scores."""
    n: int
    """Items each arm scores."""
    alpha: float = 0.05
    """Probability that an unchanged B fails (false alarm)."""
    beta: float = 0.2
    """Probability that a drop of one minimum detectable effect passes (miss)."""

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 0.5:
            raise StatsError(f"alpha must be in (0, 0.5], got {self.alpha}")
        if not 0 < self.beta <= 0.5:
            raise StatsError(f"beta must be in (0, 0.5], got {self.beta}")
        if self.n < 1:
            raise StatsError(f"n must be >= 1, got {self.n}")
        if not self.sigma >= 0:
            raise StatsError(f"sigma must be >= 0, got {self.sigma}")

    @property
    def scale(self) -> float:
        """Standard deviation of (mean B - mean A): sqrt(2 sigma^2 / n)."""
        return math.sqrt(2 * self.sigma**2 / self.n)

    @property
    def threshold(self) -> float:
        """How far B may fall below A and still pass."""
        return z(1 - self.alpha) * self.scale

    @property
    def mde(self) -> float:
        """The drop detected with probability 1 - beta."""
        return (z(1 - self.alpha) + z(1 - self.beta)) * self.scale

    def passes(self, mean_a: float, mean_b: float) -> bool:
        return mean_b >= mean_a - self.threshold

    def to_json(self) -> dict[str, Any]:
        return {"sigma": self.sigma, "n": self.n, "alpha": self.alpha, "beta": self.beta,
                "threshold": self.threshold, "mde": self.mde}


def required_n(sigma: float, mde: float, alpha: float = 0.05, beta: float = 0.2) -> int:
    """Items per arm for the test to detect a drop of ``mde`` with probability 1 - beta."""
    if mde <= 0:
        raise StatsError(f"mde must be > 0, got {mde}")
    return max(1, math.ceil(2 * sigma**2 * ((z(1 - alpha) + z(1 - beta)) / mde) ** 2))


def bernoulli_sigma(accuracy: float) -> float:
    """Per-item standard deviation of a 0/1 score at ``accuracy`` (0..1)."""
    if not 0 <= accuracy <= 1:
        raise StatsError(f"accuracy must be in [0, 1], got {accuracy}")
    return math.sqrt(accuracy * (1 - accuracy))


def accuracy_verdict(scores_a: Sequence[float], scores_b: Sequence[float], test: AccuracyTest,
                     case_id: str = "(run)") -> Verdict:
    """Judge per-item scores of both arms (same items, same order) with ``test``."""
    if len(scores_a) != len(scores_b):
        return Verdict(case_id, "accuracy", "error",
                       f"arms scored {len(scores_a)} and {len(scores_b)} items: they must match")
    n = len(scores_a)
    if n == 0:
        return Verdict(case_id, "accuracy", "skip", "no items scored")
    a, b = sum(scores_a) / n, sum(scores_b) / n
    ev = {"mean_a": a, "mean_b": b, "delta": b - a, "items": n, **test.to_json()}
    note = ("" if n == test.n else f" (suite plans n={test.n}, scored {n})")
    head = (f"B {b:.4g} vs A {a:.4g} (Δ {b - a:+.4g}), threshold {test.threshold:.3g}, "
            f"MDE {test.mde:.3g} at α={test.alpha}, β={test.beta}{note}")
    if test.passes(a, b):
        return Verdict(case_id, "accuracy", "pass", f"accuracy pass: {head}", evidence=ev)
    return Verdict(case_id, "accuracy", "fail", f"accuracy FAIL: {head}",
                   detail=f"B is below A by more than z_(1-α)·sqrt(2σ²/n) = {test.threshold:.4g}: a drop "
                          f"this large happens by chance with probability < {test.alpha}",
                   evidence=ev)
