"""The harness store: every page checked on read; a damaged store answers with named problems."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.kinds.kv.faults.store import FaultyStore, read_planted
from harness.kinds.kv.store import PageStore
from harness.kv_pages.digest import digest_bytes

LAYER = "model.layers.0.self_attn.attn"
KEY = "ab" + "0" * 30


def chunk(n: int = 2, size: int = 256, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size), dtype=np.uint8)


@pytest.fixture
def store(tmp_path: Path) -> tuple[PageStore, np.ndarray]:
    s = PageStore(tmp_path / "store")
    pages = chunk()
    s.put(KEY, LAYER, pages, [digest_bytes(p.tobytes()) for p in pages], {"start": 0, "end": 64})
    return s, pages


def test_put_then_get_serves_every_page_verified(store) -> None:  # noqa: ANN001
    s, pages = store
    assert s.has(KEY, [LAYER]) and not s.has(KEY, [LAYER, "other"])
    reads = s.get(KEY, LAYER, 2)
    assert [r.data for r in reads] == [p.tobytes() for p in pages]
    assert s.chunk_keys() == [KEY]
    assert not list(s.chunk_dir(KEY).glob(".*.tmp"))  # nothing half-written left behind


def test_a_missing_chunk_is_missing_for_every_page(tmp_path: Path) -> None:
    reads = PageStore(tmp_path / "nowhere").get(KEY, LAYER, 2)
    assert [r.problem for r in reads] == ["missing", "missing"]
    assert "not in the store" in reads[0].reason and KEY[:2] in reads[0].reason


def test_a_truncated_file_names_the_pages_cut_short_and_serves_the_rest(store) -> None:  # noqa: ANN001
    s, pages = store
    data = s.chunk_dir(KEY) / f"{LAYER}.kv"
    data.write_bytes(data.read_bytes()[:300])
    reads = s.get(KEY, LAYER, 2)
    assert reads[0].data == pages[0].tobytes()
    assert reads[1].problem == "truncated"
    assert "page 1" in reads[1].reason and f"{LAYER}.kv" in reads[1].reason


def test_a_corrupted_byte_fails_that_page_digest_only(store) -> None:  # noqa: ANN001
    s, pages = store
    data = s.chunk_dir(KEY) / f"{LAYER}.kv"
    b = bytearray(data.read_bytes())
    b[256 + 17] ^= 0x80
    data.write_bytes(bytes(b))
    reads = s.get(KEY, LAYER, 2)
    assert reads[0].data == pages[0].tobytes()
    assert reads[1].problem == "corrupt" and "page 1 digest" in reads[1].reason


@pytest.mark.parametrize("damage, problem, needle", [
    (lambda d: (d / f"{LAYER}.json").write_text("{not json"), "corrupt", ".json: unreadable"),
    (lambda d: (d / f"{LAYER}.kv").unlink(), "missing", ".kv: not in the store"),
    (lambda d: (d / f"{LAYER}.kv").write_bytes((d / f"{LAYER}.kv").read_bytes() + b"x"), "corrupt",
     "bytes, expected 512"),
    (lambda d: (d / f"{LAYER}.json").write_text(json.dumps({"digests": ["x"], "page_nbytes": 256})),
     "corrupt", "holds 1 pages, expected 2"),
])
def test_damaged_chunk_files_are_named_problems_never_silent(store, damage, problem: str,  # noqa: ANN001
                                                            needle: str) -> None:
    s, _ = store
    damage(s.chunk_dir(KEY))
    reads = s.get(KEY, LAYER, 2)
    assert all(r.data is None and r.problem == problem for r in reads), reads
    assert needle in reads[0].reason


def test_planted_flip_serves_one_byte_flipped_and_says_which(store, tmp_path: Path) -> None:  # noqa: ANN001
    s, pages = store
    f = FaultyStore(s, "flip", LAYER, page=1, offset=300, report=tmp_path / "planted-flip.json")
    reads = f.get(KEY, LAYER, 2)
    got = np.frombuffer(reads[1].data, np.uint8)
    assert np.flatnonzero(got != pages[1]).tolist() == [300 % 256]
    assert reads[0].data == pages[0].tobytes()
    assert read_planted(tmp_path)["flip"] == {"kind": "flip", "chunk": KEY, "layer": LAYER,
                                              "page_in_chunk": 1, "start": 32, "end": 64, "offset": 44}
    assert f.get(KEY, LAYER, 2)[1].data == pages[1].tobytes()  # planted once


def test_planted_drop_answers_missing_for_one_page(store) -> None:  # noqa: ANN001
    s, _ = store
    reads = FaultyStore(s, "drop", LAYER, page=0).get(KEY, LAYER, 2)
    assert reads[0].problem == "missing" and "planted drop" in reads[0].reason and reads[1].data
    with pytest.raises(ValueError, match="unknown planted fault 'smudge'"):
        FaultyStore(s, "smudge", LAYER)
