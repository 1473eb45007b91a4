"""The oracle's side of the sampling gate: the pinned vLLM's greedy continuation of each case and
its raw logits at the positions the tests read, teacher-forced.

One engine start (:class:`~harness.engines.vllm.runner.VLLMRunner` with ``full_raw``): every case is
generated greedily for the suite's ``max_tokens``, then prompt + that continuation is scored by
prefill (``prompt_logprobs``, the harness's engine-core hook writing whole rows): row t holds the
raw logits predicting greedy token t from prompt + greedy[:t]. Raw logits, not logprobs, because a
repetition penalty divides a positive logit and multiplies a negative one. No goldens: like the A/B
gate's arm A the oracle runs beside the candidates (``make sampling`` runs it once for all of
them); the record keeps its version, settings and a digest of the rows it judged against.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.api import EngineFailed, EngineRefused, Sampling
from harness.engines.vllm.runner import VLLMRunner
from harness.kinds.sampling.draws import OracleRows
from harness.kinds.sampling.plan import rows_needed
from harness.kinds.sampling.settings import GateSettings
from harness.models import ModelRef
from harness.oracle import ORACLE, oracle_available
from harness.pin import oracle_pin
from harness.suites import Suite, SuiteError
from harness.workspace import Workspace


class OracleError(RuntimeError):
    """The oracle could not establish the reference (not installed, refused, crashed)."""


def oracle_rows(
    ws: Workspace, model: ModelRef, suite: Suite, gs: GateSettings
) -> tuple[list[OracleRows], dict[str, Any]]:
    """(per case: greedy tokens and the raw logit rows the tests need, the record's ``oracle``)."""
    pin = oracle_pin()
    if (why := oracle_available()) is not None:
        raise OracleError(f"the sampling gate's oracle ({pin.spec}) cannot run: {why}")
    cases = suite.build_cases(model.encode, model.limits)
    ws.runs.mkdir(parents=True, exist_ok=True)
    runner = VLLMRunner(model, {}, name=ORACLE, run_dir=ws.runs, full_raw=True)
    sampling = Sampling(max_tokens=suite.sampling.max_tokens, logprobs=1, full_vocab=True)
    t0 = time.perf_counter()
    try:
        outs, scores = runner.run_and_score(cases, sampling, None, 1)
    except (EngineRefused, EngineFailed) as e:
        tail = e.log_tail if isinstance(e, EngineFailed) else ""
        raise OracleError(
            f"the oracle ({pin.spec}) could not run {model.name}/{suite.name}: {e}"
            + (f"\n--- engine log tail ---\n{tail}" if tail else "")
        ) from None
    info = runner.info()
    if info.version != pin.version:
        raise OracleError(
            f"the installed vLLM is {info.version} but the oracle pin is {pin.spec}: "
            f"run `make venv` to install the pin"
        )
    by_out = {o.case_id: o for o in outs}
    by_score = {s.case_id: s for s in scores}
    bad = [
        c.id
        for c in cases
        if by_out.get(c.id) is None
        or by_out[c.id].error
        or by_score.get(c.id) is None
        or by_score[c.id].full_logprobs is None
    ]
    if bad:
        why = next((o.error for o in (by_out.get(b) or by_score.get(b) for b in bad) if o and o.error), "")
        raise OracleError(f"the oracle returned no whole rows for {', '.join(bad)} {why}".strip())
    greedy = {c.id: by_out[c.id].token_ids for c in cases}
    need = rows_needed(cases, greedy, gs)
    if not any(need.values()):
        raise SuiteError(
            f"{suite.path} [sampling_gate]: no case has a position t with len(prompt) + t = 1 "
            f"(mod align {gs.align}) inside its greedy continuation: raise [sampling] "
            f"max_tokens ({suite.sampling.max_tokens}) or lower align"
        )
    rows, digest = [], hashlib.sha256()
    for c in cases:
        full = by_score[c.id].full_logprobs
        assert full is not None
        got = {t: np.array(full[t], np.float32) for t in need[c.id]}
        for t in need[c.id]:
            digest.update(got[t].tobytes())
        rows.append(OracleRows(c, greedy[c.id], got))
    facts = runner.facts()
    provenance = {
        "spec": pin.engine,
        "engine": info.engine,
        "version": info.version,
        "pin": pin.spec,
        "settings": dict(info.settings),
        "device": dict(facts.device),
        "rows": "raw logits, teacher-forced on prompt + greedy continuation (engine-core hook)",
        "rows_sha256": digest.hexdigest(),
        "positions": {k: v for k, v in need.items()},
        "timings": {**dict(facts.timings), "oracle_wall_s": time.perf_counter() - t0},
    }
    return rows, provenance


def cases_of(rows: Sequence[OracleRows]) -> list[str]:
    return [r.case.id for r in rows]
