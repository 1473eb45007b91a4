"""`pytest --harness-matrix FILE`: one pytest item, one JUnit case, one record per entry; expected
failures are strict xfails; a runner without the GPUs an entry needs fails it by name; -n 2
(pytest-xdist) gives the same cases."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.unit.fleet_kit import fleet_workspace, pytest_matrix

GROUPS = """
[devices.cuda]
shards = 1
workers = "0"

[[group]]
name = "good"
models = ["tiny-llama"]
suites = ["smoke"]
candidates = ["{good}"]

[[group]]
name = "known-finding"
models = ["tiny-llama"]
suites = ["smoke"]
candidates = ["{bad}"]
expect = "fail"
because = "planted: c03 leaves the oracle's top-k"

[[group]]
name = "wrongly-expected"
models = ["tiny-llama"]
suites = ["smoke"]
candidates = ["{good} {workload}"]
expect = "fail"
because = "planted: this one passes"

[[group]]
name = "needs-a-gpu"
device = "cuda"
gpu_memory_gib = 80
models = ["tiny-llama"]
suites = ["smoke"]
candidates = ["{good} --gpu"]
"""


def cases(junit: Path) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in ET.parse(junit).getroot().iter("testcase")}


def test_every_entry_is_one_item_one_junit_case_and_one_record(tmp_path: Path) -> None:
    ws = fleet_workspace(tmp_path / "ws", GROUPS)
    junit = tmp_path / "junit.xml"
    r = pytest_matrix(ws.root, "--harness-device", "all", f"--junitxml={junit}")
    out = r.stdout
    assert r.returncode == 1, out[-3000:]
    assert "2 failed, 1 passed, 1 xfailed" in out, out[-3000:]
    assert "harness matrix fleet.toml: 4 of 4 entries" in out

    got = cases(junit)
    assert len(got) == 4 and all(n.startswith(("cpu/tiny-llama/smoke/cmd:", "cuda/")) for n in got)
    by_group = {g: next(c for n, c in got.items() if m in n) for g, m in (
        ("good", "good.json ok"), ("bad", "bad.json ok"), ("xpass", "{workload}"), ("gpu", "--gpu"))}
    props = {p.get("name"): p.get("value") for p in by_group["good"].iter("property")}
    assert props["outcome"] == "pass" and props["record"].startswith("reports/records/tiny-llama/smoke/")
    assert (ws.root / props["record"]).is_file()
    assert by_group["bad"].find("skipped") is not None  # junit writes an xfail as skipped
    assert "expected fail: planted: c03 leaves" in (by_group["bad"].find("skipped").get("message") or "")
    assert "XPASS(strict)" in (by_group["xpass"].find("failure").get("message") or "")
    gpu = by_group["gpu"].find("failure")
    assert gpu is not None and "needs 1 GPU(s) with >= 80 GiB each; this runner has" in (gpu.text or "")

    lines = [json.loads(x) for f in (ws.root / "reports" / "fleet").glob("results-*.jsonl")
             for x in f.read_text().splitlines()]
    assert sorted(x["outcome"] for x in lines) == ["fail", "pass", "pass"]  # the GPU entry never ran
    assert all((ws.root / x["record"]).is_file() for x in lines)


def test_xdist_gives_one_case_per_entry_and_this_machine_only_runs_its_device(tmp_path: Path) -> None:
    ws = fleet_workspace(tmp_path / "ws", GROUPS.replace('expect = "fail"\nbecause = "planted: this one '
                                                         'passes"', ""))
    junit = tmp_path / "junit.xml"
    r = pytest_matrix(ws.root, "-n", "2", f"--junitxml={junit}")  # --harness-device auto: cpu here
    assert r.returncode == 0, r.stdout[-3000:]
    assert "2 passed, 1 xfailed" in r.stdout, r.stdout[-3000:]
    got = cases(junit)
    assert len(got) == 3 and all(n.startswith("cpu/") for n in got)
    workers = {json.loads(x)["worker"] for f in (ws.root / "reports" / "fleet").glob("results-*.jsonl")
               for x in f.read_text().splitlines()}
    assert workers <= {"gw0", "gw1"} and workers


def test_a_shard_runs_only_its_entries(tmp_path: Path) -> None:
    ws = fleet_workspace(tmp_path / "ws", GROUPS)
    r1 = pytest_matrix(ws.root, "--harness-device", "cpu", "--harness-shard", "1/2", "--collect-only", "-q")
    r2 = pytest_matrix(ws.root, "--harness-device", "cpu", "--harness-shard", "2/2", "--collect-only", "-q")
    ids = [{line for line in r.stdout.splitlines() if line.startswith("fleet.toml::")} for r in (r1, r2)]
    assert all(ids) and not ids[0] & ids[1] and len(ids[0] | ids[1]) == 3, (r1.stdout, r2.stdout)
    bad = pytest_matrix(ws.root, "--harness-device", "cpu", "--harness-shard", "1/3", "--collect-only")
    assert bad.returncode != 0 and "into 2 shard(s), not 3" in bad.stdout
