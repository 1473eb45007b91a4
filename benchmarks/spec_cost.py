"""What the speculative-decoding gate costs, and what speculation buys on this host, from one gate run.

    python benchmarks/spec_cost.py RECORD.json [RECORD.json ...] [--out reports/bench]
    python benchmarks/spec_cost.py --run MODEL [--suite spec] [--out reports/bench]

Each spec record (``make spec``) measured, in one run: the greedy pass of every case with and
without speculation (two engine starts with the same settings, the same prompts, the same token
count), and the seeded draws of the sampled tests. This turns those into ``harness.bench/1`` figures,
each beside its limit:

* ``spec.greedy_tokens_per_s.<model>``: tokens per second with speculation, beside the same pass
  without it (the ratio is the speed-up; goal: at least 1, speculation should not cost);
* ``spec.draws_per_s.<model>``: the draws per second of the sampled passes, beside the greedy pass's
  tokens per second without speculation (a draw is up to 5 tokens and one request);
* ``spec.wall_per_1000_judged_s.<model>``: seconds of drawing per 1,000 judged positions.

``--run`` runs the gate first (two engine starts; wrap it in the host's engine slot). The host load
is in the record's device facts: figures measured while the host is shared say so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.perf import Figure, Limit, bench_record, write_bench  # noqa: E402


def figures_of(rec: dict) -> list[Figure]:
    model = rec["model"]["name"]
    x = rec["extra"]["spec"]
    speed, acc = x["speed"], x["acceptance"].get("greedy", {})
    params = {
        "record": rec["id"],
        "suite": rec["suite"]["name"],
        "method": x["settings"]["speculative_config"],
        "acceptance_rate": acc.get("acceptance_rate"),
        "mean_accepted_length": acc.get("mean_accepted_length"),
        "emitted_tokens": acc.get("emitted_tokens"),
    }
    out = []
    without, with_ = speed.get("greedy_tokens_per_s_without"), speed.get("greedy_tokens_per_s_with")
    if without and with_:
        out.append(
            Figure(
                f"spec.greedy_tokens_per_s.{model}",
                with_,
                "tokens/s",
                Limit("the same greedy pass without speculation (same run)", without, "tokens/s"),
                goal=without,
                params=params,
            )
        )
    if speed.get("draws_per_s") and without:
        out.append(
            Figure(
                f"spec.draws_per_s.{model}",
                speed["draws_per_s"],
                "draws/s",
                Limit("greedy tokens/s without speculation (same run)", without, "tokens/s"),
                params={**params, "draws": x["draws"], "judged_draws": x["judged_draws"]},
            )
        )
    if speed.get("wall_per_1000_judged_s"):
        out.append(
            Figure(
                f"spec.wall_per_1000_judged_s.{model}",
                speed["wall_per_1000_judged_s"],
                "s",
                better="lower",
                params={**params, "judged_draws": x["judged_draws"]},
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="*", type=Path)
    ap.add_argument("--run", metavar="MODEL")
    ap.add_argument("--suite", default="spec")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    a = ap.parse_args(argv)
    recs = [json.loads(p.read_text()) for p in a.records]
    if a.run:
        from harness.pipeline import run_gate_by_name
        from harness.workspace import Workspace

        res = run_gate_by_name(Workspace.default(), a.run, a.suite, "vllm")
        recs.append(json.loads(res.path.read_text()))
    bad = [r.get("id") for r in recs if r.get("kind") != "spec"]
    if bad or not recs:
        ap.error(f"not spec records: {bad}" if bad else "give spec records or --run MODEL")
    figures = [f for r in recs for f in figures_of(r)]
    record = bench_record(
        figures, {r["id"]: {"summary": r["summary"], "timings": r["timings"]} for r in recs}, {}, ROOT
    )
    path = write_bench(Path(a.out), record)
    for f in figures:
        print(f.line())
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
