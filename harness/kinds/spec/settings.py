"""A ``spec`` suite's ``[spec]`` table: the drafter, the greedy bar, the sampled settings and the
power they are planned for, validated with errors naming the file, the table and the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.suites import Suite, SuiteError
from harness.tomlcheck import Where, check_keys, need_int, need_list, need_number, need_str, need_table

TABLE = "spec"
GREEDY = "spec.greedy"
SAMPLED = "spec.sampled"
CONTROL = "spec.control"
"""A planted control's run: ``pass`` when the gate caught the planted fault (a greedy or sampled
verdict failed), naming the first test and position that did; not gated (the run itself fails)."""
VERDICTS = (GREEDY, SAMPLED, CONTROL)
KEYS = (
    "speculative_config",
    "near_tie_nats",
    "temperatures",
    "concurrency",
    "positions",
    "sampled_tag",
    "sampled_cases",
    "target_tv",
    "alpha",
    "power",
    "max_draws",
    "seed",
)


@dataclass(frozen=True, slots=True)
class SpecSettings:
    speculative_config: Mapping[str, Any]
    """``vllm.LLM(speculative_config=...)``: the drafter under test."""
    near_tie_nats: float = 0.5
    """A greedy divergence is certified a near-tie when the reference's two tokens lie within this."""
    temperatures: tuple[float, ...] = (0.7, 1.0)
    concurrency: tuple[int, ...] = (1, 4, 16)
    """Requests verified together: each ``generate`` call holds this many draws."""
    positions: tuple[int, ...] = (1, 2, 3, 4)
    """Judged positions after the prompt (0 is the prefill's token, never drafted)."""
    sampled_tag: str = "sampled"
    """The cases (by tag) the sampled tests may use; the rows are taken for each."""
    sampled_cases: int = 2
    """How many of them are drawn: those with the most drafted-and-accepted judged positions on the
    reference's greedy path."""
    target_tv: float = 0.02
    alpha: float = 0.01
    power: float = 0.9
    max_draws: int = 4000
    """Draws per (case, temperature, concurrency) at most; the record states the TV each test can
    then detect."""
    seed: int = 1234
    engine: Mapping[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return str(self.speculative_config.get("method", "?"))

    @property
    def k(self) -> int:
        return int(self.speculative_config.get("num_speculative_tokens", 0))

    def to_json(self) -> dict[str, Any]:
        return {
            "speculative_config": dict(self.speculative_config),
            "near_tie_nats": self.near_tie_nats,
            "temperatures": list(self.temperatures),
            "concurrency": list(self.concurrency),
            "positions": list(self.positions),
            "sampled_tag": self.sampled_tag,
            "sampled_cases": self.sampled_cases,
            "target_tv": self.target_tv,
            "alpha": self.alpha,
            "power": self.power,
            "max_draws": self.max_draws,
            "seed": self.seed,
        }


def parse(suite: Suite) -> SpecSettings:
    top = Where(suite.path, error=SuiteError)
    if not isinstance(suite.extra.get(TABLE), dict):
        raise top.fail(f"a spec suite needs a [{TABLE}] table (its drafter and its bars)")
    raw = need_table(suite.extra, TABLE, top)
    w = top / TABLE
    check_keys(raw, w, KEYS)
    cfg = need_table(raw, "speculative_config", w)
    need_str(cfg, "method", w / "speculative_config")
    temps = raw.get("temperatures", [0.7, 1.0])
    if (
        not isinstance(temps, list)
        or not temps
        or not all(isinstance(t, int | float) and not isinstance(t, bool) and t > 0 for t in temps)
    ):
        raise (w / "temperatures").fail(f"expected a non-empty list of numbers > 0, got {temps!r}")
    conc = need_list(raw, "concurrency", w, [1, 4, 16], of=int, lo=1)
    pos = need_list(raw, "positions", w, [1, 2, 3, 4], of=int, lo=1)
    return SpecSettings(
        dict(cfg),
        need_number(raw, "near_tie_nats", w, 0.5, lo=0.0),
        tuple(float(t) for t in temps),
        tuple(int(c) for c in conc),
        tuple(sorted(int(p) for p in pos)),
        need_str(raw, "sampled_tag", w, "sampled"),
        need_int(raw, "sampled_cases", w, 2, lo=1),
        need_number(raw, "target_tv", w, 0.02, lo=0.0, hi=1.0, lo_open=True),
        need_number(raw, "alpha", w, 0.01, lo=0.0, hi=0.5, lo_open=True),
        need_number(raw, "power", w, 0.9, lo=0.0, hi=1.0, lo_open=True),
        need_int(raw, "max_draws", w, 4000, lo=1),
        need_int(raw, "seed", w, 1234, lo=0),
    )
