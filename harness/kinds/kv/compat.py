"""What the installed vLLM offers the KV round trip: the one place release differences are absorbed.

Runs inside the engine's process (``harness.kinds.kv.phase``), under whichever vLLM release that process
imports, and answers by looking at that release's own classes, never at a version string:

* which name the wrapped connector has in this release: vLLM renamed some
  (:data:`harness.kinds.kv.config.RENAMED`: ``SharedStorageConnector`` became ``ExampleConnector``), so a
  spec naming one keeps meaning the same connector; the tap wraps the name this release can import;
* which tap class to name: the one that declares hybrid-memory-allocator support when the wrapped
  connector does (``SupportsHMA`` / ``supports_hma``), the plain one otherwise or where the release
  has no such marker;
* which ``kv_transfer_config`` fields the release's ``KVTransferConfig`` accepts: a field the suite
  sets that the release lacks is left out and named (``kv_load_failure_policy`` decides how a failed
  load is treated; without it the release's own behaviour applies and the record says so);
* which request options ``SamplingParams`` takes (``skip_reading_prefix_cache``: the consumer's
  in-engine reference generation that reads no cache);
* the hooks the gate cannot do without (:data:`REQUIRED_HOOKS`): one missing makes the phase a named
  ``skip`` (which hook, which release) instead of a crash or a silent pass.

:func:`adapt` returns the engine settings to start with and a :class:`Adapted` whose ``notes`` list
every difference it absorbed; the phase writes them into its result, and the record carries them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.kinds.kv.config import HARNESS_KEY, TAP_CLASS, TAP_CLASS_HMA, TAP_MODULE, ConnectorSpec, aliases

BASE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
REQUIRED_HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                  "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                  "request_finished", "register_kv_caches", "get_block_ids_with_load_errors")
"""Connector API methods the harness store and tap implement and rely on vLLM to call."""
BASE_FILE = BASE_MODULE.replace(".", "/") + ".py"
NO_KV_CACHE_CONFIG = ("KVConnectorBase_V1.__init__(kv_cache_config): the KV-cache groups the harness "
                      "connector pages by")


@dataclass
class Adapted:
    """What :func:`adapt` found and changed."""

    version: str
    notes: list[str] = field(default_factory=list)
    """Each difference absorbed, in words: what the release lacks or names otherwise, and what was done."""
    missing: list[str] = field(default_factory=list)
    """Hooks the gate needs that this release does not offer (non-empty: the phase is skipped)."""
    offers: dict[str, bool] = field(default_factory=dict)
    """The probes and their answers, for the record."""
    sampling_kwargs: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {"vllm": self.version, "notes": list(self.notes), "missing": list(self.missing),
                "offers": dict(sorted(self.offers.items()))}


def _fields(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    fields = getattr(cls, "model_fields", None) or getattr(cls, "__fields__", None)
    if fields:
        return set(fields)
    return set(inspect.signature(cls).parameters)


def adapt(engine: Mapping[str, Any]) -> tuple[dict[str, Any], Adapted]:
    """``engine`` (``vllm.LLM`` keyword arguments) made fit for the installed release."""
    import vllm
    from vllm import SamplingParams

    out = {k: v for k, v in engine.items()}
    got = Adapted(version=str(vllm.__version__))
    base = importlib.import_module(BASE_MODULE)
    connector_base = base.KVConnectorBase_V1
    for hook in REQUIRED_HOOKS:
        has = callable(getattr(connector_base, hook, None))
        got.offers[f"KVConnectorBase_V1.{hook}"] = has
        if not has:
            got.missing.append(f"KVConnectorBase_V1.{hook}")
    init = inspect.signature(connector_base.__init__).parameters
    got.offers["connector receives kv_cache_config"] = "kv_cache_config" in init
    if "kv_cache_config" not in init:
        got.missing.append(NO_KV_CACHE_CONFIG)
    sampling = _fields(SamplingParams)
    got.sampling_kwargs = frozenset(sampling)
    got.offers["SamplingParams.skip_reading_prefix_cache"] = "skip_reading_prefix_cache" in sampling
    if "skip_reading_prefix_cache" not in sampling:
        got.notes.append("SamplingParams has no skip_reading_prefix_cache: the consumer's reference "
                         "lane is left out (it would read the connector like the clean lane)")

    transfer = dict(out.get("kv_transfer_config") or {})
    if transfer:
        from vllm.config import KVTransferConfig

        accepted = _fields(KVTransferConfig)
        for key in sorted(set(transfer) - accepted):
            got.notes.append(f"KVTransferConfig has no {key} (the suite asks {transfer[key]!r}): left "
                             f"out, the release's own behaviour applies")
            got.offers[f"KVTransferConfig.{key}"] = False
            del transfer[key]
        if transfer.get("kv_connector") in (TAP_CLASS, TAP_CLASS_HMA) and \
                transfer.get("kv_connector_module_path") == TAP_MODULE:
            _wrapped_name(transfer, got)
            transfer["kv_connector"] = _tap_class(transfer, base, got)
        out["kv_transfer_config"] = transfer
    return out, got


def _tap_class(transfer: Mapping[str, Any], base: Any, got: Adapted) -> str:
    """The tap that declares HMA support exactly when the wrapped connector does."""
    marker = getattr(base, "SupportsHMA", None)
    got.offers["SupportsHMA"] = marker is not None
    if marker is None:
        got.notes.append("no SupportsHMA marker: the plain tap wraps the connector")
        return TAP_CLASS
    spec = ((transfer.get("kv_connector_extra_config") or {}).get(HARNESS_KEY) or {}).get("tap") or {}
    try:
        inner = getattr(importlib.import_module(str(spec.get("module", ""))), str(spec.get("class", "")))
    except (ImportError, AttributeError):
        return TAP_CLASS  # the tap itself refuses, naming module and class
    return TAP_CLASS_HMA if isinstance(inner, type) and issubclass(inner, marker) else TAP_CLASS


def _importable(spec: ConnectorSpec) -> bool:
    try:
        return isinstance(getattr(importlib.import_module(spec.module), spec.cls, None), type)
    except ImportError:
        return False


def _wrapped_name(transfer: dict[str, Any], got: Adapted) -> None:
    """Point the tap at the name the installed release gives the wrapped connector (in place)."""
    extra = dict(transfer.get("kv_connector_extra_config") or {})
    harness = dict(extra.get(HARNESS_KEY) or {})
    tap = dict(harness.get("tap") or {})
    want = ConnectorSpec(str(tap.get("module", "")), str(tap.get("class", "")))
    others = aliases(want)
    if not others or _importable(want):
        return
    here = next((a for a in others if _importable(a)), None)
    got.offers[f"connector {want.cls}"] = False
    if here is None:
        return  # the tap itself refuses, naming module and class
    got.offers[f"connector {here.cls}"] = True
    got.notes.append(f"vLLM {got.version} has no {want.cls} ({want.module}); the same connector is "
                     f"{here.cls} ({here.module}) here: the tap wraps that")
    tap.update({"module": here.module, "class": here.cls})
    harness["tap"] = tap
    extra[HARNESS_KEY] = harness
    transfer["kv_connector_extra_config"] = extra


def missing_in_source(text: str) -> list[str] | None:
    """What :func:`adapt` would find missing, read from the source of the release's connector base
    module (``BASE_FILE``) before anything is installed; None when the source cannot tell (no such
    class, or a base class of its own whose methods are elsewhere): then only the installed release
    answers."""
    tree = ast.parse(text)
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "KVConnectorBase_V1"),
               None)
    if cls is None or any(not (isinstance(b, ast.Name) and b.id in ("ABC", "object")) for b in cls.bases):
        return None
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    missing = [f"KVConnectorBase_V1.{h}" for h in REQUIRED_HOOKS if h not in methods]
    init = methods.get("__init__")
    params = {a.arg for a in (*init.args.args, *init.args.kwonlyargs)} if init is not None else set()
    return missing + ([] if "kv_cache_config" in params else [NO_KV_CACHE_CONFIG])
