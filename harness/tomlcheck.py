"""One validator for every TOML file the harness reads (suites, ``fleet.toml``, ``features.toml``,
the settings tables of the gate kinds): a :class:`Where` that names the file and the key, and a few
``check_*`` helpers that raise one error shape::

    suites/smoke.toml: [kv].block_size: expected an integer >= 1, got 'x'
    suites/smoke.toml: [kv.load].requets: unknown key 'requets'. Did you mean 'requests'? Valid: ...
    fleet.toml: [group[2]].models: missing (expected a non-empty list of strings)

Each file keeps its own error class (:class:`~harness.suites.SuiteError`, ``MatrixError``,
``CatalogError``), all subclasses of :class:`InvalidTOML`; a :class:`Where` carries the class it
raises. Standard library only (the fleet planner runs without the harness's dependencies).
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.registry import unknown


class InvalidTOML(ValueError):
    """A TOML file says something the harness cannot mean; the message names the file and the key."""


MISSING: Any = object()
"""A key's default when the key is required."""


@dataclass(frozen=True, slots=True)
class Where:
    """A place in a TOML file: the file and the path of keys (a table, an array index, a key)."""

    file: str | Path
    path: tuple[str | int, ...] = ()
    error: type[InvalidTOML] = InvalidTOML

    def __truediv__(self, part: str | int) -> Where:
        return Where(self.file, (*self.path, part), self.error)

    @property
    def key(self) -> str:
        """The dotted path as TOML writes it: ``kv.load``, ``cases[2].id``."""
        out = ""
        for p in self.path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
        return out

    def __str__(self) -> str:
        if not self.path:
            return str(self.file)
        *table, last = self.path
        if not table:
            return f"{self.file}: {last}" if isinstance(last, str) else f"{self.file}: [{self.key}]"
        inner = Where(self.file, tuple(table)).key
        return f"{self.file}: [{inner}].{last}" if isinstance(last, str) else f"{self.file}: [{self.key}]"

    def fail(self, message: str) -> InvalidTOML:
        """The error to raise: ``<file>: <key>: <message>``."""
        return self.error(f"{self}: {message}")


def load_toml(
    path: Path, error: type[InvalidTOML] = InvalidTOML, missing: str = "no such file"
) -> dict[str, Any]:
    """The parsed file; a missing file or bad TOML is ``error`` naming the file."""
    try:
        return tomllib.loads(path.read_bytes().decode())
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid TOML: {e}") from None


