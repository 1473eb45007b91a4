"""Suites: suites/<name>.toml -> a validated, frozen :class:`Suite`.

A suite names its cases (text, or token ids), the sampling, and which comparators run with which
thresholds. Every error names the file and the field. Bumping ``version`` makes goldens recorded
under an older version stale: the gate refuses them and says which command re-records.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.api import Case, Sampling
from harness.registry import unknown

if TYPE_CHECKING:
    from harness.models.arch import ModelLimits


class SuiteError(ValueError):
    """A malformed suite file; the message names the file and the field."""


class SuiteMismatch(SuiteError):
    """A well-formed suite that cannot mean the same thing on this model (a token id outside its
    vocabulary, a case longer than its context, more logprobs than it has tokens); the message names
    the suite file, the case and the field."""


@dataclass(frozen=True, slots=True)
class CaseSpec:
    id: str
    text: str | None = None
    ids: tuple[int, ...] | None = None
    repeat: int = 1
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ComparatorSpec:
    name: str
    gate: bool
    """True: a failing verdict fails the gate. False: reported only."""
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Suite:
    name: str
    version: int
    kind: str
    """The gate kind that runs it (``parity``, ``kv_roundtrip``, ``ab``, ...): see
    :mod:`harness.kinds`. Checked against the registry when a gate starts."""
    description: str
    sampling: Sampling
    comparators: tuple[ComparatorSpec, ...]
    cases: tuple[CaseSpec, ...]
    path: Path
    digest: str
    """sha256 of the suite file: goldens remember it."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Other top-level tables (e.g. ``kv``, ``accuracy``) for the gate kind that reads them; a
    table its kind does not read is refused when the gate starts."""

    def comparator(self, name: str) -> ComparatorSpec | None:
        return next((c for c in self.comparators if c.name == name), None)

    def params(self, name: str) -> Mapping[str, Any]:
        """The suite's ``[compare.<name>]`` table (empty when the suite does not name ``name``: the
        comparator's own defaults apply)."""
        spec = self.comparator(name)
        return spec.params if spec is not None else {}

    def build_cases(self, encode: Callable[[str], Sequence[int]],
                    limits: ModelLimits | None = None) -> tuple[Case, ...]:
        """Turn the case specs into token-id cases with the model's tokenizer ``encode``; with the
        model's ``limits``, refuse (:class:`SuiteMismatch`) what the model cannot run as written."""
        out = []
        for spec in self.cases:
            if spec.ids is not None:
                ids = tuple(spec.ids) * spec.repeat
                text = spec.text or ""
            else:
                assert spec.text is not None
                text = spec.text * spec.repeat
                ids = tuple(int(t) for t in encode(text))
            if not ids:
                raise SuiteError(f"{self.path}: case {spec.id!r} encodes to zero tokens")
            out.append(Case(spec.id, ids, text, spec.tags))
        if limits is not None:
            self.check_fits(out, limits)
        return tuple(out)

    def check_fits(self, cases: Sequence[Case], limits: ModelLimits) -> None:
        """Raise :class:`SuiteMismatch` naming the first field the model cannot honour."""
        vocab, k = limits.vocab_size, self.sampling.logprobs
        if vocab is not None and k > vocab:
            raise SuiteMismatch(f"{self.path} [sampling]: field 'logprobs' asks for {k} per position, "
                                f"but the model's vocabulary has {vocab} tokens")
        for case, spec in zip(cases, self.cases, strict=True):
            if vocab is not None and (bad := [t for t in case.prompt_ids if not 0 <= t < vocab]):
                raise SuiteMismatch(f"{self.path}: case {case.id!r} field 'ids' holds token {bad[0]}, "
                                    f"outside the model's vocabulary of {vocab} tokens (ids 0..{vocab - 1})"
                                    if spec.ids is not None else
                                    f"{self.path}: case {case.id!r} field 'text' encodes to token {bad[0]}, "
                                    f"outside the model's vocabulary of {vocab} tokens")
            need = len(case.prompt_ids) + self.sampling.max_tokens
            if need > limits.max_len:
                raise SuiteMismatch(
                    f"{self.path}: case {case.id!r} needs {len(case.prompt_ids)} prompt tokens + "
                    f"[sampling] field 'max_tokens' {self.sampling.max_tokens} = {need} positions, "
                    f"beyond the model's context of {limits.max_len}")


JUDGED_BY_KIND = frozenset({"sampling"})
"""Suite kinds that judge with their own table, not per-case comparators: the sampling gate's bars
and settings are its ``[sampling_gate]`` table, its controls planted samplers (a ``[compare]`` table
is optional there)."""


