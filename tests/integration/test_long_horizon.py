"""The long-horizon gate end to end: committed vLLM goldens (4 x 1024 tokens), real transformers.

transformers runs once (it generates and scores the oracle's sequences); each gate below replays
that run, untouched or with a planted mutation, so the test costs one candidate run and no vLLM
engine start.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import Case, EngineInfo, Output, RunFacts, Sampling
from harness.engines.hf.runner import HFRunner
from harness.models import resolve_model
from harness.pipeline import run_gate_by_name
from harness.records import load_record
from harness.report import print_record
from harness.workspace import REPO_ROOT, Workspace

pytestmark = pytest.mark.integration

Rewrite = Callable[[list[Output]], list[Output]]


class Replay:
    """A candidate that ran once: later gates get its outputs again, its scores rewritten."""

    def __init__(self, inner: HFRunner, cache: dict[str, Any], rewrite: Rewrite | None = None) -> None:
        self.inner, self.cache, self.rewrite = inner, cache, rewrite
        self.name = inner.name

    def info(self) -> EngineInfo:
        return self.inner.info()

    def start(self) -> None:
        if "run" not in self.cache:
            self.inner.start()

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        raise AssertionError("the long-horizon suite judges scores: run_and_score is expected")

    def run_and_score(self, cases: Sequence[Case], sampling: Sampling,
                      continuations: Mapping[str, Sequence[int]] | None, k: int
                      ) -> tuple[list[Output], list[Output]]:
        if "run" not in self.cache:
            self.cache["run"] = self.inner.run_and_score(cases, sampling, continuations, k)
        outs, scores = self.cache["run"]
        return list(outs), (self.rewrite(list(scores)) if self.rewrite else list(scores))

    def facts(self) -> RunFacts:
        return self.inner.facts()

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("long_horizon")
    for sub in ("suites", "models", "goldens"):
        shutil.copytree(REPO_ROOT / sub, root / sub)
    return Workspace(root)


@pytest.fixture(scope="module")
def replay(ws: Workspace) -> Callable[[Rewrite | None], Replay]:
    cache: dict[str, Any] = {}
    inner = HFRunner(resolve_model("tiny-llama", ws), {})
    return lambda rewrite=None: Replay(inner, cache, rewrite)


def ramp(scores: list[Output]) -> list[Output]:
    """Planted drift: the top-1 logprob lowered by 0 nats at the first position, 2 at the last."""
    out = []
    for s in scores:
        lp = np.array(s.top_logprobs, np.float32, copy=True)
        n = len(lp)
        lp[np.arange(n), lp.argmax(axis=1)] -= 2.0 * np.arange(n, dtype=np.float32) / (n - 1)
        out.append(Output(s.case_id, s.token_ids, s.text, s.top_ids, lp, s.chosen_logprobs,
                          s.finish_reason))
    return out


def run_level(rec: Any, comparator: str) -> Any:
    return next(v for v in rec.verdicts if v.case_id == "(run)" and v.comparator == comparator)


def test_transformers_passes_long_horizon_with_the_kl_table_and_pictures(
        ws: Workspace, replay: Callable[[Rewrite | None], Replay],
        capsys: pytest.CaptureFixture[str]) -> None:
    res = run_gate_by_name(ws, "tiny-llama", "long_horizon", "hf", auto_record=False, runner=replay(None))
    rec = res.record
    assert rec.outcome == "pass", rec.summary
    kl, drift = run_level(rec, "kl"), run_level(rec, "drift")
    assert kl.status == "pass" and drift.status == "pass"
    assert kl.evidence["mode"] == "top-k+rest" and kl.evidence["alignment"] == "teacher-forced"
    assert kl.evidence["positions"] == 4 * 1024
    assert kl.evidence["mean"] < 1e-8  # two fp32 engines: float rounding only
    assert drift.evidence["positions"] == 1024 and len(drift.evidence["buckets"]) == 3
    dist = rec.extra["distribution"]
    assert dist["how"] == "teacher-forced" and any("mean KLD" in line for line in dist["lines"])
    for name in dist["figures"].values():
        png = res.path.parent / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert load_record(res.path) == rec
    print_record(rec, str(res.path))
    shown = capsys.readouterr().out
    assert "mean KLD" in shown and "slope" in shown and "kl_vs_position.png" in shown.replace("\n", "")
    # the vacuous-gate guard planted a ramp the drift gate had to fail, and it did
    assert any(c.comparator == "drift" and c.expect == "fail" and c.ok for c in rec.controls)


def test_a_planted_drift_fails_the_drift_gate(ws: Workspace,
                                              replay: Callable[[Rewrite | None], Replay]) -> None:
    rec = run_gate_by_name(ws, "tiny-llama", "long_horizon", "hf", auto_record=False, runner=replay(ramp)).record
    assert rec.outcome == "fail"
    drift = run_level(rec, "drift")
    assert drift.status == "fail" and drift.evidence["slope_per_1k"] > 1e-4, drift.summary
    assert "slope" in drift.detail
    # strict / near-tie judge the free-running tokens, which the ramp does not touch
    assert all(v.status == "pass" for v in rec.verdicts if v.comparator == "strict")


def test_pictures_are_written_beside_the_record(ws: Workspace) -> None:
    recs = sorted(Path(ws.records / "tiny-llama" / "long_horizon").glob("*.json"))
    assert recs
    for rec_path in recs:
        rec = load_record(rec_path)
        for name in rec.extra["distribution"]["figures"].values():
            assert (rec_path.parent / name).exists()
