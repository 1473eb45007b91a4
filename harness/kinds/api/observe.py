"""Send probes to one endpoint, one at a time, and keep every exchange (the one HTTP client:
:class:`~harness.engines.openai.transport.Transport`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.abilities import Endpoint
from harness.engines.openai.options import OpenAIOptions
from harness.engines.openai.transport import Exchange, Transport
from harness.kinds.api.facets.base import FACET_HEADER, NEXT, Probe
from harness.kinds.api.facets.robustness import ordinary

TIMEOUT_S = 120.0


def transport(ep: Endpoint) -> Transport:
    return Transport(
        OpenAIOptions(
            ep.base_url,
            model=ep.model,
            key_env=ep.key_env,
            timeout_s=TIMEOUT_S,
            request_timeout_s=TIMEOUT_S,
            retries=0,
        )
    )


def body_for(ep: Endpoint, p: Probe) -> dict[str, Any] | bytes | None:
    if p.raw is not None:
        return p.raw
    if p.body is None:
        return None
    return {"model": ep.model, **dict(ep.body), **dict(p.body)}


def observe(
    ep: Endpoint, probes: Sequence[Probe], ordinary_text: str, progress: Callable[[str], None] | None = None
) -> dict[str, Exchange]:
    """Probe id -> exchange; a probe that may kill the server is followed by an ordinary request
    (``<id>#next``)."""
    http = transport(ep)
    out: dict[str, Exchange] = {}
    for p in probes:
        headers = {FACET_HEADER: p.facet}
        out[p.id] = http.exchange(
            p.path, body_for(ep, p), stream=p.stream, headers=headers, drop_after=p.drop_after
        )
        if p.then_ordinary:
            nxt = Probe(p.id + NEXT, p.facet, "/completions", ordinary(ordinary_text))
            out[nxt.id] = http.exchange(nxt.path, body_for(ep, nxt), headers=headers)
    if progress is not None:
        progress(f"{len(out)} requests to {ep.base_url}")
    return out


def exchange_json(ex: Exchange) -> Mapping[str, Any]:
    """What the record keeps of one exchange (streams as their events)."""
    return {
        "status": ex.status,
        "error": ex.error,
        "body": ex.body,
        "events": list(ex.events),
        "done": ex.done,
        "raw": ex.raw,
    }
