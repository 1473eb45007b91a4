"""The PyPI engines' plumbing without installing any of them: the worker protocol (top-k rows and
whole distributions from logits, case and score lines), the runner's reading of those lines into
Outputs, options, venv requirements and the conversion cache. The real engines run in
tests/integration/test_cpu_engines.py (opt-in)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.api import Case, EngineFailed, EngineRefused, Sampling
from harness.engines import ENGINES, RunnerContext, make_runner
from harness.engines.launch.converted import conversion_dir, ensure_converted
from harness.engines.pip.runner import PipEngineRunner, ScoringPipEngineRunner
from harness.engines.pip.venvs import oracle, resolved
from harness.engines.pip.workers import worker_protocol as wp
from harness.models import resolve_model
from harness.workspace import Workspace

WORKERS = Path(wp.__file__).parent


def test_log_softmax_is_a_distribution_and_keeps_minus_infinity() -> None:
    x = np.array([[1.0, 2.0, 3.0, -np.inf], [1000.0, 1000.0, 0.0, 0.0]], np.float32)
    lp = wp.log_softmax(x)
    assert lp.dtype == np.float32
    assert np.allclose(np.exp(lp.astype(np.float64)).sum(-1), 1.0, atol=1e-6)
    assert lp[0, 3] == -np.inf and lp[0, 2] > lp[0, 1] > lp[0, 0]
    assert np.isclose(lp[1, 0], np.log(0.5), atol=1e-6)


def test_top_rows_best_first_ties_by_smaller_id_and_the_chosen_tokens_logprob() -> None:
    lp = np.log(np.array([[0.1, 0.4, 0.4, 0.1], [0.7, 0.1, 0.1, 0.1]], np.float32))
    ids, lps, chosen = wp.top_rows(lp, [2, 3], 3)
    assert ids == [[1, 2, 0], [0, 1, 2]]
    assert lps[0][0] == lps[0][1] == pytest.approx(np.log(0.4))
    assert chosen == [pytest.approx(np.log(0.4)), pytest.approx(np.log(0.1))]
    assert wp.top_rows(lp, [0, 0], 10)[0][1] == [0, 1, 2, 3], "k over the vocabulary keeps every id"


def test_case_fields_from_logits_write_the_whole_distribution(tmp_path: Path) -> None:
    logits = np.array([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]], np.float32)
    g = wp.Generated([1, 0], "x", "length", logits=logits)
    out = wp.case_fields(g, 2, wp.FullFiles(str(tmp_path)), "case-a")
    assert out["top_ids"] == [[1, 2], [0, 1]] and out["token_ids"] == [1, 0]
    full = np.load(out["full"]["path"])
    assert full.shape == (2, 3) and out["full"]["rows"] == 2 and out["full"]["vocab"] == 3
    assert np.allclose(full, wp.log_softmax(logits))
    with pytest.raises(ValueError, match="2 logit rows for 3 generated tokens"):
        wp.case_fields(wp.Generated([1, 0, 2], logits=logits), 2, None, "b")


class Planted(wp.Engine):
    """A double of an engine: logits that make token (last + 1) % V decisive; case ``bad`` fails."""

    V = 7

    def version(self) -> str:
        return "0.0-planted"

    def start(self) -> None:
        self.notes.append("planted engine")

    def _logits(self, last: int) -> np.ndarray:
        row = np.zeros(self.V, np.float32)
        row[(last + 1) % self.V] = 4.0
        return row

    def generate(self, prompt_ids: list[int], max_tokens: int, k: int) -> wp.Generated:
        if prompt_ids == [6, 6]:
            raise RuntimeError("planted failure")
        ids, rows, last = [], [], prompt_ids[-1]
        for _ in range(max_tokens):
            rows.append(self._logits(last))
            last = (last + 1) % self.V
            ids.append(last)
        return wp.Generated(ids, "", "length", logits=np.stack(rows))

    def score(self, prompt_ids: list[int], continuation: list[int]) -> np.ndarray:
        prev = [prompt_ids[-1], *continuation[:-1]]
        return np.stack([self._logits(p) for p in prev])


def _spec_runner(workspace: Workspace, tmp_path: Path, scoring: bool = True) -> PipEngineRunner:
    from harness.engines.pip.ct2 import SPEC

    model = resolve_model("tiny-llama", workspace)
    cls = ScoringPipEngineRunner if scoring else PipEngineRunner
    return cls(SPEC, model, {}, "ct2", run_dir=tmp_path, repo_root=tmp_path)


def test_worker_lines_become_outputs_and_scores(workspace: Workspace, tmp_path: Path) -> None:
    req = {"model": "m", "sampling": Sampling(max_tokens=3, logprobs=2, full_vocab=True).to_json(),
           "cases": [{"id": "a", "prompt_ids": [1, 2]}, {"id": "bad", "prompt_ids": [6, 6]}],
           "full": {"dir": str(tmp_path / "full")},
           "score": {"logprobs": 2, "sequences": [{"id": "a", "prompt_ids": [1, 2],
                                                    "continuation_ids": [3, 5, 6]}]}}
    (tmp_path / "req.json").write_text(json.dumps(req))
    assert wp.run(Planted, str(tmp_path / "req.json"), str(tmp_path / "res.jsonl")) == 0
    lines = [json.loads(x) for x in (tmp_path / "res.jsonl").read_text().splitlines()]
    assert [d["kind"] for d in lines] == ["meta", "case", "case", "score", "end"]
    assert lines[0]["notes"] == ["planted engine"] and lines[0]["output_tokens"] == 3
    r = _spec_runner(workspace, tmp_path)
    cases = [Case("a", (1, 2)), Case("bad", (6, 6)), Case("lost", (1,))]
    outs, scores = r._outputs(cases, lines[1:-1], Sampling(max_tokens=3, logprobs=2, full_vocab=True))
    a, bad, lost = outs
    assert a.token_ids == (3, 4, 5) and a.error is None and a.text == r.model.decode([3, 4, 5])
    assert a.top_ids is not None and a.top_ids[:, 0].tolist() == [3, 4, 5]
    assert a.full_logprobs is not None and a.full_logprobs.shape == (3, 7)
    assert a.chosen_logprobs is not None and np.allclose(a.chosen_logprobs, a.top_logprobs[:, 0])  # type: ignore[index]
    assert bad.error is not None and "planted failure" in bad.error
    assert lost.error is not None and "no result" in lost.error
    (s,) = scores
    assert s.token_ids == (3, 5, 6) and s.top_ids is not None
    assert s.top_ids[:, 0].tolist() == [3, 4, 6], "row t predicts continuation token t from the one before"
    assert r.k_served == 2


def test_a_start_failure_is_one_line_and_exit_3(tmp_path: Path) -> None:
    class Refusing(Planted):
        def start(self) -> None:
            raise wp.Refused("no loader for Qwen3MoeConfig")

    req = {"model": "m", "sampling": {"max_tokens": 2, "logprobs": 1}, "cases": [{"id": "a", "prompt_ids": [1]}]}
    (tmp_path / "req.json").write_text(json.dumps(req))
    assert wp.run(Refusing, str(tmp_path / "req.json"), str(tmp_path / "res.jsonl")) == 3
    (line,) = [json.loads(x) for x in (tmp_path / "res.jsonl").read_text().splitlines()]
    assert line["kind"] == "refused" and line["reason"] == "no loader for Qwen3MoeConfig"


@pytest.mark.parametrize("name", ["ct2", "ortgenai"])
def test_unknown_options_are_refused_naming_the_valid_ones(workspace: Workspace, name: str) -> None:
    model = resolve_model("tiny-llama", workspace)
    with pytest.raises(EngineRefused, match="unknown option.*nope.*valid"):
        make_runner(f"{name}:nope=1", model, RunnerContext())
    assert ENGINES.find(name) is not None


def test_engines_that_score_are_scorers(workspace: Workspace, tmp_path: Path) -> None:
    from harness.abilities import Scorer

    assert isinstance(_spec_runner(workspace, tmp_path), Scorer)
    assert not isinstance(_spec_runner(workspace, tmp_path, scoring=False), Scorer)


def test_oracle_pins_resolve_to_the_project_venvs_versions() -> None:
    import importlib.metadata as md

    got = resolved((oracle("torch"), "onnx==1.23.2"))
    assert got == [f"torch=={md.version('torch')}", "onnx==1.23.2"]


def test_the_greedy_settings_change_nothing() -> None:
    sys.path.insert(0, str(WORKERS))
    try:
        import ct2_worker
        import ortgenai_worker
    finally:
        sys.path.remove(str(WORKERS))
    g = ct2_worker.GREEDY
    assert (g["beam_size"], g["sampling_topk"], g["repetition_penalty"], g["no_repeat_ngram_size"],
            g["min_length"]) == (1, 1, 1.0, 0, 0)
    assert g["return_end_token"] and g["return_logits_vocab"]
    o = ortgenai_worker.GREEDY
    assert (o["do_sample"], o["num_beams"], o["repetition_penalty"], o["min_length"]) == (False, 1, 1.0, 0)


FAKE_CONVERTER = """
import json, os, sys
src, dest, opts = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if opts.get("mode") == "refuse":
    print(json.dumps({"refused": "no loader for GPT2Config"})); sys.exit(3)
