"""The planted proof of harness localize, as a sweep (harness/commands/localize_sweep.py): one copy of the
model per (sub-block, layer, size) with that sub-block's output projection perturbed, gated with each
engine and localized. Writes ordinary records; prints one line per point and a JSON summary.

    python benchmarks/localize_sweep.py --model tiny-llama --engines hf,vllm \
        --layers 0,1 --subs mlp,attn --relatives 1e-2,1e-1,1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.commands.localize_sweep import sweep  # noqa: E402
from harness.workspace import Workspace  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--engines", default="hf")
    ap.add_argument("--layers", default="0,1")
    ap.add_argument("--subs", default="mlp,attn")
    ap.add_argument("--relatives", default="1e-2,1e-1,1")
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--json", type=Path, default=None, help="also write the points here")
    a = ap.parse_args()
    points = sweep(Workspace.default(), a.model, a.engines.split(","), [int(x) for x in a.layers.split(",")],
                   a.subs.split(","), [float(x) for x in a.relatives.split(",")], a.suite,
                   progress=lambda s: print(s, flush=True))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps([p.to_json() for p in points], indent=1) + "\n")
    bad = [p for p in points if p.ok is False]
    print(f"{len(points)} points: {sum(p.ok is True for p in points)} localized, {len(bad)} mislocalized, "
          f"{sum(p.ok is None for p in points)} without divergence")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
