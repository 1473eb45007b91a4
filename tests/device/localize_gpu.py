"""transformers on CUDA against the CPU oracle's per-layer tensors: where float32 and bfloat16 on the
GPU part from the pinned vLLM on CPU, for the five committed tiny models.

Two steps, on two machines:

    # 1. on the CPU host (needs the pinned vLLM): the oracle's tensors of every smoke case of the
    #    five tiny models (or those named) into .cache/oracle-tensors/ (one engine start per model;
    #    skipped where cached)
    .venv/bin/python tests/device/localize_gpu.py --prepare [MODEL ...]

    # 2. on the GPU machine (no vLLM), with .cache/oracle-tensors carried along; some models only
    #    (those whose oracle tensors were carried), or all five:
    python3 tests/device/localize_gpu.py OUT_DIR [MODEL ...]

Step 2 captures ``hf:device=cuda`` and ``hf:device=cuda,dtype=bfloat16`` on the same sequences
(every smoke case's prompt and golden tokens), writes the NMSE of every tensor against the
oracle's (pooled over the cases, and the worst case) into ``OUT_DIR/localize_gpu.json`` with one
PNG of the profiles (``OUT_DIR/localize_gpu.png``), then gates each configuration on the smoke suite
and localizes every strict divergence, writing ordinary records (parity and localize) into
reports/records/ of this tree and a copy of them into ``OUT_DIR/records.tar``. Not collected by
pytest; never starts vLLM on the GPU machine (a missing cache entry is reported, not captured).
"""

from __future__ import annotations

import json
import sys
import tarfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from harness.commands.localize import localize  # noqa: E402
from harness.compare.nmse import nmse_rows  # noqa: E402
from harness.engines import make_runner  # noqa: E402
from harness.excerpt import LOG, NOTE, clip, tail  # noqa: E402
from harness.goldens import golden_dir, read_golden  # noqa: E402
from harness.kinds.localize.kind import divergences  # noqa: E402
from harness.kinds.localize.oracle import cache_path, golden_sequence, oracle_tensors, read_cached  # noqa: E402
from harness.models import resolve_model  # noqa: E402
from harness.pipeline import run_gate_by_name  # noqa: E402
from harness.workspace import Workspace  # noqa: E402

MODELS = ("tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-gpt2", "tiny-qwen3-moe")
SUITE = "smoke"
CONFIGS = ("hf:device=cuda", "hf:device=cuda,dtype=bfloat16")


def _golden(ws: Workspace, name: str):  # type: ignore[no-untyped-def]
    model = resolve_model(name, ws)
    return model, read_golden(golden_dir(ws.goldens, model, SUITE), model_name=name, suite_name=SUITE)


def prepare(ws: Workspace, models: tuple[str, ...] = MODELS) -> int:
    for name in models:
        model, golden = _golden(ws, name)
        t = oracle_tensors(ws, model, golden, [c.id for c in golden.cases])
        print(f"{name}: {len(t.tensors)} cases ({', '.join(sorted(set(t.source.values())))}) in "
              f"{t.seconds:.0f} s", flush=True)
    return 0


def profile_rows(ws: Workspace, name: str, spec: str) -> dict:
    """NMSE of every tensor of ``spec`` against the cached oracle's, over every smoke case."""
    model, golden = _golden(ws, name)
    seqs = {c.id: golden_sequence(golden, c.id) for c in golden.cases}
    oracle = {}
    for cid, ids in seqs.items():
        hit = read_cached(cache_path(ws, model, ids))
        if hit is None:
            return {"model": name, "spec": spec, "error": f"no cached oracle tensors for {cid}: run --prepare "
                                                          "on the CPU host and carry .cache/oracle-tensors"}
        oracle[cid] = hit[0]
    runner = make_runner(spec, model)
    runner.start()
    t0 = time.perf_counter()
    cand = runner.capture_layers(seqs)  # type: ignore[attr-defined]
    seconds = time.perf_counter() - t0
    runner.close()
    names = list(next(iter(oracle.values())))
    rows = []
    for n in names:
        num = den = 0.0
        worst = 0.0
        for cid in seqs:
            a = oracle[cid][n].astype(np.float64)
            b = cand[cid][n].astype(np.float64)
            num += float(((b - a) ** 2).sum())
            den += float((a**2).sum())
            worst = max(worst, nmse_rows(a, b)[0])
        rows.append({"name": n, "nmse": num / den if den else 0.0, "worst_case": worst})
    return {"model": name, "spec": spec, "tensors": rows, "capture_s": seconds,
            "positions": sum(len(s) for s in seqs.values())}


def plot(profiles: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(p["model"] for p in profiles))
    fig, axes = plt.subplots(len(models), 1, figsize=(9, 2.6 * len(models)), dpi=100, squeeze=False)
    for ax, m in zip(axes[:, 0], models, strict=True):
        for i, p in enumerate(x for x in profiles if x["model"] == m and "tensors" in x):
            ys = [max(r["nmse"], 1e-18) for r in p["tensors"]]
            ax.plot(range(len(ys)), ys, marker=".", color=f"C{i}", label=p["spec"])
            ax.set_xticks(range(len(ys)))
            ax.set_xticklabels([r["name"] for r in p["tensors"]], rotation=90, fontsize=6)
        ax.axhline(5e-4, color="grey", linestyle="--", linewidth=0.8)
        ax.axhline(1e-8, color="grey", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_title(f"{m}: NMSE vs the CPU oracle (pinned vLLM), every smoke case", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(out: Path, models: tuple[str, ...] = MODELS) -> int:
    import torch

    ws = Workspace.default()
    out.mkdir(parents=True, exist_ok=True)
    before = {p for p in ws.records.rglob("*") if p.is_file()}
    summary: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                     "allow_tf32": torch.backends.cuda.matmul.allow_tf32, "profiles": [], "gates": []}
    for name in models:
        for spec in CONFIGS:
            try:
                summary["profiles"].append(profile_rows(ws, name, spec))
            except Exception:  # noqa: BLE001 - keep going, report everything
                summary["profiles"].append({"model": name, "spec": spec, "error": tail(traceback.format_exc(), LOG)})
            print(clip(json.dumps(summary["profiles"][-1]), NOTE), flush=True)
            try:
                g = run_gate_by_name(ws, name, SUITE, spec, auto_record=False,
                             speed="the pinned vLLM is not installed on the GPU runner")
                row = {"model": name, "spec": spec, "gate": g.record.outcome, "summary": g.record.summary}
                if divergences(g.record):
                    loc = localize(ws, g.record, str(g.path.relative_to(ws.root)))
                    row.update(localize=loc.record.outcome, lines=[v.summary for v in loc.record.verdicts])
                summary["gates"].append(row)
            except Exception:  # noqa: BLE001
                summary["gates"].append({"model": name, "spec": spec, "exception": tail(traceback.format_exc(), LOG)})
            print(clip(json.dumps(summary["gates"][-1]), LOG), flush=True)
    (out / "localize_gpu.json").write_text(json.dumps(summary, indent=1, default=str))
    plot(summary["profiles"], out / "localize_gpu.png")
    new = sorted({p for p in ws.records.rglob("*") if p.is_file()} - before)
    with tarfile.open(out / "records.tar", "w") as tar:
        for p in new:
            tar.add(p, arcname=str(p.relative_to(ws.root)))
    print(f"{len(new)} record files -> {out / 'records.tar'}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        sys.exit(prepare(Workspace.default(), tuple(sys.argv[2:]) or MODELS))
    sys.exit(main(Path(sys.argv[1]), tuple(sys.argv[2:]) or MODELS))
