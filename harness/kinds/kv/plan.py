"""Scheduler-side bookkeeping shared by the harness connectors: which pages to capture this step.

vLLM splits a connector in two: a scheduler-side half that sees requests, token ids and block ids,
and a worker-side half that sees the paged KV tensors. The scheduler half (this module) follows
every request across steps and plans, for each step, the pages the worker half must read:

* written pages: full prompt blocks whose last token the engine computes in this step;
* restored pages: the blocks a connector filled from its store for a request, read on the first
  step the request runs after the load (the same step for a synchronous load).

Requests carry the harness's tags in ``SamplingParams.extra_args["harness_kv"]``: the case id, the
lane (``clean`` or a planted fault), whether to capture and whether to leave the request alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.kv_pages.identity import blocks_completed, prefix_keys

TAGS_KEY = "harness_kv"
NULL_BLOCK_ID = 0
"""vLLM's null block (the block pool's first block, never a request's page): where a sliding-window
group has freed or never allocated a block outside the window, the request's block table holds it."""


@dataclass(frozen=True, slots=True)
class Tags:
    """What the harness said about one request (``SamplingParams.extra_args["harness_kv"]``)."""

    case: str = ""
    lane: str = "clean"
    capture: bool = True
    """False: the connector works as usual but records nothing (the record-off timing pass)."""
    passive: bool = False
    """True: the harness connector neither stores nor loads this request (reference requests)."""

    @classmethod
    def of(cls, sampling_params: Any) -> Tags:
        extra = getattr(sampling_params, "extra_args", None) or {}
        raw = extra.get(TAGS_KEY) if isinstance(extra, Mapping) else None
        if not isinstance(raw, Mapping):
            return cls()
        return cls(case=str(raw.get("case", "")), lane=str(raw.get("lane", "clean")),
                   capture=bool(raw.get("capture", True)), passive=bool(raw.get("passive", False)))

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "lane": self.lane, "capture": self.capture, "passive": self.passive}


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One KV-cache group of the engine, as the connectors see it."""

    index: int
    block_size: int
    layers: tuple[str, ...]
    kind: str
    """The spec class name, e.g. ``FullAttentionSpec``."""
    paged: bool
    """True for attention groups (pages of tokens); False for state groups (Mamba) with no pages."""
    window: int | None = None
    """Sliding-window groups (``SlidingWindowSpec``): the tokens vLLM keeps pages for behind the next
    token (the attention window, plus any blocks it retains for speculative decoding); None where
    every block is kept (full attention, or sliding-window layers with the hybrid allocator off)."""


def log_setup(log: Any, vllm_config: Any, groups: Sequence[GroupInfo], **facts: Any) -> None:
    """Write the engine's KV-cache groups and parallelism to the scheduler log (the comparator
    derives the expected pages from them)."""
    log.write("setup", groups=[{"index": g.index, "block_size": g.block_size, "layers": list(g.layers),
                                "kind": g.kind, "paged": g.paged, "window": g.window} for g in groups],
              tp=int(vllm_config.parallel_config.tensor_parallel_size), **facts)


def describe_groups(groups: Sequence[Mapping[str, Any]]) -> str:
    """A record's ``kv_cache_groups`` in a few words, kinds in the engine's group order:
    ``3 (sliding 64 x2, full x1; block 32)``."""
    if not groups:
        return ""
    kinds: dict[str, int] = {}
    for g in groups:
        name = f"sliding {g['window']}" if g.get("window") else (
            "full" if "Attention" in str(g.get("kind", "")) else str(g.get("kind", "?")))
        kinds[name] = kinds.get(name, 0) + 1
    blocks = "/".join(str(b) for b in sorted({int(g["block_size"]) for g in groups if g.get("block_size")}))
    parts = ", ".join(f"{k} x{n}" for k, n in kinds.items())
    return f"{len(groups)} ({parts}; block {blocks})" if blocks else f"{len(groups)} ({parts})"


def groups_of(kv_cache_config: Any) -> tuple[GroupInfo, ...]:
    from vllm.v1.kv_cache_interface import AttentionSpec

    out = []
    for i, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        # Only a sliding-window manager frees blocks; a FullAttentionSpec that carries a window (the
        # hybrid allocator turned off) keeps every block.
        window = None
        if "SlidingWindow" in type(spec).__name__:
            window = int(spec.sliding_window) + int(getattr(spec, "extra_retained_tokens", 0) or 0)
        out.append(GroupInfo(i, int(spec.block_size), tuple(g.layer_names), type(spec).__name__,
                             isinstance(spec, AttentionSpec), window))
    return tuple(out)


def attention_layers(groups: Sequence[GroupInfo]) -> tuple[str, ...]:
    """Every paged layer of every group, in model order (``model.layers.2`` before ``model.layers.10``):
    what a planted fault's layer index counts."""
    def natural(name: str) -> list[Any]:
        return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]

    return tuple(sorted((layer for g in groups if g.paged for layer in g.layers), key=natural))