def _need(d: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise SuiteError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise SuiteError(f"{where}: field {key!r} must be {names}, got {v!r}")
    return v


FULL_TOP_K = 20
"""With ``logprobs = "full"``, the top-k rows kept beside the full distributions (strict, near-tie,
the goldens, and what a failure prints): vLLM's and most servers' default cap."""


def _logprobs(v: Any, where: str) -> tuple[int, bool]:
    """``logprobs = k`` (an int >= 0) or ``"full"`` -> (top-k, full vocabulary)."""
    if v == "full":
        return FULL_TOP_K, True
    if isinstance(v, bool) or not isinstance(v, int):
        raise SuiteError(f"{where}: field 'logprobs' must be an int >= 0 or \"full\" (the whole "
                         f"vocabulary, whatever the model), got {v!r}")
    return v, False


def load_suite(path: Path) -> Suite:
    """Parse and validate one suite file."""
    raw_bytes = path.read_bytes()
    try:
        raw = tomllib.loads(raw_bytes.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SuiteError(f"{path}: not valid TOML: {e}") from None
    where = str(path)
    name = _need(raw, "name", str, where)
    if name != path.stem:
        raise SuiteError(f"{where}: field 'name' is {name!r} but the file is {path.name}")
    version = _need(raw, "version", int, where)
    s = _need(raw, "sampling", dict, where)
    k, full = _logprobs(s.get("logprobs", 5), f"{where} [sampling]")
    sampling = Sampling(
        max_tokens=_need(s, "max_tokens", int, f"{where} [sampling]"),
        logprobs=k,
        temperature=float(s.get("temperature", 0.0)),
        seed=int(s.get("seed", 0)),
        full_vocab=full,
        top_p=float(s.get("top_p", 1.0)),
    )
    if sampling.temperature != 0.0:
        raise SuiteError(f"{where} [sampling]: field 'temperature' must be 0 (parity gates are greedy; "
                         f"seeded rollouts are an invariance suite's [rl] table)")
    if sampling.top_p != 1.0:
        raise SuiteError(f"{where} [sampling]: field 'top_p' must be 1 (parity gates are greedy; "
                         f"seeded rollouts are an invariance suite's [rl] table)")
    if sampling.max_tokens < 1 or sampling.logprobs < 0:
        raise SuiteError(f"{where} [sampling]: max_tokens must be >= 1 and logprobs >= 0")

    from harness.compare import COMPARATORS, ParamError, check_params

    kind = raw.get("kind", "parity")
    comps = []
    table = raw.get("compare", {}) if kind in JUDGED_BY_KIND else _need(raw, "compare", dict, where)
    if not isinstance(table, dict):
        raise SuiteError(f"{where}: field 'compare' must be a table")
    for cname, params in table.items():
        if cname not in COMPARATORS:
            raise SuiteError(f"{where} [compare.{cname}]: {unknown('comparator', cname, COMPARATORS)}")
        if not isinstance(params, dict):
            raise SuiteError(f"{where} [compare.{cname}]: must be a table")
        gate = params.get("gate", True)
        if not isinstance(gate, bool):
            raise SuiteError(f"{where} [compare.{cname}]: field 'gate' must be true or false")
        try:
            check_params(cname, params, where)
        except ParamError as e:
            raise SuiteError(str(e)) from None
        comps.append(ComparatorSpec(cname, gate, {k: v for k, v in params.items() if k != "gate"}))
    if not comps and kind not in JUDGED_BY_KIND:
        raise SuiteError(f"{where}: [compare] names no comparator")

    cases, seen = [], set()
    for i, c in enumerate(_need(raw, "cases", list, where)):
        cw = f"{where} cases[{i}]"
        if not isinstance(c, dict):
            raise SuiteError(f"{cw}: must be a table")
        cid = _need(c, "id", str, cw)
        if cid in seen:
            raise SuiteError(f"{cw}: duplicate id {cid!r}")
        seen.add(cid)
        text, ids = c.get("text"), c.get("ids")
        if text is None and ids is None:
            raise SuiteError(f"{cw} ({cid}): give 'text' or 'ids'")
        if text is not None and not isinstance(text, str):
            raise SuiteError(f"{cw} ({cid}): field 'text' must be str")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
            raise SuiteError(f"{cw} ({cid}): field 'ids' must be a list of ints")
        repeat = c.get("repeat", 1)
        if not isinstance(repeat, int) or repeat < 1:
            raise SuiteError(f"{cw} ({cid}): field 'repeat' must be an int >= 1")
        cases.append(CaseSpec(cid, text, tuple(ids) if ids is not None else None, repeat,
                              tuple(c.get("tags", ()))))
    if not cases:
        raise SuiteError(f"{where}: no cases")
    if not isinstance(kind, str) or not kind:
        raise SuiteError(f"{where}: field 'kind' must be a gate kind name, got {kind!r}")
    known = {"name", "version", "kind", "description", "sampling", "compare", "cases"}
    return Suite(
        name=name, version=version, kind=kind, description=str(raw.get("description", "")),
        sampling=sampling, comparators=tuple(comps), cases=tuple(cases), path=path,
        digest=hashlib.sha256(raw_bytes).hexdigest(),
        extra={k: v for k, v in raw.items() if k not in known},
    )


def suite_names(suites_dir: Path) -> list[str]:
    return sorted(p.stem for p in suites_dir.glob("*.toml"))


def find_suite(suites_dir: Path, name: str) -> Suite:
    path = suites_dir / f"{name}.toml"
    if not path.exists():
        raise unknown("suite", name, suite_names(suites_dir))
    return load_suite(path)
