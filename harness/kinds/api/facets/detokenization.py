"""Detokenization: the text a server returns is its tokenizer's decode of the token ids it returns,
under the request's ``skip_special_tokens`` / ``spaces_between_special_tokens``. One request forces
special tokens into the output (``allowed_token_ids``, a vLLM field) so that skipping them is seen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from harness.api import Verdict
from harness.kinds.api.facets.base import FACETS, Context, Observed, Probe, completion, seen, verdict

FAST_NOTE = (
    "spaces_between_special_tokens changes nothing for a fast (Rust) tokenizer, which has no "
    "such setting: the reference decode is the same either way"
)


def held_back(decoded: str, text: str, finish: str | None) -> bool:
    """A generation cut by ``max_tokens`` inside a multi-byte character: the server may hold back the
    replacement characters its last bytes decode to (vLLM's incremental detokenizer does)."""
    tail = decoded[len(text) :]
    return finish == "length" and decoded.startswith(text) and bool(tail) and set(tail) == {"\ufffd"}


@dataclass(frozen=True, slots=True)
class Detokenization:
    key: ClassVar[str] = "detokenization"
    title: ClassVar[str] = "Detokenization: text equals the tokenizer's decode of the returned ids"
    rule: ClassVar[str] = (
        "the returned text equals the tokenizer's decode of the returned token ids "
        "under skip_special_tokens / spaces_between_special_tokens (a partial character "
        "left by max_tokens may be held back)"
    )

    def probes(self, ctx: Context) -> list[Probe]:
        mt = ctx.settings.max_tokens
        out: list[Probe] = []
        for cid, text in ctx.texts.items():
            for skip in (True, False):
                out.append(
                    Probe(
                        f"detokenization/{cid}/skip-{str(skip).lower()}",
                        self.key,
                        "/completions",
                        completion(text, mt, skip_special_tokens=skip),
                        meta={"skip": skip},
                    )
                )
        first = next(iter(ctx.texts.values()))
        base = next(iter(ctx.base.values()), None)
        normal = [t for t in (base.token_ids or ())[:3]] if base is not None else []
        allowed = sorted(set(ctx.reference.special_ids()) | set(normal))
        for skip in (True, False):
            for spaces in (True, False):
                body = completion(
                    first,
                    mt,
                    allowed_token_ids=allowed,
                    ignore_eos=True,
                    skip_special_tokens=skip,
                    spaces_between_special_tokens=spaces,
                )
                out.append(
                    Probe(
                        f"detokenization/special/skip-{str(skip).lower()}-spaces-{str(spaces).lower()}",
                        self.key,
                        "/completions",
                        body,
                        meta={"skip": skip, "spaces": spaces},
                    )
                )
        return out

    def judge(
        self, ctx: Context, probes: Sequence[Probe], oracle: Observed, candidate: Observed
    ) -> list[Verdict]:
        out = []
        for p in probes:
            c = seen(candidate, p.id)
            if not c.ok:
                out.append(verdict(self.key, p.id, False, f"no answer: {c.error}"))
                continue
            if c.token_ids is None:
                out.append(
                    verdict(self.key, p.id, "skip", "the server returns no token ids: nothing to decode")
                )
                continue
            want = ctx.reference.decode(c.token_ids, skip_special_tokens=bool(p.meta["skip"]))
            text = c.text or ""
            held = held_back(want, text, c.finish)
            ok = want == text or held
            words = (
                f"text is the decode of its {len(c.token_ids)} ids"
                if want == text
                else f"text is the decode of its {len(c.token_ids)} ids, less the partial character "
                f"the last token left ({want[len(text) :]!r}: held back, as a stream must)"
                if held
                else f"text {c.text!r} != decode {want!r} of ids {list(c.token_ids)}"
            )
            specials = sorted(set(c.token_ids) & set(ctx.reference.special_ids()))
            out.append(
                verdict(
                    self.key,
                    p.id,
                    ok,
                    words,
                    special_ids=specials,
                    **({"note": FAST_NOTE} if "spaces" in p.meta else {}),
                )
            )
        return out


FACETS.register(Detokenization.key, help=Detokenization.title)(Detokenization())
