"""The pause phase over HTTP: an update with requests in flight, once per ``/pause`` mode of the
pinned server, and what each mode promises (``rl_pause``, one verdict per mode).

What the server returns per request (:func:`harness.engines.vllm.rl_http.pause_phase`): its tokens,
its finish reason, ``weight_versions`` (spans of output tokens and the weight version that sampled
them), when it got its first token and when its stream ended; per mode: the versions before and
after, when ``/pause`` was called, when it returned, when the update started and ended.

* ``abort``: every request in flight at the pause says so (finish reason ``abort``), is never
  returned as finished (``length`` / ``stop``, or all its tokens), and no token of it comes from the
  new version.
* ``wait``: every request in flight finishes (``length``, all its tokens) and every token comes from
  the old version: the server drained it before the update.
* ``keep``: every request in flight resumes after the update and finishes; its spans cover every
  token, the old version first (at least the tokens streamed before the pause), then the new one.

**The logprobs agree with the labels** (where the trainer scored the requests,
:func:`span_figures`): the tokens credited to the old version must match the old weights (mean
|Δ logprob| within the suite's ``mean_abs_delta`` bar), and the tokens credited to the new version
must sit closer to the new weights than to the old ones. A kept request's later tokens are computed
over KV its prompt and first tokens left under the old weights (``keep`` does not recompute it): how
far they sit from the new weights is reported (``new_version``), not gated.

A mode where no request was still in flight when ``/pause`` was called shows nothing and fails.
:func:`pause_controls` feeds the judge planted copies of what the run measured (an aborted request
reported as finished, a waited one credited to the new version, a kept one credited to the old
version throughout, a kept one dropped): each must fail, and the unchanged copy must judge as it did.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.api import Verdict
from harness.kinds.rl.judge import MAIN, metrics
from harness.records import Control

PAUSE = "rl_pause"
FINISHED = ("length", "stop")


def _spans(r: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    return [(str(s["version"]), int(s["start"]), int(s["end"])) for s in r.get("weight_versions") or ()]


def _by_version(r: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v, a, b in _spans(r):
        out[v] = out.get(v, 0) + (b - a)
    return out


def span_figures(
    ev: Mapping[str, Any], scores: Mapping[str, Mapping[str, Sequence[float]]]
) -> dict[str, Any]:
    """The rollout's logprobs against the trainer's, split by the version each token is credited to:
    ``old_version`` (against the weights before the update), ``new_version`` (after) and
    ``new_version_vs_old_weights``. ``scores``: request id -> {"old", "new"}: the trainer's logprob of
    every sampled token under each side's weights."""
    old, new = str(ev["version_before"]), str(ev["version"])
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {
        "old_version": ([], []),
        "new_version": ([], []),
        "new_version_vs_old_weights": ([], []),
    }
    for r in ev["requests"]:
        got = scores.get(str(r["id"]))
        lp = np.asarray(r.get("chosen_logprobs") or (), np.float64)
        if not got or not lp.size:
            continue
        for v, a, b in _spans(r):
            b = min(b, lp.size)
            if v == old:
                parts["old_version"][0].append(lp[a:b])
                parts["old_version"][1].append(np.asarray(got["old"], np.float64)[a:b])
            elif v == new:
                parts["new_version"][0].append(lp[a:b])
                parts["new_version"][1].append(np.asarray(got["new"], np.float64)[a:b])
                parts["new_version_vs_old_weights"][0].append(lp[a:b])
                parts["new_version_vs_old_weights"][1].append(np.asarray(got["old"], np.float64)[a:b])
    return {k: metrics(rs, ts) for k, (rs, ts) in parts.items() if rs}


def _against_weights(mode: str, fig: Mapping[str, Any], tol: float) -> str | None:
    """What the logprobs say against the version labels, or None."""
    o = fig.get("old_version") or {}
    if o.get("tokens") and float(o.get(MAIN, 0.0)) > tol:
        return (
            f"its tokens credited to the old version sit {o[MAIN]:.2e} nats (mean |Δ|) from the old "
            f"weights, over {tol:.0e}: another version sampled them"
        )
    n, w = fig.get("new_version") or {}, fig.get("new_version_vs_old_weights") or {}
    if n.get("tokens") and float(n.get(MAIN, 0.0)) >= float(w.get(MAIN, 0.0)):
        return (
            f"its tokens credited to the new version sit no closer to the new weights ({n[MAIN]:.2e}) "
            f"than to the old ({w[MAIN]:.2e})"
        )
    return None


