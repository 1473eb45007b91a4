"""The harness connectors' settings, and how a third-party connector class is named and found.

Everything the harness tells its connectors travels in ``kv_connector_extra_config["harness"]``
(the rest of ``kv_connector_extra_config`` is left to a wrapped connector)::

    {"capture_dir": ".../capture/producer",          where pages and hit counts are recorded
     "chunk_size": 64,                                tokens per stored object (store mode)
     "lanes": {"clean": {"root": ".../store"},        store folder per lane; a lane may plant a
               "flip": {"root": ".../store",          fault (see harness.kinds.kv.faults.store)
                        "fault": {"kind": "flip", "layer": 1, "page": 0, "offset": 4097}}},
     "tap": {"module": "vllm....example_connector", "class": "ExampleConnector"},   (tap mode)
     "tap_faults": {"flip": {"kind": "flip", "layer": 1, "page": 0, "offset": 4097}}}
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.registry import UnknownName

HARNESS_KEY = "harness"
STORE_MODULE = "harness.kinds.kv.connector"
STORE_CLASS = "HarnessKVConnector"
TAP_MODULE = "harness.kinds.kv.tap"
TAP_CLASS = "HarnessTapConnector"
TAP_CLASS_HMA = "HarnessTapConnectorHMA"


def store_settings(base: Mapping[str, Any], chunk_size: int, store: Path) -> dict[str, Any]:
    """``base`` (an engine's ``LLM`` kwargs) with the harness KV store as producer and consumer at
    once, its pages under ``store`` (the invariance gate's ``kv_connector`` variant)."""
    return {**base, "enable_prefix_caching": False,  # every cached token must come through the connector
            "kv_transfer_config": {
                "kv_connector": STORE_CLASS, "kv_connector_module_path": STORE_MODULE,
                "kv_role": "kv_both", "kv_load_failure_policy": "fail",
                "kv_connector_extra_config": {HARNESS_KEY: {
                    "capture_dir": str(store.parent / "capture"), "chunk_size": chunk_size,
                    "lanes": {"clean": {"root": str(store)}}}}}}


class ConnectorSpecError(UnknownName):
    """A connector that cannot be found or used; the message names the module and the class."""


class KVConfigError(ValueError):
    """Malformed harness settings in ``kv_connector_extra_config``; the message names the field."""


@dataclass(frozen=True, slots=True)
class ConnectorSpec:
    """A KV connector class named by module path and class name."""

    module: str
    cls: str

    @property
    def text(self) -> str:
        return f"{self.module}:{self.cls}"


MOVED_MODULES: Mapping[str, str] = {
    "harness.kv.connector": STORE_MODULE,
    "harness.kv.tap": TAP_MODULE,
}
"""The harness connectors' module paths before the KV gate became the package ``harness.kinds.kv``
-> where they are now. The one alias table for module paths: a ``--connector`` / ``CONNECTOR=`` spec
or a record's ``kv_connector_module_path`` written before the move names the old path, and
:func:`parse_connector` resolves it to the new one (the spec's ``text`` then names the new path)."""

V1_CONNECTORS = "vllm.distributed.kv_transfer.kv_connector.v1."
RENAMED: tuple[tuple[ConnectorSpec, ...], ...] = (
    (ConnectorSpec(V1_CONNECTORS + "example_connector", "ExampleConnector"),
     ConnectorSpec(V1_CONNECTORS + "shared_storage_connector", "SharedStorageConnector")),
)
"""One connector under the names vLLM releases gave it, newest first: vLLM renamed its example
connector ``SharedStorageConnector`` (module ``shared_storage_connector``) to ``ExampleConnector``.
A spec naming either means that connector in every release (:func:`aliases`;
:mod:`harness.kinds.kv.compat` picks the name the installed release has)."""


def aliases(spec: ConnectorSpec) -> tuple[ConnectorSpec, ...]:
    """The other names of the connector ``spec`` names (empty: it was never renamed)."""
    for group in RENAMED:
        if spec in group:
            return tuple(s for s in group if s != spec)
    return ()


def parse_connector(spec: str) -> ConnectorSpec:
    """``module.path:Class``, ``module.path.Class``, or a connector name vLLM registers
    (``ExampleConnector``; an older name of a renamed connector, ``SharedStorageConnector``, is the
    same connector under the name the installed vLLM registers). A harness connector's module path
    from before its move resolves to where it is now (:data:`MOVED_MODULES`)."""
    spec = spec.strip()
    if not spec:
        raise ConnectorSpecError("empty KV connector spec; give module.path:ClassName")
    if ":" in spec:
        module, _, cls = spec.partition(":")
    elif "." in spec:
        module, _, cls = spec.rpartition(".")
    else:
        return _registered(spec)
    if not module or not cls or not cls.isidentifier():
        raise ConnectorSpecError(f"KV connector spec {spec!r}: expected module.path:ClassName")
    return ConnectorSpec(MOVED_MODULES.get(module, module), cls)


def _registered(name: str) -> ConnectorSpec:
    """The connector vLLM registers as ``name``, or under another name of the same connector."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError as e:
        raise ConnectorSpecError(f"KV connector {name!r}: vLLM is not importable here ({e}); "
                                 f"give module.path:{name}") from None
    registry = KVConnectorFactory._registry
    if name not in registry:
        renamed = next((a.cls for group in RENAMED if any(s.cls == name for s in group)
                        for a in group if a.cls in registry), None)
        name = renamed or name
    loader = registry.get(name)
    if loader is None:
        import difflib

        names = sorted(KVConnectorFactory._registry)
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConnectorSpecError(f"KV connector class {name!r} is not registered with vLLM and has no "
                                 f"module path.{hint} Give module.path:{name}, or one of: "
                                 f"{', '.join(names)}")
    # The registry keeps lazy loaders; their closure holds the module path it would import.
    cells = dict(zip(loader.__code__.co_freevars, loader.__closure__ or (), strict=False))
    cell = cells.get("module_path")
    if cell is None:
        raise ConnectorSpecError(f"KV connector {name!r}: cannot tell its module; give module.path:{name}")
    return ConnectorSpec(str(cell.cell_contents), name)


def load_connector_class(spec: ConnectorSpec) -> type:
    """Import ``spec`` and check it is a vLLM v1 KV connector; errors name module and class."""
    try:
        module = importlib.import_module(spec.module)
    except ImportError as e:
        raise ConnectorSpecError(f"KV connector {spec.cls!r}: module {spec.module!r} cannot be imported "
                                 f"({type(e).__name__}: {e})") from None
    cls = getattr(module, spec.cls, None)
    if cls is None:
        import difflib

        names = sorted(n for n in dir(module) if n.endswith("Connector") or n.endswith("ConnectorV1"))
        close = difflib.get_close_matches(spec.cls, names, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConnectorSpecError(f"KV connector class {spec.cls!r} not found in module {spec.module!r}."
                                 f"{hint}" + (f" It defines: {', '.join(names)}" if names else ""))
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    if not (isinstance(cls, type) and issubclass(cls, KVConnectorBase_V1)):
        raise ConnectorSpecError(f"{spec.module}:{spec.cls} is not a vLLM v1 KV connector "
                                 f"(not a subclass of KVConnectorBase_V1)")
    return cls


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: str
    layer: int
    """Index into the attention layers of KV-cache group 0."""
    page: int = 0
    offset: int = 0


@dataclass(frozen=True, slots=True)
class HarnessKVConfig:
    capture_dir: Path
    chunk_size: int = 0
    lanes: Mapping[str, tuple[Path, FaultSpec | None]] = field(default_factory=dict)
    tap: ConnectorSpec | None = None
    tap_faults: Mapping[str, FaultSpec] = field(default_factory=dict)

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> HarnessKVConfig:
        where = f"kv_connector_extra_config[{HARNESS_KEY!r}]"
        raw = (extra or {}).get(HARNESS_KEY)
        if not isinstance(raw, Mapping):
            raise KVConfigError(f"{where} is missing: the harness connectors need at least capture_dir")
        if not isinstance(raw.get("capture_dir"), str):
            raise KVConfigError(f"{where}['capture_dir'] must be a path string")
        chunk = raw.get("chunk_size", 0)
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0:
            raise KVConfigError(f"{where}['chunk_size'] must be an int >= 1, got {chunk!r}")
        lanes: dict[str, tuple[Path, FaultSpec | None]] = {}
        for name, lane in (raw.get("lanes") or {}).items():
            if not isinstance(lane, Mapping) or not isinstance(lane.get("root"), str):
                raise KVConfigError(f"{where}['lanes'][{name!r}] needs a 'root' store folder")
            f = lane.get("fault")
            lanes[str(name)] = (Path(lane["root"]), _fault(f, f"{where}['lanes'][{name!r}]['fault']")
                                if f else None)
        tap = None
        if (t := raw.get("tap")) is not None:
            if not isinstance(t, Mapping) or not t.get("module") or not t.get("class"):
                raise KVConfigError(f"{where}['tap'] needs 'module' and 'class'")
            tap = ConnectorSpec(str(t["module"]), str(t["class"]))
        tap_faults = {str(k): _fault(v, f"{where}['tap_faults'][{k!r}]")
                      for k, v in (raw.get("tap_faults") or {}).items()}
        return cls(Path(raw["capture_dir"]), chunk, lanes, tap, tap_faults)


def _fault(d: Any, where: str) -> FaultSpec:
    from harness.kinds.kv.faults.store import FAULTS

    if not isinstance(d, Mapping) or d.get("kind") not in FAULTS:
        raise KVConfigError(f"{where}: 'kind' must be one of {', '.join(FAULTS)}")
    try:
        return FaultSpec(str(d["kind"]), int(d.get("layer", 0)), int(d.get("page", 0)),
                         int(d.get("offset", 0)))
    except (TypeError, ValueError) as e:
        raise KVConfigError(f"{where}: {e}") from None


UNREPORTED = "unreported: several KV-cache groups"
"""The setup line's ``failed_loads`` where the connector cannot tell vLLM about a page it failed to
load: vLLM accepts block-level load failures only from an engine with one KV-cache group (its
scheduler raises otherwise) and has no recovery path for a failed synchronous load with several."""


def chunk_size_problem(chunk_size: int, groups: Any) -> str | None:
    """Why ``chunk_size`` cannot be served by these KV-cache groups, or None.

    A stored chunk must be whole pages of every paged group, so ``chunk_size`` must be a multiple
    of every attention group's block size. ``groups`` are :class:`harness.kinds.kv.plan.GroupInfo`.
    """
    if chunk_size < 1:
        return f"chunk_size must be >= 1 token, got {chunk_size}"
    for g in groups:
        if g.paged and chunk_size % g.block_size:
            first = g.layers[0] if g.layers else "?"
            more = f" and {len(g.layers) - 1} more" if len(g.layers) > 1 else ""
            return (f"chunk_size {chunk_size} is not a multiple of KV-cache group {g.index}'s block "
                    f"size {g.block_size} ({g.kind}, layers {first}{more}): a stored chunk must be "
                    f"whole pages of every group; this configuration is not supported")
    return None