def check_keys(d: Mapping[str, Any], where: Where, valid: Collection[str]) -> None:
    """Refuse the first key of ``d`` outside ``valid``, naming the closest valid ones."""
    for key in d:
        if key not in valid:
            raise (where / key).fail(str(unknown("key", key, valid or ["(none)"])))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _bounds(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f" <= {hi:g}"
    return ""


def _in(v: float, lo: float | None, hi: float | None, lo_open: bool = False) -> bool:
    return (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or v <= hi)


def _get(d: Mapping[str, Any], key: str, where: Where, want: str) -> Any:
    if key not in d:
        raise (where / key).fail(f"missing (expected {want})")
    return d[key]


def _absent(d: Mapping[str, Any], key: str, default: Any) -> bool:
    """Whether ``key`` is absent and has a default (the code's own, returned as it is)."""
    return key not in d and default is not MISSING


def check_table(v: Any, where: Where) -> dict[str, Any]:
    """``v`` as a table, or the error naming ``where``."""
    if not isinstance(v, Mapping):
        raise where.fail(f"expected a table, got {v!r}")
    return dict(v)


def need_table(d: Mapping[str, Any], key: str, where: Where, default: Any = MISSING) -> dict[str, Any]:
    """``d[key]`` as a table (``default`` when absent; required without one)."""
    if _absent(d, key, default):
        return default  # type: ignore[no-any-return]
    return check_table(_get(d, key, where, "a table"), where / key)


def need_tables(
    d: Mapping[str, Any], key: str, where: Where, *, nonempty: bool = True, default: Any = MISSING
) -> Iterator[tuple[Where, dict[str, Any]]]:
    """An array of tables (``[[key]]``): each element with its own :class:`Where` (none when the
    key is absent and ``default`` is given)."""
    want = f"an array of tables ([[{(where / key).key}]])"
    if _absent(d, key, default):
        return
    v = _get(d, key, where, want)
    if not isinstance(v, list) or (nonempty and not v):
        raise (where / key).fail(f"expected {want}{' with at least one' if nonempty else ''}, got {v!r}")
    for i, t in enumerate(v):
        yield where / key / i, check_table(t, where / key / i)


def need_str(
    d: Mapping[str, Any], key: str, where: Where, default: Any = MISSING, *, nonempty: bool = True
) -> str:
    want = "a non-empty string" if nonempty else "a string"
    if _absent(d, key, default):
        return default
    v = _get(d, key, where, want)
    if not isinstance(v, str) or (nonempty and not v.strip()):
        raise (where / key).fail(f"expected {want}, got {v!r}")
    return v


def need_bool(d: Mapping[str, Any], key: str, where: Where, default: Any = MISSING) -> bool:
    if _absent(d, key, default):
        return default
    v = _get(d, key, where, "true or false")
    if not isinstance(v, bool):
        raise (where / key).fail(f"expected true or false, got {v!r}")
    return v


def need_int(
    d: Mapping[str, Any],
    key: str,
    where: Where,
    default: Any = MISSING,
    *,
    lo: int | None = None,
    hi: int | None = None,
    hint: str = "",
) -> Any:
    """An integer (not a bool) within ``[lo, hi]``. A default (``None`` too) is returned as it is
    when the key is absent, in every ``need_*``: defaults are the code's own."""
    want = "an integer" + _bounds(lo, hi) + hint
    if _absent(d, key, default):
        return default
    v = _get(d, key, where, want)
    if not _is_int(v) or not _in(v, lo, hi):
        raise (where / key).fail(f"expected {want}, got {v!r}")
    return v


def need_number(
    d: Mapping[str, Any],
    key: str,
    where: Where,
    default: Any = MISSING,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hint: str = "",
) -> float:
    """A number (int or float, not a bool) within the bounds, as a float."""
    want = "a number" + _bounds(lo, hi, lo_open) + hint
    if _absent(d, key, default):
        return float(default)
    v = _get(d, key, where, want)
    if not _is_number(v) or not _in(v, lo, hi, lo_open):
        raise (where / key).fail(f"expected {want}, got {v!r}")
    return float(v)


def need_choice(
    d: Mapping[str, Any],
    key: str,
    where: Where,
    choices: Sequence[str],
    default: Any = MISSING,
    hint: str = "",
) -> str:
    want = "one of " + ", ".join(choices) + hint
    if _absent(d, key, default):
        return default
    v = _get(d, key, where, want)
    if v not in choices:
        raise (where / key).fail(f"expected {want}, got {v!r}")
    return str(v)


def need_list(
    d: Mapping[str, Any],
    key: str,
    where: Where,
    default: Any = MISSING,
    *,
    of: type = str,
    nonempty: bool = True,
    unique: bool = False,
    lo: int | None = None,
    what: str = "",
) -> list[Any]:
    """A list of strings (non-empty ones) or of integers (``of=int``, each >= ``lo``)."""
    item = ("strings" if of is str else "integers" + _bounds(lo, None)) if not what else what
    want = f"a {'non-empty ' if nonempty else ''}list of {item}"
    if _absent(d, key, default):
        return default
    v = _get(d, key, where, want)
    ok_item = (
        (lambda x: isinstance(x, str) and bool(x.strip()))
        if of is str
        else (lambda x: _is_int(x) and _in(x, lo, None))
    )
    if not isinstance(v, list) or (nonempty and not v) or not all(ok_item(x) for x in v):
        raise (where / key).fail(f"expected {want}, got {v!r}")
    if unique and len(set(v)) != len(v):
        raise (where / key).fail(f"lists {sorted(x for x in v if v.count(x) > 1)[0]!r} twice")
    return list(v)