def first_block_in_window(computed: int, window: int | None, block_size: int) -> int:
    """The first block a request still needs once ``computed`` tokens are in the cache.

    Full attention needs every block (0). A sliding-window group's next token attends to the
    ``window`` tokens ending at itself, so the first ``computed - window + 1`` tokens are outside
    it, and vLLM gives the whole blocks among them no page (the null block): a connector that
    serves ``computed`` tokens restores only the blocks from this one on.
    """
    if not window:
        return 0
    return max(0, computed - window + 1) // block_size


@dataclass(frozen=True, slots=True)
class PagePlan:
    """One page (one block of one group, every layer of that group) the worker must read."""

    key: str
    group: int
    block_id: int
    start: int
    end: int
    req: str
    case: str
    lane: str
    dup: bool = False
    """The same key was already planned: the worker records its digest but not its bytes again."""


@dataclass
class RequestState:
    req_id: str
    prompt: tuple[int, ...]
    tags: Tags
    block_ids: list[list[int]]
    done: int = 0
    """Tokens whose KV is in the paged buffer before the step being planned."""
    keys: dict[int, list[str]] = field(default_factory=dict)
    """Page keys per block size (computed once per request)."""

    def page_keys(self, block_size: int) -> list[str]:
        if block_size not in self.keys:
            self.keys[block_size] = prefix_keys(self.prompt, block_size)
        return self.keys[block_size]


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One request in one step: the KV of tokens ``[before, after)`` is computed in this step."""

    state: RequestState
    before: int
    after: int
    new: bool


class RequestTracker:
    """Follows requests across scheduler steps; one per scheduler-side connector."""

    def __init__(self, groups: Sequence[GroupInfo]) -> None:
        self.groups = tuple(groups)
        self.requests: dict[str, RequestState] = {}
        self.tags: dict[str, Tags] = {}
        self._written: set[tuple[str, int]] = set()

    def remember(self, request: Any) -> Tags:
        """Note a request's tags when the scheduler first shows it to the connector."""
        tags = Tags.of(getattr(request, "sampling_params", None))
        self.tags[request.request_id] = tags
        return tags

    def step(self, scheduler_output: Any) -> list[Scheduled]:
        """Update every scheduled request's state and say which tokens this step computes."""
        out = []
        n_sched: Mapping[str, int] = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            tags = self.tags.get(new.req_id) or Tags.of(new.sampling_params)
            st = RequestState(new.req_id, tuple(new.prompt_token_ids or ()), tags,
                              [list(b) for b in new.block_ids], int(new.num_computed_tokens))
            self.requests[new.req_id] = st
            n = int(n_sched.get(new.req_id, 0))
            out.append(Scheduled(st, st.done, st.done + n, True))
            st.done += n
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self.requests.get(req_id)
            if st is None:
                continue
            blocks = cached.new_block_ids[i]
            if blocks is not None:
                if req_id in cached.resumed_req_ids:
                    st.block_ids = [list(b) for b in blocks]
                else:
                    for g, b in enumerate(blocks):
                        st.block_ids[g].extend(b)
            st.done = int(cached.num_computed_tokens[i])
            n = int(n_sched.get(req_id, 0))
            out.append(Scheduled(st, st.done, st.done + n, req_id in cached.resumed_req_ids))
            st.done += n
        return out

    def written_pages(self, sched: Scheduled) -> list[PagePlan]:
        """Full prompt blocks the engine completes in this step, for every paged group."""
        st = sched.state
        out = []
        for g in self.groups:
            if not g.paged:
                continue
            keys = st.page_keys(g.block_size)
            for j in blocks_completed(sched.before, sched.after, len(st.prompt), g.block_size):
                if j >= len(st.block_ids[g.index]):
                    break
                if st.block_ids[g.index][j] == NULL_BLOCK_ID:
                    continue
                seen = (keys[j], g.index) in self._written
                self._written.add((keys[j], g.index))
                out.append(PagePlan(keys[j], g.index, st.block_ids[g.index][j], j * g.block_size,
                                    (j + 1) * g.block_size, st.req_id, st.tags.case, st.tags.lane,
                                    dup=seen))
        return out

    def pages_in_range(self, st: RequestState, start: int, end: int,
                       block_ids: Sequence[Sequence[int]] | None = None) -> list[PagePlan]:
        """The pages of tokens ``[start, end)`` (whole blocks) of a request, for every paged group."""
        ids = block_ids if block_ids is not None else st.block_ids
        out = []
        for g in self.groups:
            if not g.paged:
                continue
            keys = st.page_keys(g.block_size)
            for j in range(start // g.block_size, min(end // g.block_size, len(keys))):
                if j >= len(ids[g.index]):
                    break
                if ids[g.index][j] == NULL_BLOCK_ID:
                    continue  # outside a sliding window: the request has no page there
                out.append(PagePlan(keys[j], g.index, ids[g.index][j], j * g.block_size,
                                    (j + 1) * g.block_size, st.req_id, st.tags.case, st.tags.lane))
        return out

    def forget(self, req_ids: Iterable[str]) -> None:
        for r in req_ids:
            self.requests.pop(r, None)
            self.tags.pop(r, None)
