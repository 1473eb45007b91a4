"""The pause phase over HTTP: an update with requests in flight, once per ``/pause`` mode of the
pinned server, and what each mode promises (``rl_pause``, one verdict per mode).

What the server returns per request (:func:`harness.engines.vllm.rl_pause.pause_phase`): its tokens,
its finish reason, ``weight_versions`` (spans of output tokens and the weight version that sampled
them), when it got its first token and when its stream ended; per mode: the versions before and
after, when ``/pause`` was called, when it returned, when the update started and ended, and the
server's own counts (``/metrics``) before, at, during and after the pause.

**In flight is the engine's word, not the client's.** Under load the engine can finish a request
while the client has read a fraction of its tokens: judged by the client alone, a request the engine
had finished before ``/pause?mode=abort`` took effect reads as "aborted, yet returned as finished".
Where the server's counts are in the evidence (:func:`engine_facts`), they decide: in ``abort`` the
number of requests the server finished with reason ``abort``; in ``keep`` the number it held while
paused; a request the engine had finished before the pause must simply be finished, every token by
the old version. A mode that met no request in flight (:func:`unexercised`) is tried again with
twice the tokens (up to the context); if it never does, it fails as not exercised.

* ``abort``: every request in flight at the pause says so (finish reason ``abort``), is never
  returned as finished (``length`` / ``stop``, or all its tokens), and no token of it comes from the
  new version.
* ``wait``: every request in flight finishes (``length``, all its tokens) and every token comes from
  the old version: the server drained it before the update.
* ``keep``: every request in flight resumes after the update and finishes; its spans cover every
  token, the old version first (at least the tokens streamed before the pause), then the new one.

**The logprobs agree with the labels** (where the trainer scored the requests,
:func:`span_figures`): the tokens credited to the old version must match the old weights (mean
|Δ logprob| within the suite's ``mean_abs_delta`` bar) and sit closer to them than to the new ones,
and the tokens credited to the new version must sit closer to the new weights than to the old ones.
The comparison, not the bar alone, is what tells the versions apart where the bar is loose (the
bfloat16 lane's floor can exceed what one update moves). A kept request's later tokens are computed
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
    ``old_version`` (against the weights before the update), ``old_version_vs_new_weights``,
    ``new_version`` (after) and ``new_version_vs_old_weights``. ``scores``: request id -> {"old",
    "new"}: the trainer's logprob of every sampled token under each side's weights."""
    old, new = str(ev["version_before"]), str(ev["version"])
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {
        "old_version": ([], []),
        "old_version_vs_new_weights": ([], []),
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
                parts["old_version_vs_new_weights"][0].append(lp[a:b])
                parts["old_version_vs_new_weights"][1].append(np.asarray(got["new"], np.float64)[a:b])
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
    ow = fig.get("old_version_vs_new_weights") or {}
    if o.get("tokens") and ow.get("tokens") and float(o[MAIN]) >= float(ow[MAIN]):
        return (
            f"its tokens credited to the old version sit no closer to the old weights ({o[MAIN]:.2e}) "
            f"than to the new ({ow[MAIN]:.2e})"
        )
    n, w = fig.get("new_version") or {}, fig.get("new_version_vs_old_weights") or {}
    if n.get("tokens") and float(n.get(MAIN, 0.0)) >= float(w.get(MAIN, 0.0)):
        return (
            f"its tokens credited to the new version sit no closer to the new weights ({n[MAIN]:.2e}) "
            f"than to the old ({w[MAIN]:.2e})"
        )
    return None


def in_flight(ev: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The requests whose stream had not ended, as the client saw it, when ``/pause`` was called."""
    t = float(ev["pause_t"])
    return [r for r in ev["requests"] if r.get("end_t") is None or float(r["end_t"]) > t]


def engine_facts(ev: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the server counted over one mode (None for evidence recorded without its counts):
    ``finished`` (requests finished per reason, over the mode), ``running_at_pause`` (running and
    waiting just before ``/pause``, as the front end knew it), ``held_while_paused`` (running and
    waiting once the counts settled while paused)."""
    b, a = ev.get("engine_before"), ev.get("engine_after")
    if not b or not a:
        return None
    fin = {k: int(round(v - b["finished"].get(k, 0.0))) for k, v in a["finished"].items()}
    at, held = ev.get("engine_at_pause") or {}, ev.get("engine_paused") or {}
    return {
        "finished": {k: v for k, v in fin.items() if v},
        "running_at_pause": int(at.get("running", 0) + at.get("waiting", 0)),
        "held_while_paused": int(held.get("running", 0) + held.get("waiting", 0)),
    }


def unexercised(ev: Mapping[str, Any]) -> str | None:
    """Why one mode's attempt met no request in flight, or None: in ``abort`` the server aborted
    none; in ``keep`` it held none while paused; in ``wait`` (and without the server's counts) no
    stream was still open when ``/pause`` was called."""
    mode, n = str(ev["mode"]), len(ev["requests"])
    f = engine_facts(ev)
    if f is not None and mode == "abort" and not f["finished"].get("abort"):
        return f"the server aborted none of the {n} requests: it had finished them before the pause"
    if f is not None and mode == "keep" and not f["held_while_paused"]:
        return f"the server held none of the {n} requests while paused: it had finished them"
    if not in_flight(ev) or (f is not None and mode == "wait" and not f["running_at_pause"]):
        return "no request was still in flight when /pause was called"
    return None


def _engine_problem(mode: str, ev: Mapping[str, Any], f: Mapping[str, Any]) -> str | None:
    """Where the server's counts say which requests the pause met: what the requests did against
    them (each request is then held to its mode's promise, or to a finished one's)."""
    reqs = ev["requests"]
    late = [r for r in reqs if r.get("finish_reason") in FINISHED and r in in_flight(ev)]
    if mode == "abort":
        aborted = int(f["finished"].get("abort", 0))
        said = [r for r in reqs if r.get("finish_reason") == "abort"]
        if len(said) != aborted:
            who = late[0] if late else next((r for r in reqs if r not in said), reqs[0])
            n, most = len(who.get("token_ids") or ()), ev["max_tokens"]
            return (
                f"the server aborted {aborted} requests, {len(said)} came back saying so: request "
                f"{who['id']} returned as finished ({who.get('finish_reason')!r}, {n}/{most} tokens)"
            )
    if mode == "keep":
        new = str(ev["version"])
        resumed = [r for r in reqs if _by_version(r).get(new)]
        held = int(f["held_while_paused"])
        if len(resumed) < held:
            who = next((r for r in late if r not in resumed), next(r for r in reqs if r not in resumed))
            return (
                f"the server held {held} requests while paused, {len(resumed)} resumed on the new version: "
                f"request {who['id']} has every token credited to {ev['version_before']!r}"
            )
    if mode == "wait" and f["finished"].get("abort"):
        return f"the server aborted {f['finished']['abort']} requests: wait must drain them"
    return None


def met(ev: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The requests the pause met: by the server's word where its counts are in the evidence (abort:
    those that say ``abort``; keep: those with tokens by the new version), else by the client's."""
    f = engine_facts(ev)
    mode = str(ev["mode"])
    if f is not None and mode == "abort":
        return [r for r in ev["requests"] if r.get("finish_reason") == "abort"]
    if f is not None and mode == "keep":
        return [r for r in ev["requests"] if _by_version(r).get(str(ev["version"]))]
    return in_flight(ev)


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
    f = engine_facts(ev)
    flying = met(ev)
    facts: dict[str, Any] = {
        "mode": mode,
        "versions": [ev.get("version_before"), ev.get("version"), ev.get("version_after")],
        "in_flight": len(flying),
        "in_flight_by": "client" if f is None else "server",
        "server": f,
        "max_tokens": ev.get("max_tokens"),
        "paused_on": ev.get("paused_on"),
        "attempts": ev.get("attempts") or [],
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
    why = unexercised(ev)
    if why is None and not flying:
        why = "no request was in flight when /pause was called"
    if why is not None:
        tries = len(ev.get("attempts") or ()) + 1
        why += f" ({tries} attempt{'s' if tries > 1 else ''}, the last with {ev.get('max_tokens')} tokens)"
        return Verdict(case, PAUSE, "fail", f"rl_pause FAIL ({mode}): {why}: the mode was not exercised",
                       evidence=facts)  # fmt: skip
    if f is not None and (what := _engine_problem(mode, ev, f)) is not None:
        return Verdict(case, PAUSE, "fail", f"rl_pause FAIL ({mode}): {what}", evidence=facts)
    for r in ev["requests"]:
        # a request the pause did not meet (the engine had finished it) must simply have finished
        # on the old version; with only the client's view, such a request is not judged
        if r in flying:
            what = _problem(mode, r, ev)
        elif f is not None:
            what = _problem("wait", r, ev)
            what = what and f"(finished before the pause) {what}"
        else:
            what = None
        if what is not None:
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
    flying = {r["id"] for r in met(ev)}
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
    steps: Sequence[Mapping[str, Any]],
    modes: Sequence[str],
    max_tokens: int,
    folders: Sequence[str],
    max_len: int,
) -> dict[str, Any]:
    """The pause phase after the last step (:func:`harness.engines.vllm.rl_pause.pause_phase`): per
    mode the last step's prompts with fresh seeds; every update moves the engine between the step
    before the last and the last (it holds the last), so every update changes the weights; versions
    after the steps'; ``max_tokens`` each, doubled where a mode met no request in flight, up to what
    ``max_len`` leaves after the longest prompt."""
    last = len(steps) - 1
    rolls = steps[last]["rollouts"]
    longest = max(len(r["prompt_ids"]) for r in rolls)
    return {
        "weights": {str(last - 1): folders[last - 1], str(last): folders[last]},
        "at": last,
        "first_version": len(steps),
        "max_tokens": int(max_tokens),
        "max_tokens_cap": max(int(max_tokens), int(max_len) - longest),
        "modes": [
            {
                "mode": mode,
                "rollouts": [
                    {
                        "id": f"p{i}-{mode}-{r['id'].rpartition('-')[2]}",
                        "prompt_ids": r["prompt_ids"],
                        "seed": int(r["seed"]) + 1000 * (i + 1),
                    }
                    for r in rolls
                ],
            }
            for i, mode in enumerate(modes)
        ],
    }
