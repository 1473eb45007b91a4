"""Stop conditions: a stop string spanning two tokens (left out and kept), ``stop_token_ids``,
``min_tokens`` and ``max_tokens``: the text ends exactly where the oracle's ends, with the same
finish reason. The stop string and tokens are cut from the oracle's own greedy continuation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import (
    FACETS,
    Context,
    Observed,
    Probe,
    completion,
    same_generation,
    seen,
    verdict,
)
from harness.kinds.api.reference import Reference
from harness.kinds.api.views import View


def boundary_stop(ref: Reference, base: View) -> tuple[str, int] | None:
    """A two-character string of the continuation that spans a token boundary and first occurs there:
    (the string, where it starts in the text)."""
    if not base.ok or base.token_ids is None or not base.text:
        return None
    text, ids = base.text, base.token_ids
    for k in range(1, len(ids) - 1):
        head = ref.decode(ids[:k], skip_special_tokens=True)
        b = len(head)
        if "\ufffd" in head or not text.startswith(head) or b < 1 or b + 1 > len(text):
            continue
        s = text[b - 1 : b + 1]
        if s.isprintable() and s.strip() == s and "\ufffd" not in s and text.find(s) == b - 1:
            return s, b - 1
    return None


@dataclass(frozen=True, slots=True)
class Stop:
    key: ClassVar[str] = "stop"
    title: ClassVar[str] = "Stop strings, stop_token_ids, min_tokens, max_tokens end where the oracle's end"
    rule: ClassVar[str] = (
        "with a stop string spanning two tokens (include_stop_str_in_output both ways), "
        "stop_token_ids, min_tokens and max_tokens the text ends exactly where the "
        "oracle's ends, with the same finish_reason"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        mt = ctx.settings.max_tokens
        out: list[Probe] = []
        for cid, text in ctx.texts.items():
            base = ctx.base.get(cid)
            found = boundary_stop(ctx.reference, base) if base is not None else None
            if found is not None:
                s, at = found
                assert base is not None and base.text is not None
                out.append(
                    Probe(
                        f"stop/{cid}/string",
                        self.key,
                        "/completions",
                        completion(text, mt, stop=[s]),
                        meta={"stop": s, "expect": base.text[:at]},
                    )
                )
                out.append(
                    Probe(
                        f"stop/{cid}/string-kept",
                        self.key,
                        "/completions",
                        completion(text, mt, stop=[s], include_stop_str_in_output=True),
                        meta={"stop": s, "expect": base.text[: at + 2]},
                    )
                )
            ids = base.token_ids if base is not None and base.ok else None
            if ids and len(ids) > 3:
                t = next((ids[i] for i in range(2, len(ids)) if ids[i] not in ids[:i]), None)
                if t is not None:
                    out.append(
                        Probe(
                            f"stop/{cid}/token",
                            self.key,
                            "/completions",
                            completion(text, mt, stop_token_ids=[t]),
                        )
                    )
                    out.append(
                        Probe(
                            f"stop/{cid}/min-tokens",
                            self.key,
                            "/completions",
                            completion(text, mt, stop_token_ids=[ids[1]], min_tokens=3),
                        )
                    )
            out.append(Probe(f"stop/{cid}/max-tokens", self.key, "/completions", completion(text, 3)))
        return out

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        out = []
        for p in probes:
            o, c = seen(oracle, p.id), seen(candidate, p.id)
            ok, words = same_generation(o, c)
            expect = p.meta.get("expect")
            facts = {
                "stop": p.meta.get("stop"),
                "oracle_text": o.text,
                "candidate_text": c.text,
                "finish": c.finish,
            }
            if ok:
                words = f"ends where the oracle's ends ({len(c.text or '')} chars, finish {c.finish})"
                if expect is not None and (c.text or "") != expect:
                    words += f"; both differ from the cut the oracle's own continuation implies ({expect!r})"
            out.append(verdict(self.key, p.id, ok, words, **facts))
        return out


FACETS.register(Stop.key, help=Stop.title)(Stop())
