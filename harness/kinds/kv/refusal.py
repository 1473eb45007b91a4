"""The refusal probe's verdicts: the connector started with a chunk size off the block grid must
refuse at start, naming the KV-cache group and both sizes (``kv_config`` says what the engine did,
``kv_refusal`` is gated), and the planted controls that prove ``kv_refusal`` can fail."""

from __future__ import annotations

import re
from dataclasses import replace

from harness.api import Verdict
from harness.kinds.kv.passes import Phase
from harness.kinds.kv.settings import KVSettings
from harness.records import Control


def refusal_controls(ph: Phase, kv: KVSettings) -> list[Control]:
    """``kv_refusal``'s controls: an engine that starts with the off-grid chunk size, and a refusal
    that does not name the KV-cache group, must both fail it."""
    planted = [("the engine starts with the off-grid chunk size", replace(ph, ok=True, reason=""))]
    if ph.capture is not None and ph.capture.refusal:
        vague = re.sub(r"\bgroup \d+", "a group", ph.capture.refusal)
        planted.append(("the refusal does not name the group",
                        replace(ph, ok=False, capture=replace(ph.capture, refusal=vague))))
    out = []
    for name, phase in planted:
        got = next(v.status for v in refusal_verdicts(phase, kv) if v.comparator == "kv_refusal")
        out.append(Control("kv_refusal", name, "fail", got, got == "fail"))
    return out


def refusal_verdicts(ph: Phase, kv: KVSettings) -> list[Verdict]:
    """``kv_config``: the engine's answer, as a verdict (``refused`` when it refused).
    ``kv_refusal`` (gated): it had to refuse, and the refusal must name the group and both sizes."""
    cid = f"chunk_size={kv.refuse_chunk_size}"
    reason = (ph.capture.refusal if ph.capture is not None else None) or ""
    need = [f"group {0}", f"chunk_size {kv.refuse_chunk_size}", f"block size {kv.block_size}"]
    if ph.ok:
        return [Verdict(cid, "kv_config", "pass", "the engine started", evidence={"started": True}),
                Verdict(cid, "kv_refusal", "fail",
                        f"kv_refusal FAIL: chunk_size {kv.refuse_chunk_size} was accepted",
                        detail=f"{cid}: the connector started with a chunk size that is not a multiple "
                               f"of the block size {kv.block_size}; it must refuse at start")]
    if ph.skipped:
        return [Verdict(cid, c, "skip", f"skip: {ph.reason.splitlines()[0][:140]}", detail=ph.reason)
                for c in ("kv_config", "kv_refusal")]
    if not reason:
        return [Verdict(cid, "kv_config", "error", f"error: {ph.reason.splitlines()[0][:140]}",
                        detail=f"{ph.reason}\n--- engine log tail ---\n{ph.tail()}"),
                Verdict(cid, "kv_refusal", "fail", "kv_refusal FAIL: the engine failed without a refusal",
                        detail=f"{cid}: expected a refusal naming the KV-cache group and both sizes; "
                               f"the engine failed otherwise:\n{ph.reason}")]
    missing = [n for n in need if n not in reason]
    first = reason.splitlines()[0]
    verdicts = [Verdict(cid, "kv_config", "refused", f"refused: {first[:160]}", detail=reason,
                        evidence={"reason": reason})]
    if missing:
        verdicts.append(Verdict(cid, "kv_refusal", "fail",
                                f"kv_refusal FAIL: refusal does not name {missing}",
                                detail=f"{cid}: refused, but the reason must name {need}:\n  {reason}",
                                evidence={"reason": reason, "missing": missing}))
    else:
        verdicts.append(Verdict(cid, "kv_refusal", "pass",
                                f"kv_refusal pass: refused at start: {first[:140]}",
                                evidence={"reason": reason}))
    return verdicts
