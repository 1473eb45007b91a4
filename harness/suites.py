"""Suites: suites/<name>.toml -> a validated, frozen :class:`Suite`.

A suite names its cases (text, or token ids), the sampling, and which comparators run with which
thresholds. Every error names the file and the field. Bumping ``version`` makes goldens recorded
under an older version stale: the gate refuses them and says which command re-records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.api import Case, Sampling
from harness.registry import unknown
from harness.tomlcheck import (
    MISSING,
    InvalidTOML,
    Where,
    check_keys,
    check_table,
    load_toml,
    need_bool,
    need_int,
    need_list,
    need_number,
    need_str,
    need_table,
    need_tables,
)

if TYPE_CHECKING:
    from harness.models.arch import ModelLimits


class SuiteError(InvalidTOML):
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
    oracle_dtype: str | None = None
    """``[oracle] dtype``: the dtype the pinned vLLM computes these goldens in (None: the model's
    own, float32 for the tiny models). A suite of its own per dtype keeps each golden set apart:
    ``smoke_bf16`` is ``smoke`` recorded in bfloat16, for engines that load bfloat16 only."""
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
            raise SuiteMismatch(f"{Where(self.path, ('sampling', 'logprobs'))}: asks for {k} per position, "
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


JUDGED_BY_KIND = frozenset({"sampling", "api", "rl", "spec"})
"""Suite kinds that judge with their own table, not per-case comparators: the sampling gate's bars
and settings are its ``[sampling_gate]`` table, its controls planted samplers; the API gate's facets are
its ``[api]`` table, its controls a fault proxy (a ``[compare]`` table is optional there)."""


FULL_TOP_K = 20
"""With ``logprobs = "full"``, the top-k rows kept beside the full distributions (strict, near-tie,
the goldens, and what a failure prints): vLLM's and most servers' default cap."""


def _logprobs(d: Mapping[str, Any], where: Where) -> tuple[int, bool]:
    """``logprobs = k`` (an int >= 0) or ``"full"`` -> (top-k, full vocabulary)."""
    if d.get("logprobs") == "full":
        return FULL_TOP_K, True
    return need_int(d, "logprobs", where, 5, lo=0,
                    hint=' or "full" (the whole vocabulary, whatever the model)'), False


GREEDY = "parity gates are greedy; seeded rollouts are an invariance suite's [rl] table"
TOP = ("name", "version", "kind", "description", "sampling", "compare", "cases", "oracle")
ORACLE_DTYPES = ("bfloat16", "float16", "float32")
CASE_KEYS = ("id", "text", "ids", "repeat", "tags")


def load_suite(path: Path) -> Suite:
    """Parse and validate one suite file."""
    raw_bytes = path.read_bytes()
    raw = load_toml(path, SuiteError)
    top = Where(path, error=SuiteError)
    name = need_str(raw, "name", top)
    if name != path.stem:
        raise (top / "name").fail(f"is {name!r} but the file is {path.name}")
    version = need_int(raw, "version", top, lo=0)
    kind = need_str(raw, "kind", top, "parity")
    s = need_table(raw, "sampling", top)
    sw = top / "sampling"
    check_keys(s, sw, ("max_tokens", "logprobs", "temperature", "seed", "top_p"))
    k, full = _logprobs(s, sw)
    sampling = Sampling(
        max_tokens=need_int(s, "max_tokens", sw, lo=1), logprobs=k,
        temperature=need_number(s, "temperature", sw, 0.0),
        seed=need_int(s, "seed", sw, 0), full_vocab=full,
        top_p=need_number(s, "top_p", sw, 1.0),
    )
    for key, greedy in (("temperature", 0.0), ("top_p", 1.0)):
        if getattr(sampling, key) != greedy:
            raise (sw / key).fail(f"must be {greedy:g} ({GREEDY})")

    from harness.compare import COMPARATORS, check_params

    comps = []
    table = need_table(raw, "compare", top, {} if kind in JUDGED_BY_KIND else MISSING)
    for cname, params in table.items():
        cw = top / "compare" / cname
        if cname not in COMPARATORS:
            raise cw.fail(str(unknown("comparator", cname, COMPARATORS)))
        params = check_table(params, cw)
        gate = need_bool(params, "gate", cw, True)
        check_params(cname, params, cw)
        comps.append(ComparatorSpec(cname, gate, {k: v for k, v in params.items() if k != "gate"}))
    if not comps and kind not in JUDGED_BY_KIND:
        raise (top / "compare").fail("names no comparator")

    cases, seen = [], set()
    for cw, c in need_tables(raw, "cases", top):
        check_keys(c, cw, CASE_KEYS)
        cid = need_str(c, "id", cw)
        if cid in seen:
            raise (cw / "id").fail(f"duplicate id {cid!r}")
        seen.add(cid)
        text = need_str(c, "text", cw, None, nonempty=False) if "text" in c else None
        ids = need_list(c, "ids", cw, of=int, nonempty=False) if "ids" in c else None
        if text is None and ids is None:
            raise cw.fail(f"case {cid!r}: give 'text' or 'ids'")
        repeat = need_int(c, "repeat", cw, 1, lo=1)
        tags = need_list(c, "tags", cw, [], nonempty=False)
        cases.append(CaseSpec(cid, text, tuple(ids) if ids is not None else None, repeat, tuple(tags)))
    oracle_dtype = None
    if "oracle" in raw:
        ow = top / "oracle"
        o = check_table(raw["oracle"], ow)
        check_keys(o, ow, ("dtype",))
        oracle_dtype = need_str(o, "dtype", ow)
        if oracle_dtype not in ORACLE_DTYPES:
            raise (ow / "dtype").fail(f"is {oracle_dtype!r}; valid: {', '.join(ORACLE_DTYPES)}")
    return Suite(
        name=name, version=version, kind=kind, oracle_dtype=oracle_dtype,
        description=need_str(raw, "description", top, "", nonempty=False),
        sampling=sampling, comparators=tuple(comps), cases=tuple(cases), path=path,
        digest=hashlib.sha256(raw_bytes).hexdigest(),
        extra={k: v for k, v in raw.items() if k not in TOP},
    )


def suite_names(suites_dir: Path) -> list[str]:
    return sorted(p.stem for p in suites_dir.glob("*.toml"))


def find_suite(suites_dir: Path, name: str) -> Suite:
    path = suites_dir / f"{name}.toml"
    if not path.exists():
        raise unknown("suite", name, suite_names(suites_dir))
    return load_suite(path)