if opts.get("mode") == "crash":
    sys.stderr.write("Traceback (most recent call last):\\nKeyError: 'rope_type'\\n"); sys.exit(1)
open(os.path.join(dest, "model.bin"), "w").write("weights of " + os.path.basename(src))
print(json.dumps({"converter": "fake", "options": opts}))
"""


def test_conversion_is_cached_by_digest_and_options_and_failures_leave_nothing(
        workspace: Workspace, tmp_path: Path) -> None:
    model = resolve_model("tiny-llama", workspace)
    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE_CONVERTER)
    py = Path(sys.executable)
    first = ensure_converted(tmp_path, "fake-1.0", py, worker, model, {}, "fake")
    assert not first.cached and (first.path / "model.bin").read_text() == "weights of tiny-llama"
    assert first.facts["model_digest"] == model.digest and first.facts["convert_s"] >= 0
    again = ensure_converted(tmp_path, "fake-1.0", py, worker, model, {}, "fake")
    assert again.cached and again.path == first.path
    assert conversion_dir(tmp_path, "fake-1.0", model, {"mode": "x"}) != first.path
    with pytest.raises(EngineRefused, match="fake: no loader for GPT2Config"):
        ensure_converted(tmp_path, "fake-1.0", py, worker, model, {"mode": "refuse"}, "fake")
    with pytest.raises(EngineFailed, match=r"converting tiny-llama failed \(exit 1\): KeyError: 'rope_type'") as e:
        ensure_converted(tmp_path, "fake-1.0", py, worker, model, {"mode": "crash"}, "fake")
    assert "Traceback" in e.value.log_tail and str(tmp_path) not in e.value.log_tail
    left = sorted(p.name for p in (tmp_path / "converted" / "fake-1.0").iterdir() if p.is_dir())
    assert left == [first.path.name], "a refused or failed conversion leaves no folder behind"


def test_records_name_folders_by_what_they_are_not_where_they_lie() -> None:
    from harness.engines.launch.converted import without_paths

    text = ('File "/x/venvs/ortgenai-0.18.0/lib/builder.py", line 3\n'
            'File "/x/venvs/ortgenai-0.18.0/lib/builder.py" in /x/models/tiny-gpt2')
    got = without_paths(text, {"/x/venvs": ".venvs", "/x/models/tiny-gpt2": "tiny-gpt2", "/": "root"})
    assert got == ('File ".venvs/ortgenai-0.18.0/lib/builder.py", line 3\n'
                   'File ".venvs/ortgenai-0.18.0/lib/builder.py" in tiny-gpt2')


def test_a_venv_built_from_another_recipe_is_stale(tmp_path: Path) -> None:
    from harness.engines.launch.venvs import VenvInfo
    from harness.engines.pip.venvs import PipEngine, stale_recipe

    engine = PipEngine("mistralrs", "0.9.5", (oracle("numpy"),), "print('0.9.5')")
    built = VenvInfo("0.9.5", tmp_path, tmp_path / "bin/python", 1.0, 1, "", {},
                     build={"requirements": ["mistralrs==0.9.5", *resolved((oracle("numpy"),))]})
    assert not stale_recipe(built, engine)
    before_numpy = VenvInfo("0.9.5", tmp_path, tmp_path / "bin/python", 1.0, 1, "", {},
                            build={"requirements": ["mistralrs==0.9.5"]})
    assert stale_recipe(before_numpy, engine), "a venv installed before numpy joined the recipe is rebuilt"