def in_flight(ev: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The requests whose stream had not ended when ``/pause`` was called."""
    t = float(ev["pause_t"])
    return [r for r in ev["requests"] if r.get("end_t") is None or float(r["end_t"]) > t]


def _problem(mode: str, r: Mapping[str, Any], ev: Mapping[str, Any]) -> str | None:
    """What request ``r`` did against the mode's promise, or None."""
    n, most = len(r.get("token_ids") or ()), int(ev["max_tokens"])
    old, new = str(ev["version_before"]), str(ev["version"])
    fr = r.get("finish_reason")
    by = _by_version(r)
    spans = _spans(r)
    if r.get("error"):
        return f"its stream failed: {r['error'][:160]}"
    if mode == "abort":
        if fr in FINISHED or n >= most:
            return f"returned as finished ({fr!r}, {n}/{most} tokens) though the pause aborted it"
        if fr != "abort":
            return f"ended with finish reason {fr!r}, not 'abort'"
        if by.get(new):
            return f"{by[new]} of its tokens credited to the new version {new!r}"
        return None
    if fr not in FINISHED or n != most:
        return f"did not finish ({fr!r}, {n}/{most} tokens)"
    if not spans:
        return "the server did not say which version sampled its tokens"
    covered = sum(b - a for _, a, b in spans)
    contiguous = all(spans[i][2] == spans[i + 1][1] for i in range(len(spans) - 1)) and spans[0][1] == 0
    if covered != n or not contiguous:
        return f"its version spans cover {covered} of {n} tokens" + (
            "" if contiguous else ", not contiguously"
        )
    if mode == "wait":
        if set(by) != {old}:
            return f"tokens by version(s) {sorted(set(by) - {old})}, not all by the old version {old!r}"
        return None
    order = [v for v, _, _ in spans]
    if set(order) - {old, new}:
        return f"tokens by version(s) {sorted(set(order) - {old, new})}, neither {old!r} nor {new!r}"
    if not by.get(new):
        return f"no token credited to the new version {new!r}: not resumed on it"
    if order[0] != old or order[-1] != new or order.count(old) != 1 or order.count(new) != 1:
        return f"versions in the order {order}, not {old!r} then {new!r}"
    before = int(r.get("tokens_at_pause") or 0)
    if by.get(old, 0) < before:
        return f"{before} tokens streamed before the pause, only {by.get(old, 0)} credited to {old!r}"
    return None


def judge_pause(ev: Mapping[str, Any], scores: Mapping[str, Any] | None = None, tol: float = 1e-4) -> Verdict:
    """One mode's verdict (see the module's docstring); ``scores`` (see :func:`span_figures`) adds
    the check of the logprobs against the version labels, with ``tol`` on the old version's tokens."""
    mode = str(ev["mode"])
    case = f"pause-{mode}"
    flying = in_flight(ev)
    facts: dict[str, Any] = {
        "mode": mode,
        "versions": [ev.get("version_before"), ev.get("version"), ev.get("version_after")],
        "in_flight": len(flying),
        "requests": [
            {
                "id": r["id"],
                "tokens": len(r.get("token_ids") or ()),
                "tokens_at_pause": r.get("tokens_at_pause"),
                "finish_reason": r.get("finish_reason"),
                "weight_versions": r.get("weight_versions"),
                "end_t": r.get("end_t"),
            }
            for r in ev["requests"]
        ],
        "pause_t": ev.get("pause_t"),
        "paused_t": ev.get("paused_t"),
        "update_start_t": ev.get("update_start_t"),
        "update_end_t": ev.get("update_end_t"),
    }
    fig = span_figures(ev, scores) if scores else {}
    if fig:
        facts["figures"] = fig
    if str(ev.get("version_after")) != str(ev["version"]):
        why = f"the server reports version {ev.get('version_after')!r} after the update to {ev['version']!r}"
        return Verdict(case, PAUSE, "fail", f"rl_pause FAIL ({mode}): {why}", evidence=facts)
    if not flying:
        why = "no request was still in flight when /pause was called: the mode was not exercised"
        return Verdict(case, PAUSE, "fail", f"rl_pause FAIL ({mode}): {why}", evidence=facts)
    for r in flying:
        if (what := _problem(mode, r, ev)) is not None:
            return Verdict(
                case, PAUSE, "fail", f"rl_pause FAIL ({mode}): request {r['id']} {what}", evidence=facts
            )
    if fig and (what := _against_weights(mode, fig, tol)) is not None:
        return Verdict(case, PAUSE, "fail", f"rl_pause FAIL ({mode}): {what}", evidence=facts)
    n = len(flying)
    said = {
        "abort": f"{n} requests in flight aborted, each saying so, none returned as finished, no token "
        f"by the new version",
        "wait": f"{n} requests in flight finished before the update, every token by the old version "
        f"{ev['version_before']!r}",
        "keep": f"{n} requests in flight kept, resumed after the update and finished, their tokens credited "
        f"{ev['version_before']!r} then {ev['version']!r}",
    }.get(mode, f"{n} requests")
    if fig:
        said += "; " + ", ".join(f"{k} mean |Δ| {v[MAIN]:.2e} ({v['tokens']} tokens)" for k, v in fig.items())
    return Verdict(case, PAUSE, "pass", f"{mode}: {said}", evidence=facts)


def _planted(ev: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Planted copies of one mode's evidence, each breaking what the mode promises."""
    mode = str(ev["mode"])
    flying = {r["id"] for r in in_flight(ev)}
    if not flying:
        return []
    rid = next(r["id"] for r in ev["requests"] if r["id"] in flying)
    out: list[tuple[str, dict[str, Any]]] = []

    def plant(what: str, change: Any) -> None:
        e = copy.deepcopy(dict(ev))
        r = next(x for x in e["requests"] if x["id"] == rid)
        change(r, e)
        out.append((what, e))

    old, new, most = str(ev["version_before"]), str(ev["version"]), int(ev["max_tokens"])

    def finished(r: dict[str, Any], e: dict[str, Any]) -> None:
        r["finish_reason"] = "length"
        r["token_ids"] = list(r["token_ids"]) + [0] * (most - len(r["token_ids"]))

    def credit(version: str) -> Any:
        def go(r: dict[str, Any], e: dict[str, Any]) -> None:
            r["weight_versions"] = [{"version": version, "start": 0, "end": len(r["token_ids"])}]

        return go

    def aborted(r: dict[str, Any], e: dict[str, Any]) -> None:
        r["finish_reason"] = "abort"
        r["token_ids"] = list(r["token_ids"])[: max(1, len(r["token_ids"]) // 2)]

    if mode == "abort":
        plant("an aborted request reported as finished", finished)
        plant("an aborted request's tokens credited to the new version", credit(new))
    elif mode == "wait":
        plant("a waited request's tokens credited to the new version", credit(new))
        plant("a waited request aborted instead of drained", aborted)
    elif mode == "keep":
        plant("a kept request's tokens all credited to the old version", credit(old))
        plant("a kept request dropped instead of resumed", aborted)
    return out


def pause_controls(
    evs: Sequence[Mapping[str, Any]], scores: Mapping[str, Any] | None = None, tol: float = 1e-4
) -> list[Control]:
    """Each planted copy must fail; the unchanged evidence must judge as the run did. With the
    trainer's ``scores`` (mode -> request id -> {"old", "new"}), one more per mode: the trainer's
    scores under the weights before and after the update exchanged (every token credited to the
    other version's weights), which only the logprobs can tell."""
    out: list[Control] = []
    scores = scores or {}
    for ev in evs:
        sc = scores.get(str(ev["mode"]))
        real = judge_pause(ev, sc, tol)
        again = judge_pause(copy.deepcopy(dict(ev)), sc, tol)
        same = again.status == real.status
        out.append(
            Control(
                PAUSE,
                f"{ev['mode']}: unchanged evidence",
                real.status,
                again.status,
                same,
                again.summary[:300],
            )
        )  # type: ignore[arg-type]
        planted = [(what, e, sc) for what, e in _planted(ev)]
        if sc:
            swapped = {rid: {"old": x["new"], "new": x["old"]} for rid, x in sc.items()}
            planted.append(("the tokens credited to the other version's weights", dict(ev), swapped))
        for what, e, with_scores in planted:
            v = judge_pause(e, with_scores, tol)
            out.append(
                Control(PAUSE, f"{ev['mode']}: {what}", "fail", v.status, v.status == "fail", v.summary[:300])
            )  # type: ignore[arg-type]
    return out


def pause_plan(
    steps: Sequence[Mapping[str, Any]], modes: Sequence[str], max_tokens: int, folders: Sequence[str]
) -> list[dict[str, Any]]:
    """The pause phase after the last step: per mode, an update that moves the weights (the
    step before the last's and the last's in turn, so that every update changes them), versions
    after the steps', the last step's prompts and seeds, ``max_tokens`` each."""
    last = len(steps) - 1
    prev_step = last
    out = []
    for i, mode in enumerate(modes):
        to = last - 1 if i % 2 == 0 else last
        rolls = steps[last]["rollouts"]
        out.append(
            {
                "mode": mode,
                "version": str(len(steps) + i),
                "from_step": prev_step,
                "to_step": to,
                "max_tokens": max_tokens,
                "update": {"path": folders[to], "names": None},
                "rollouts": [
                    {
                        "id": f"p{i}-{mode}-{r['id'].rpartition('-')[2]}",
                        "prompt_ids": r["prompt_ids"],
                        "seed": int(r["seed"]) + 1000 * (i + 1),
                    }
                    for r in rolls
                ],
            }
        )
        prev_step = to
    return out
