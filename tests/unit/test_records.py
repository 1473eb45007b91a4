"""Records: atomic, append-only, concurrent writers lose nothing; malformed ones are named."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from harness.records import Record, RecordError, iter_record_paths, load_record, write_record
from tests.pins import PIN
from tests.unit import record_kit


def make_record(i: int = 0, created: str = "2026-11-30T00:00:00Z") -> Record:
    return record_kit.make_record(created=created, summary=f"record {i}", timings={"compare_s": 0.01})


def _write_many(args: tuple[str, int]) -> list[str]:
    root, n = args
    return [str(write_record(Path(root), make_record(i))) for i in range(n)]


def test_round_trip(tmp_path: Path) -> None:
    rec = make_record()
    path = write_record(tmp_path, rec)
    assert path.parent == tmp_path / "tiny-llama" / "smoke"
    assert load_record(path) == rec


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    with ProcessPoolExecutor(4) as pool:
        written = [p for batch in pool.map(_write_many, [(str(tmp_path), 25)] * 4) for p in batch]
    assert len(set(written)) == 100
    found = list(iter_record_paths(tmp_path))
    assert len(found) == 100
    assert all(load_record(p).summary.startswith("record ") for p in found)
    assert not [p for p in tmp_path.rglob(".tmp-*")], "temp files left behind"


def test_a_record_is_never_overwritten(tmp_path: Path) -> None:
    rec = make_record()
    write_record(tmp_path, rec)
    with pytest.raises(FileExistsError):
        write_record(tmp_path, rec)
    assert load_record(next(iter_record_paths(tmp_path))).summary == "record 0"


def test_truncated_record_is_named(tmp_path: Path) -> None:
    path = write_record(tmp_path, make_record())
    path.write_text(path.read_text()[:50])
    with pytest.raises(RecordError, match=str(path)):
        load_record(path)


def test_record_names_its_provenance(tmp_path: Path) -> None:
    d = json.loads(write_record(tmp_path, make_record()).read_text())
    for key in ("harness", "oracle", "candidate", "model", "suite", "verdicts", "timings"):
        assert key in d
    assert d["oracle"]["pin"] == PIN.spec and d["harness"]["sha"] == "abc123"
