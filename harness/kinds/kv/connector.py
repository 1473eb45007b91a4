"""``HarnessKVConnector``: a vLLM v1 KV connector that stores pages in chunks and records every byte.

Loaded by vLLM from ``kv_transfer_config``::

    {"kv_connector": "HarnessKVConnector", "kv_connector_module_path": "harness.kinds.kv.connector",
     "kv_role": "kv_producer" | "kv_consumer",
     "kv_connector_extra_config": {"harness": {...}}}        (see harness.kinds.kv.config)

Producer (``kv_producer``): after each attention layer runs, every chunk of ``chunk_size`` prompt
tokens completed in this step is read from the paged buffer, digested on the cache's device,
written to the lane's :class:`~harness.kinds.kv.store.PageStore` (once per chunk key) and recorded as
``written`` pages in the capture.

Consumer (``kv_consumer``): a request is offered the longest run of stored whole chunks of its
prompt, leaving at least one token to compute. The chunks are loaded into the blocks vLLM allocated
before the forward; on entry to each attention layer (``wait_for_layer_load``) the loaded pages are
read back from the paged buffer and recorded as ``restored`` pages: the bytes the forward is about
to use. A page the store cannot serve is recorded as a named problem and reported to vLLM as a
failed block, never served silently.

A ``chunk_size`` that is not a multiple of every attention group's block size is refused at start
with the group and both sizes named (also written to the capture as ``refused``).

Several KV-cache groups (a model with sliding-window and full-attention layers under vLLM's hybrid
allocator): every chunk is stored with the pages of every group. On restore a sliding-window group
has no page for the blocks outside the window of the first token the engine computes (vLLM puts
its null block there); those are neither loaded nor recorded, and the comparator expects exactly
the in-window ones (:func:`harness.kinds.kv.plan.first_block_in_window`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from harness.kinds.kv.capture import PageTag
from harness.kinds.kv.capture_write import CaptureWriter, SchedulerLog, gather, record_planned, worker_rank
from harness.kinds.kv.config import UNREPORTED, HarnessKVConfig, chunk_size_problem
from harness.kinds.kv.faults.store import FaultyStore
from harness.kinds.kv.plan import GroupInfo, PagePlan, RequestTracker, attention_layers, groups_of, log_setup
from harness.kinds.kv.store import PageRead, PageStore
from harness.kv_pages.digest import as_page_bytes, page_digests
from harness.kv_pages.identity import PageRef, prefix_keys
from harness.kv_pages.layout import block_dims, check_ids, layer_tensor, page_shape

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass(frozen=True, slots=True)
class ChunkIO:
    """One chunk to store or load in this step: its key, lane, and the pages of every group."""

    key: str
    lane: str
    index: int
    """Chunk number in the prompt: tokens ``[index*C, (index+1)*C)``."""
    pages: tuple[PagePlan, ...]
    capture: bool


@dataclass
class HarnessStepMeta(KVConnectorMetadata):
    """Scheduler -> worker for one step."""

    step: int = 0
    stores: list[ChunkIO] = field(default_factory=list)
    loads: list[ChunkIO] = field(default_factory=list)


def refuse(cfg: HarnessKVConfig, reason: str) -> ValueError:
    """Record the refusal where the harness will look (vLLM may swallow the exception text)."""
    SchedulerLog(cfg.capture_dir).write("refused", reason=reason)
    return ValueError(f"HarnessKVConnector refused: {reason}")


def _group_layers(groups: tuple[GroupInfo, ...]) -> dict[str, GroupInfo]:
    return {layer: g for g in groups if g.paged for layer in g.layers}


class HarnessKVConnector(KVConnectorBase_V1, getattr(_base, "SupportsHMA", object)):  # type: ignore[misc]
    """Declares hybrid-memory-allocator support where the release has the marker: without it vLLM
    turns the hybrid KV-cache manager off for the whole engine and a sliding-window model runs with
    one KV-cache group, so the round trip would never see the groups it must compare."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.cfg = HarnessKVConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        self.groups = groups_of(kv_cache_config)
        self.layer_group = _group_layers(self.groups)
        if (why := chunk_size_problem(self.cfg.chunk_size, self.groups)) is not None:
            raise refuse(self.cfg, why)
        if not self.cfg.lanes:
            raise refuse(self.cfg, "no store lanes configured (kv_connector_extra_config.harness.lanes)")
        self.chunk = self.cfg.chunk_size
        # vLLM maps failed block ids back to requests only where block ids are unique, i.e. with one
        # KV-cache group; with several its scheduler raises on any reported block, and its other
        # path (failed_recving) covers asynchronous loads only. There a page the store cannot serve
        # is recorded as a problem and not reported, and the setup line says so.
        self.report_failed_blocks = len(self.groups) <= 1
        self.is_producer = bool(self._kv_transfer_config.is_kv_producer)
        self.is_consumer = bool(self._kv_transfer_config.is_kv_consumer)
        self.paged_layers = tuple(self.layer_group)
        self.stores = {name: self._open_store(name, root, fault)
                       for name, (root, fault) in self.cfg.lanes.items()}
        if self.is_producer and role == KVConnectorRole.SCHEDULER:
            for root, _ in self.cfg.lanes.values():
                root.mkdir(parents=True, exist_ok=True)
        if role == KVConnectorRole.SCHEDULER:
            self.tracker = RequestTracker(self.groups)
            self.log = SchedulerLog(self.cfg.capture_dir)
            log_setup(self.log, vllm_config, self.groups, mode="store", chunk_size=self.chunk,
                      role=self._kv_transfer_config.kv_role,
                      failed_loads="reported" if self.report_failed_blocks else UNREPORTED)
            self._matched: dict[str, tuple[int, int]] = {}
            self._pending: dict[str, tuple[int, int, tuple[list[int], ...]]] = {}
            self._planned: set[str] = set()
            self._step = 0
        else:
            self.capture = CaptureWriter(self.cfg.capture_dir, worker_rank())
            self.kv_caches: dict[str, torch.Tensor] = {}
            self.block_dim = block_dims(kv_cache_config)
            self._load_errors: set[int] = set()
            self._failed: set[tuple[str, int, int]] = set()
            self.store_seconds = 0.0

    def _open_store(self, lane: str, root: Any, fault: Any) -> PageStore | FaultyStore:
        store = PageStore(root)
        if fault is None:
            return store
        layers = attention_layers(self.groups)
        if not 0 <= fault.layer < len(layers):
            raise refuse(self.cfg, f"lane {lane!r}: planted fault names layer index {fault.layer}, "
                                   f"the model has {len(layers)} attention layers")
        return FaultyStore(store, fault.kind, layers[fault.layer], fault.page, fault.offset,
                           report=self.cfg.capture_dir / f"planted-{lane}.json")

    # ------------------------------------------------------------------ scheduler side

    def _chunk_keys(self, prompt: list[int]) -> list[str]:
        return prefix_keys(prompt, self.chunk)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        tags = self.tracker.remember(request)
        if tags.passive or not self.is_consumer:
            self._matched[request.request_id] = (num_computed_tokens, 0)
            return 0, False
        prompt = list(request.prompt_token_ids or [])
        store = self.stores.get(tags.lane)
        hit = 0
        if store is None or not store.root.is_dir():
            # Not a miss: the store itself is gone. Every page this request expected is an error.
            where = store.root if store is not None else f"(no store configured for lane {tags.lane!r})"
            self.log.write("store_problem", req=request.request_id, case=tags.case, lane=tags.lane,
                           kind="unreadable", reason=f"store folder {where} does not exist")
        else:
            # Leave at least the last prompt token to the engine: it must compute one position.
            for key in prefix_keys(prompt[:max(len(prompt) - 1, 0)], self.chunk):
                if not store.has(key, self.paged_layers):
                    break
                hit += self.chunk
        self._matched[request.request_id] = (num_computed_tokens, hit)
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        local, hit = self._matched.get(request.request_id, (0, 0))
        tags = self.tracker.tags.get(request.request_id) or self.tracker.remember(request)
        self.log.write("request", req=request.request_id, case=tags.case, lane=tags.lane,
                       prompt_len=len(request.prompt_token_ids or ()), local_hit=local,
                       matched=max(0, hit - local), external=num_external_tokens, **{"async": False})
        if num_external_tokens > 0:
            self._pending[request.request_id] = (local, local + num_external_tokens,
                                                 blocks.get_block_ids())

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self._step += 1
        meta = HarnessStepMeta(step=self._step)
        for s in self.tracker.step(scheduler_output):
            st, tags = s.state, s.state.tags
            if tags.passive:
                continue
            if (pend := self._pending.pop(st.req_id, None)) is not None:
                start, end, ids = pend
                for j in range(start // self.chunk, end // self.chunk):
                    lo, hi = max(start, j * self.chunk), (j + 1) * self.chunk
                    pages = self.tracker.pages_in_range(st, lo, hi, ids)
                    key = st.page_keys(self.chunk)[j]
                    meta.loads.append(ChunkIO(key, tags.lane, j, tuple(pages), tags.capture))
            if not self.is_producer:
                continue
            keys = st.page_keys(self.chunk)
            n = len(st.prompt)
            for j in range(s.before // self.chunk, min(s.after, n) // self.chunk):
                key = keys[j]
                if key in self._planned or self.stores[tags.lane].has(key, self.paged_layers):
                    self.log.write("store", key=key, lane=tags.lane, req=st.req_id, case=tags.case,
                                   start=j * self.chunk, end=(j + 1) * self.chunk, dedup=True)
                    continue
                self._planned.add(key)
                pages = self.tracker.pages_in_range(st, j * self.chunk, (j + 1) * self.chunk)
                meta.stores.append(ChunkIO(key, tags.lane, j, tuple(pages), tags.capture))
                self.log.write("store", key=key, lane=tags.lane, req=st.req_id, case=tags.case,
                               start=j * self.chunk, end=(j + 1) * self.chunk, dedup=False)
        self.tracker.forget(scheduler_output.finished_req_ids)
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.tracker.forget([request.request_id])
        self._matched.pop(request.request_id, None)
        self._pending.pop(request.request_id, None)
        return False, None

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """The hybrid allocator's form of :meth:`request_finished` (stores are synchronous: nothing
        holds the blocks past the step)."""
        return self.request_finished(request, [])

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.kv_caches = dict(kv_caches)

    def _cache(self, layer: str, forward_context: Any = None) -> torch.Tensor | None:
        kv = self.kv_caches.get(layer)
        if kv is None and forward_context is not None:
            mod = forward_context.no_compile_layers.get(layer)
            kv = getattr(mod, "kv_cache", None)
        return layer_tensor(kv)

    def _meta(self) -> HarnessStepMeta:
        meta = self._get_connector_metadata()
        assert isinstance(meta, HarnessStepMeta)
        return meta

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._meta()
        if not meta.loads:
            return
        for layer, g in self.layer_group.items():
            kv = self._cache(layer, forward_context)
            if kv is None:
                continue
            per_chunk = self.chunk // g.block_size
            ids: list[int] = []
            blobs: list[bytes] = []
            for load in meta.loads:
                pages = [p for p in load.pages if p.group == g.index]
                if not pages:
                    continue
                reads = self.stores[load.lane].get(load.key, layer, per_chunk)
                for p in pages:
                    read = reads[(p.start - load.index * self.chunk) // g.block_size]
                    if read.data is not None:
                        ids.append(p.block_id)
                        blobs.append(read.data)
                    else:
                        self._fail(p, layer, read)
            if ids:
                dim = self.block_dim(layer, kv)
                check_ids(kv, ids, dim, where=f"layer {layer}")
                src = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
                src = src.view(kv.dtype).view(len(ids), *page_shape(kv, dim)).to(kv.device)
                kv.index_copy_(dim, torch.tensor(ids, device=kv.device), src.movedim(0, dim))

    def _fail(self, p: PagePlan, layer: str, read: PageRead) -> None:
        ref = PageRef(p.key, layer, p.group, p.start, p.end, worker_rank())
        self.capture.error("restored", ref, PageTag(p.req, p.case, p.lane), read.problem or "missing",
                           read.reason)
        if self.report_failed_blocks:
            self._load_errors.add(p.block_id)
        self._failed.add((layer, p.group, p.block_id))

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._meta()
        g = self.layer_group.get(layer_name)
        if g is None or not meta.loads:
            return
        pages = [p for load in meta.loads if load.capture for p in load.pages
                 if p.group == g.index and (layer_name, g.index, p.block_id) not in self._failed]
        kv = self._cache(layer_name)
        if pages and kv is not None:
            record_planned(self.capture, "restored", layer_name, kv, pages, meta.step,
                           block_dim=self.block_dim(layer_name, kv))

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        meta = self._meta()
        g = self.layer_group.get(layer_name)
        if g is None or not meta.stores:
            return
        rank = worker_rank()
        for io in meta.stores:
            pages = [p for p in io.pages if p.group == g.index]
            if not pages:
                continue
            t0 = time.perf_counter()
            dim = self.block_dim(layer_name, kv_layer)
            data = gather(kv_layer, [p.block_id for p in pages], dim)
            digests = page_digests(data)
            host = as_page_bytes(data).cpu().numpy()
            try:
                self.stores[io.lane].put(io.key, layer_name, host, digests, {
                    "start": io.index * self.chunk, "end": (io.index + 1) * self.chunk,
                    "group": g.index, "block_size": g.block_size, "dtype": str(kv_layer.dtype),
                    "page_shape": page_shape(kv_layer, dim)})
            except OSError as e:
                # the chunk is not stored (the store published nothing of it): a later lookup misses
                # and the engine computes it; the engine lives on, the capture names the failure
                for p in pages:
                    self.capture.error("written", PageRef(p.key, layer_name, p.group, p.start, p.end, rank),
                                       PageTag(p.req, p.case, p.lane), "store_failed",
                                       f"{type(e).__name__}: {e}")
            self.store_seconds += time.perf_counter() - t0
            if io.capture:
                refs = [PageRef(p.key, layer_name, p.group, p.start, p.end, rank) for p in pages]
                tags = [PageTag(p.req, p.case, p.lane) for p in pages]
                self.capture.pages("written", refs, tags, data, digests=digests, step=meta.step)

    def wait_for_save(self) -> None:
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        self._failed.clear()
        return out

    def shutdown(self) -> None:
        if self.role == KVConnectorRole.WORKER:
            self.capture.close()

