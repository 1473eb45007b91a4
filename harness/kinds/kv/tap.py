"""``HarnessTapConnector``: wraps a third-party KV connector and records the pages it moves.

A vendor proves their connector without changing it: vLLM loads the tap, the tap builds the vendor's
connector (``kv_connector_extra_config["harness"]["tap"]`` names its module and class) with the same
config, and forwards every call to it. Around the calls that touch the paged buffer it records:

* ``written``: after the vendor's ``save_kv_layer``, every full prompt block the engine completed
  in this step (what the engine offered the connector to save);
* ``restored``: after the vendor's ``wait_for_layer_load``, every block the vendor claimed for the
  request (``num_external_tokens`` in ``update_state_after_alloc``), as it sits in the buffer just
  before the attention layer reads it.

Which tokens the vendor claimed is recorded per request from the engine's own calls. Methods of
the v1 connector API the tap does not need to see are forwarded as they are (the list is taken
from vLLM's base class, so new API methods are forwarded too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from harness.kinds.kv.capture_write import CaptureWriter, SchedulerLog, record_planned, worker_rank
from harness.kinds.kv.config import HARNESS_KEY, ConnectorSpec, HarnessKVConfig, load_connector_class
from harness.kinds.kv.plan import PagePlan, RequestTracker, attention_layers, groups_of, log_setup
from harness.kv_pages.layout import block_dims, layer_tensor

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass
class TapStepMeta(KVConnectorMetadata):
    """The vendor's metadata for this step, plus the pages the tap must read."""

    inner: KVConnectorMetadata | None
    step: int = 0
    write: list[PagePlan] = field(default_factory=list)
    restore: list[PagePlan] = field(default_factory=list)


def _inner_spec(extra: Any) -> ConnectorSpec:
    t = ((extra or {}).get(HARNESS_KEY) or {}).get("tap") or {}
    return ConnectorSpec(str(t.get("module", "")), str(t.get("class", "")))


class HarnessTapConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.cfg = HarnessKVConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        if self.cfg.tap is None:
            raise ValueError("HarnessTapConnector needs kv_connector_extra_config.harness.tap "
                             "{module, class}: the connector to wrap")
        try:
            inner_cls = load_connector_class(self.cfg.tap)
        except ValueError as e:
            SchedulerLog(self.cfg.capture_dir).write("refused", reason=str(e))
            raise
        self.inner = inner_cls(vllm_config, role, kv_cache_config)
        self.groups = groups_of(kv_cache_config)
        self.layer_group = {layer: g for g in self.groups if g.paged for layer in g.layers}
        if role == KVConnectorRole.SCHEDULER:
            self.tracker = RequestTracker(self.groups)
            self.log = SchedulerLog(self.cfg.capture_dir)
            log_setup(self.log, vllm_config, self.groups, mode="tap", connector=self.cfg.tap.text,
                      role=self._kv_transfer_config.kv_role)
            self._matched: dict[str, tuple[int, int, bool]] = {}
            self._pending: dict[str, tuple[int, int, tuple[list[int], ...]]] = {}
            self._step = 0
        else:
            self.capture = CaptureWriter(self.cfg.capture_dir, worker_rank())
            self.kv_caches: dict[str, torch.Tensor] = {}
            self._planted: set[str] = set()
            self.block_dim = block_dims(kv_cache_config)

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        self.tracker.remember(request)
        n, is_async = self.inner.get_num_new_matched_tokens(request, num_computed_tokens)
        self._matched[request.request_id] = (num_computed_tokens, n or 0, bool(is_async))
        return n, is_async

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        self.inner.update_state_after_alloc(request, blocks, num_external_tokens)
        local, matched, is_async = self._matched.get(request.request_id, (0, 0, False))
        if request.request_id in self._pending and num_external_tokens == 0:
            return  # the second call of an async load: blocks for the rest of the prompt
        tags = self.tracker.tags.get(request.request_id) or self.tracker.remember(request)
        self.log.write("request", req=request.request_id, case=tags.case, lane=tags.lane,
                       prompt_len=len(request.prompt_token_ids or ()), local_hit=local,
                       matched=matched, external=num_external_tokens, **{"async": is_async})
        if num_external_tokens > 0:
            self._pending[request.request_id] = (local, local + num_external_tokens,
                                                 blocks.get_block_ids())

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        inner = self.inner.build_connector_meta(scheduler_output)
        self._step += 1
        meta = TapStepMeta(inner=inner, step=self._step)
        for s in self.tracker.step(scheduler_output):
            st = s.state
            if not st.tags.capture:
                continue
            if (pend := self._pending.pop(st.req_id, None)) is not None:
                start, end, ids = pend
                meta.restore.extend(self.tracker.pages_in_range(st, start, end, ids))
            meta.write.extend(self.tracker.written_pages(s))
        self.tracker.forget(scheduler_output.finished_req_ids)
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.tracker.forget([request.request_id])
        self._matched.pop(request.request_id, None)
        self._pending.pop(request.request_id, None)
        return self.inner.request_finished(request, block_ids)

    # ------------------------------------------------------------------ worker side

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        inner = connector_metadata.inner if isinstance(connector_metadata, TapStepMeta) else None
        if inner is not None:
            self.inner.bind_connector_metadata(inner)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.inner.clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        inner = getattr(kv_connector_metadata, "inner", kv_connector_metadata)
        self.inner.handle_preemptions(inner)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.kv_caches = dict(kv_caches)
        self.inner.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._forward_context = forward_context
        self.inner.start_load_kv(forward_context, **kwargs)

    def _cache(self, layer: str) -> torch.Tensor | None:
        kv = self.kv_caches.get(layer)
        if kv is None and getattr(self, "_forward_context", None) is not None:
            kv = getattr(self._forward_context.no_compile_layers.get(layer), "kv_cache", None)
        return layer_tensor(kv)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.inner.wait_for_layer_load(layer_name)
        meta = self._get_connector_metadata()
        g = self.layer_group.get(layer_name)
        if not isinstance(meta, TapStepMeta) or g is None or not meta.restore:
            return
        pages = [p for p in meta.restore if p.group == g.index]
        kv = self._cache(layer_name)
        if pages and kv is not None:
            dim = self.block_dim(layer_name, kv)
            self._plant(layer_name, kv, pages, dim)
            record_planned(self.capture, "restored", layer_name, kv, pages, meta.step, block_dim=dim)

    def _plant(self, layer: str, kv: torch.Tensor, pages: list[PagePlan], block_dim: int) -> None:
        """Tap controls: flip one byte of one restored page in the buffer, as a faulty connector would."""
        for lane, fault in self.cfg.tap_faults.items():
            if lane in self._planted:
                continue
            layers = attention_layers(self.groups)
            if fault.layer >= len(layers) or layers[fault.layer] != layer:
                continue
            mine = [p for p in pages if p.lane == lane]
            if len(mine) <= fault.page:
                continue
            p = mine[fault.page]
            # a uint8 view of the page in place (pages may be strided views of a shared allocation)
            raw = kv.select(block_dim, p.block_id).view(torch.uint8)
            off = fault.offset % raw.numel()
            raw[tuple(int(i) for i in np.unravel_index(off, tuple(raw.shape)))] ^= 1
            self._planted.add(lane)
            (self.cfg.capture_dir / f"planted-{lane}.json").write_text(json.dumps({
                "kind": fault.kind, "layer": layer, "start": p.start, "end": p.end, "key": p.key,
                "offset": off}, sort_keys=True))

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        self.inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        meta = self._get_connector_metadata()
        g = self.layer_group.get(layer_name)
        if not isinstance(meta, TapStepMeta) or g is None or not meta.write:
            return
        pages = [p for p in meta.write if p.group == g.index]
        if pages:
            record_planned(self.capture, "written", layer_name, kv_layer, pages, meta.step,
                           block_dim=self.block_dim(layer_name, kv_layer))

    def wait_for_save(self) -> None:
        self.inner.wait_for_save()

    def shutdown(self) -> None:
        try:
            return self.inner.shutdown()
        finally:
            if self.role == KVConnectorRole.WORKER:
                self.capture.close()

    # ------------------------------------------------------------------ forwarded as they are

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return bool(self.inner.supports_divergent_local_hybrid_hits)

    @property
    def requires_kv_delivery(self) -> bool:
        return bool(self.inner.requires_kv_delivery)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        return load_connector_class(_inner_spec(extra)).get_required_kvcache_layout(vllm_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return bool(load_connector_class(_inner_spec(extra_config))
                    .requires_piecewise_for_cudagraph(extra_config))

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: Any,
                           per_engine_labelvalues: Any) -> Any:
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        return load_connector_class(_inner_spec(extra)).build_prom_metrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the tap does not have: the vendor's own extras.
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


_TAPPED = {name for name, v in vars(HarnessTapConnector).items() if callable(v) or isinstance(v, property)}
_NOT_FORWARDED = {"has_connector_metadata", "_get_connector_metadata", "role"}


def _forward(name: str) -> Any:
    def method(self: HarnessTapConnector, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"Forwarded to the wrapped connector's ``{name}``."
    return method


for _name, _value in vars(KVConnectorBase_V1).items():
    if (_name.startswith("_") or _name in _TAPPED or _name in _NOT_FORWARDED
            or not callable(_value) or isinstance(_value, (classmethod, staticmethod))):
        continue
    setattr(HarnessTapConnector, _name, _forward(_name))


class HarnessTapConnectorHMA(HarnessTapConnector, getattr(_base, "SupportsHMA", object)):  # type: ignore[misc]
    """The tap for connectors that support vLLM's hybrid memory allocator (several KV groups); on a
    release without the ``SupportsHMA`` marker it is the plain tap (:mod:`harness.kinds.kv.compat` names
    the plain one there)."""

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        self.tracker.forget([request.request_id])
        self._pending.pop(request.request_id, None)
        return self.inner.request_finished_all_groups(request, block_ids)  # type: ignore[no-any-return]
