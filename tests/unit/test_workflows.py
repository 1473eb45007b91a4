"""The CI workflows are linted by actionlint and say what the fleet needs: full history, the plan's
matrix, every shard's records merged with the verdict in the job summary."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.workspace import REPO_ROOT

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
CONFIG = REPO_ROOT / ".github" / "actionlint.yaml"


def actionlint() -> str:
    exe = Path(sys.executable).with_name("actionlint")
    found = str(exe) if exe.exists() else shutil.which("actionlint")
    if found is None:
        pytest.fail("actionlint is not installed: it is a dev dependency (pip install -e '.[dev]')",
                    pytrace=False)
    return found


def lint(*files: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck/pyflakes integrations off: their presence differs between machines, and the
    # workflows' own YAML, expressions, job graph and action inputs are what is checked here
    return subprocess.run([actionlint(), "-no-color", "-oneline", "-shellcheck=", "-pyflakes=",
                           "-config-file", str(CONFIG), *map(str, files)],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def test_actionlint_passes_on_the_workflows() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "gpu.yml"}
    r = lint(*files)
    assert r.returncode == 0, f"actionlint findings:\n{r.stdout}{r.stderr}"


def test_actionlint_fails_a_planted_bad_workflow(tmp_path: Path) -> None:
    bad = (WORKFLOWS / "gpu.yml").read_text()
    bad = bad.replace("needs: [plan, cpu, gpu]", "needs: [plan, cpu, gpu, nosuchjob]")
    bad = bad.replace("${{ matrix.shard }}", "${{ matrix.shard.oops( }}", 1)
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    planted = tmp_path / ".github" / "workflows" / "gpu.yml"
    planted.write_text(bad)
    r = lint(planted)
    assert r.returncode == 1, r.stdout
    assert "nosuchjob" in r.stdout and "gpu.yml" in r.stdout


def test_every_checkout_fetches_the_history_staleness_needs() -> None:
    for name in ("ci.yml", "gpu.yml"):
        wf = load(name)
        steps = [s for job in wf["jobs"].values() for s in job["steps"]]
        checkouts = [s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@")]
        assert checkouts, name
        assert all(s.get("with", {}).get("fetch-depth") == 0 for s in checkouts), name
        env = {**wf.get("env", {}), **{k: v for j in wf["jobs"].values() for k, v in j.get("env", {}).items()}}
        assert env.get("HARNESS_REQUIRE_HISTORY") == "1", name


def test_ci_runs_make_test_and_features_check() -> None:
    runs = [s.get("run", "") for s in load("ci.yml")["jobs"]["test"]["steps"]]
    assert "make test" in runs and "make features-check" in runs


def test_ci_puts_a_gate_verdict_in_the_job_summary() -> None:
    steps = load("ci.yml")["jobs"]["test"]["steps"]
    gate = next(i for i, s in enumerate(steps) if s.get("run", "").startswith("make gate "))
    show = next(i for i, s in enumerate(steps) if "harness show --markdown" in s.get("run", ""))
    assert show > gate and steps[gate].get("id") == "gate"
    assert steps[show]["run"].endswith('>> "$GITHUB_STEP_SUMMARY"') and "steps.gate.outcome" in steps[show]["if"]


def test_the_fleet_workflow_shards_from_the_plan_and_merges_every_shard() -> None:
    wf = load("gpu.yml")
    jobs = wf["jobs"]
    assert "--device cuda --shards" in jobs["plan"]["steps"][-1]["run"]
    for name, device in (("cpu", "cpu"), ("gpu", "cuda")):
        job = jobs[name]
        assert job["strategy"]["matrix"] == f"${{{{ fromJSON(needs.plan.outputs.{device}) }}}}"
        run = " ".join(s.get("run", "") for s in job["steps"])
        assert f"--harness-device {device}" in run and '--harness-shard "$SHARD"' in run
        assert f"make venv DEVICE={device}" in run
        upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
        assert upload["if"] == "always()" and "reports/records/" in upload["with"]["path"]
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    merge = jobs["merge"]
    assert set(merge["needs"]) == {"plan", "cpu", "gpu"} and merge["if"].startswith("always()")
    run = " ".join(s.get("run", "") for s in merge["steps"])
    assert 'harness merge --matrix fleet.toml --summary "$GITHUB_STEP_SUMMARY" shards/*' in run


def test_the_merge_job_installs_everything_the_merge_imports() -> None:
    """The merge job installs the harness without its engines; a new import in the merge's path
    (records, features, the CLI) must be added to MERGE_DEPS in gpu.yml."""
    deps = set(load("gpu.yml")["jobs"]["merge"]["env"]["MERGE_DEPS"].split())
    code = ("import sys; before = set(sys.modules)\n"
            "import harness.cli, harness.fleet.merge, harness.features, harness.staleness, harness.models\n"
            "import harness.features.site.build\n"
            "mods = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "print(' '.join(sorted(m for m in mods if m not in sys.stdlib_module_names"
            " and not m.startswith('_') and m != 'harness')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr
    imported = set(r.stdout.split())
    assert imported <= deps, f"the merge imports {sorted(imported - deps)}: add them to MERGE_DEPS in gpu.yml"


def test_both_workflows_publish_the_results_site() -> None:
    """The CI run (pull requests too) and the fleet's merge build the site and upload it; the fleet
    deploys it to GitHub Pages only on main, where the repository opts in."""
    ci = load("ci.yml")["jobs"]["test"]["steps"]
    merge = load("gpu.yml")["jobs"]["merge"]["steps"]
    for steps, build in ((ci, "make site"), (merge, "harness site --out reports/site")):
        at = next(i for i, s in enumerate(steps) if s.get("run", "").startswith(build))
        up = next(s for s in steps[at:] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
        assert up["with"]["name"] == "results-site" and up["with"]["path"] == "reports/site/"
    pages = load("gpu.yml")["jobs"]["pages"]
    assert pages["needs"] == ["merge"] and "vars.HARNESS_PAGES == 'true'" in pages["if"]
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}
