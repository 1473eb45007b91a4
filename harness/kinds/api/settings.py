"""The suite's ``[api]`` table, validated with the one TOML validator."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from harness.suites import Suite, SuiteError
from harness.tomlcheck import Where, check_keys, need_int, need_list, need_number, need_str, need_table

KEYS = (
    "facets",
    "max_tokens",
    "stream_texts",
    "tool_call_parser",
    "sampled_top_k",
    "sampled_top_p",
    "sampled_seed",
)


@dataclass(frozen=True, slots=True)
class ApiSettings:
    facets: tuple[str, ...]
    """The facets to judge, in order (robustness last: a request may kill the server)."""
    max_tokens: int = 12
    """Tokens each plain generation asks for."""
    stream_texts: tuple[str, ...] = ()
    """Strings whose characters span several byte tokens (CJK, emoji, accents): forced through a
    ``choice`` constraint so the streamed deltas must carry them."""
    tool_call_parser: str = "hermes"
    """The pinned server's ``--tool-call-parser`` (it needs one for any ``tool_choice``)."""
    sampled_top_k: int = 3
    sampled_top_p: float = 0.9
    sampled_seed: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "facets": list(self.facets),
            "max_tokens": self.max_tokens,
            "stream_texts": list(self.stream_texts),
            "tool_call_parser": self.tool_call_parser,
            "sampled_top_k": self.sampled_top_k,
            "sampled_top_p": self.sampled_top_p,
            "sampled_seed": self.sampled_seed,
        }


def api_settings(suite: Suite, known: Collection[str]) -> ApiSettings:
    """The suite's ``[api]`` table; ``known``: the registered facet names (the facets registry sits
    above this module: its facets read these settings)."""
    top = Where(suite.path, error=SuiteError)
    raw: Mapping[str, Any] = need_table(dict(suite.extra), "api", top)
    w = top / "api"
    check_keys(raw, w, KEYS)
    facets = tuple(need_list(raw, "facets", w, of=str))
    for f in facets:
        if f not in known:
            raise (w / "facets").fail(f"unknown facet {f!r}; facets: {', '.join(known)}")
    if "robustness" in facets and facets[-1] != "robustness":
        raise (w / "facets").fail("put 'robustness' last: its requests may kill the server")
    return ApiSettings(
        facets=facets,
        max_tokens=need_int(raw, "max_tokens", w, 12, lo=2),
        stream_texts=tuple(need_list(raw, "stream_texts", w, [], of=str, nonempty=False)),
        tool_call_parser=need_str(raw, "tool_call_parser", w, "hermes"),
        sampled_top_k=need_int(raw, "sampled_top_k", w, 3, lo=1),
        sampled_top_p=need_number(raw, "sampled_top_p", w, 0.9, lo=0.0, hi=1.0, lo_open=True),
        sampled_seed=need_int(raw, "sampled_seed", w, 1, lo=0),
    )
