"""What an ``rl`` run costs, read from its record (a benchmark, not a timed test).

    python benchmarks/rl_cost.py reports/records/<model>/rl/<record>.json

Prints the run's wall split into engine start, transfers (``start_weight_update`` ..
``finish_weight_update``, summed over the updates), rollouts, the evidence (vLLM's checksums and the
harness's tap on the engine's weights), the trainer writing each step's weights and scoring, and each
transfer's time beside a memcpy of the same bytes in the engine's process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.records import load_record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path)
    a = ap.parse_args(argv)
    rec = load_record(a.record)
    t = rec.timings
    rl = rec.extra.get("rl", {})
    rows = [
        ("engine start", t.get("engine_engine_start_s")),
        ("transfers (all updates)", t.get("engine_update_s")),
        ("rollouts", t.get("engine_rollout_s")),
        ("evidence: checksums + weight tap", t.get("engine_tap_s")),
        ("MoE route taps", t.get("engine_routes_s")),
        ("trainer: writing every step", t.get("trainer_write_s")),
        ("trainer: scoring", t.get("trainer_score_s")),
        ("engine session wall (start + all steps)", t.get("engine_session_s")),
    ]
    print(f"{rec.model['name']} / {rec.suite['name']} / {rec.candidate.name} ({rec.id})")
    for name, v in rows:
        if v is not None:
            print(f"  {name:<42} {float(v):8.2f} s")
    for s in rl.get("steps", []):
        got = sum(int(x.get("bytes", 0)) for x in s.get("received") or [])
        if s.get("update_s") is not None:
            mc = s.get("memcpy_s")
            print(
                f"  step {s['step']} ({s['kind']}): transfer {s['update_s']:.3f} s for {got / 2**20:.1f} MiB"
                + (f"; memcpy of the same bytes {mc * 1e3:.2f} ms ({s['update_s'] / mc:.0f}x)" if mc else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
