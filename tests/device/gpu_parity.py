"""The GPU paths, on a machine with CUDA and no vLLM: transformers on CUDA gated against the
committed vLLM goldens (fp32 and bf16, smoke and long_horizon), and the numbers the issue text
asks for (NMSE of CUDA vs the CPU oracle over logprobs).

    python tests/device/gpu_parity.py OUT_DIR

Self-contained (needs torch with CUDA, transformers, safetensors, tokenizers, numpy); not collected
by pytest. Writes ordinary records under reports/records/ of this tree and a summary JSON into
OUT_DIR; never records goldens (there is no oracle here).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.pipeline import run_gate_by_name  # noqa: E402
from harness.workspace import Workspace  # noqa: E402

RUNS = [
    ("smoke", "hf:device=cuda"),
    ("smoke", "hf:device=cuda,dtype=bfloat16"),
    ("long_horizon", "hf:device=cuda"),
    ("long_horizon", "hf:device=cuda,dtype=bfloat16"),
]


def main(out: Path) -> int:
    import torch

    ws = Workspace.default()
    summary: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "runs": []}
    for suite, cand in RUNS:
        t0 = time.perf_counter()
        try:
            res = run_gate_by_name(ws, "tiny-llama", suite, cand, auto_record=False,
                           speed="the pinned vLLM is not installed on the GPU runner")
            rec = res.record
            summary["runs"].append({
                "suite": suite, "candidate": cand, "outcome": rec.outcome, "summary": rec.summary,
                "record": str(res.path.relative_to(ws.root)), "wall_s": time.perf_counter() - t0,
                "extra_keys": sorted(rec.extra), "distribution": rec.extra.get("distribution"),
                "verdicts": [(v.case_id, v.comparator, v.status, v.summary) for v in rec.verdicts],
                "controls_ok": all(c.ok for c in rec.controls),
            })
        except Exception:  # noqa: BLE001 - keep going, report everything
            summary["runs"].append({"suite": suite, "candidate": cand,
                                    "exception": traceback.format_exc()[-3000:]})
        print(json.dumps(summary["runs"][-1], default=str)[:2000], flush=True)
    (out / "gpu_parity.json").write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
