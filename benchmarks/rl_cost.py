"""What an ``rl`` run costs, read from its record (a benchmark, not a timed test).

    python benchmarks/rl_cost.py reports/records/<model>/rl/<record>.json [--out reports/bench]

Prints the run's wall split into engine start, transfers (``start_weight_update`` ..
``finish_weight_update``, summed over the updates), rollouts, the evidence (vLLM's checksums and the
harness's tap on the engine's weights), the trainer writing each step's weights and scoring, and each
transfer's time beside a memcpy of the same bytes in the engine's process. With ``--out``, also
writes those figures as a bench record (:mod:`harness.perf`), citing the run's record; the timings are
the run's own (on a shared host they say so through the record's device facts, not here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.perf import Figure, Limit, bench_record, write_bench
from harness.records import load_record

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("--out", type=Path, help="also write the figures as a bench record in this folder")
    a = ap.parse_args(argv)
    rec = load_record(a.record)
    t = rec.timings
    rl = rec.extra.get("rl", {})
    rows = [
        ("engine start", "engine_start", t.get("engine_engine_start_s")),
        ("transfers (all updates)", "transfers", t.get("engine_update_s")),
        ("rollouts", "rollouts", t.get("engine_rollout_s")),
        ("evidence: checksums + weight tap", "evidence", t.get("engine_tap_s")),
        ("MoE route taps", "route_taps", t.get("engine_routes_s")),
        ("trainer: writing every step", "trainer_write", t.get("trainer_write_s")),
        ("trainer: scoring", "scoring", t.get("trainer_score_s")),
        ("engine session wall (start + all steps)", "engine_session", t.get("engine_session_s")),
    ]
    print(f"{rec.model['name']} / {rec.suite['name']} / {rec.candidate.name} ({rec.id})")
    params = {"model": rec.model["name"], "suite": rec.suite["name"], "candidate": rec.candidate.name,
              "record": rec.id, "steps": len(rl.get("steps", []))}
    figures = []
    for name, key, v in rows:
        if v is not None:
            print(f"  {name:<42} {float(v):8.2f} s")
            part = {**params, "part": name}
            figures.append(Figure(f"rl.{key}", float(v), "s", better="lower", params=part))
    for s in rl.get("steps", []):
        got = sum(int(x.get("bytes", 0)) for x in s.get("received") or [])
        if s.get("update_s") is not None:
            mc = s.get("memcpy_s")
            print(
                f"  step {s['step']} ({s['kind']}): transfer {s['update_s']:.3f} s for {got / 2**20:.1f} MiB"
                + (f"; memcpy of the same bytes {mc * 1e3:.2f} ms ({s['update_s'] / mc:.0f}x)" if mc else "")
            )
            figures.append(
                Figure(
                    f"rl.transfer_step{s['step']}",
                    float(s["update_s"]),
                    "s",
                    Limit("memcpy of the same bytes", float(mc), "s") if mc else None,
                    better="lower",
                    params={**params, "kind": s["kind"], "bytes": got},
                )
            )
    if a.out is not None:
        print(write_bench(a.out, bench_record(figures, {"rl_cost": params}, {}, ROOT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
