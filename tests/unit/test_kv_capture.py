"""Capture files: what the writer appends, the reader gives back; damage is named, not skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.kinds.kv.capture import CaptureError, PageTag, read_capture
from harness.kinds.kv.capture_write import CaptureWriter, SchedulerLog
from harness.kv_pages.digest import page_digests
from harness.kv_pages.identity import PageRef


def refs(n: int) -> list[PageRef]:
    return [PageRef(f"k{i:031d}", "model.layers.0.self_attn.attn", 0, 32 * i, 32 * (i + 1)) for i in range(n)]


def write(folder: Path, n: int = 3, keep: list[bool] | None = None) -> torch.Tensor:
    data = torch.randn(n, 1, 32, 128, generator=torch.Generator().manual_seed(0))
    w = CaptureWriter(folder)
    w.pages("written", refs(n), [PageTag("r0", "c01", "clean")] * n, data, keep_bytes=keep, step=1)
    w.error("restored", refs(1)[0], PageTag("r1", "c01", "clean"), "truncated", "x.kv: cut short")
    w.close()
    log = SchedulerLog(folder)
    log.write("request", req="r1", case="c01", lane="clean", prompt_len=70, local_hit=0, matched=64,
              external=64, **{"async": False})
    log.write("setup", groups=[{"index": 0, "block_size": 32, "layers": ["l0"], "paged": True}], tp=1)
    log.write("store_problem", req="r2", case="c02", lane="clean", kind="unreadable",
              reason="store folder run/store does not exist")
    return data


def test_pages_read_back_byte_for_byte_with_their_engine_digests(tmp_path: Path) -> None:
    data = write(tmp_path)
    cap = read_capture(tmp_path)
    assert len(cap.side("written")) == 3 and not cap.side("restored")
    digests = page_digests(data)
    for i, p in enumerate(cap.side("written")):
        assert p.ref == refs(3)[i] and p.tag == PageTag("r0", "c01", "clean")
        assert p.digest == digests[i] and p.read() == data[i].numpy().tobytes()
        assert p.dtype == "float32" and p.shape == (1, 32, 128) and p.check_present() is None
    assert cap.problems[0].kind == "truncated" and cap.problems[0].ref == refs(1)[0]
    assert cap.requests[0].external == 64 and cap.setup["tp"] == 1
    assert [(s["case"], s["kind"]) for s in cap.store_problems] == [("c02", "unreadable")]
    assert cap.captured_bytes == 3 * 16384 and cap.capture_seconds > 0 and cap.malformed == ()


def test_duplicates_keep_a_digest_but_no_bytes(tmp_path: Path) -> None:
    write(tmp_path, keep=[True, False, True])
    p = read_capture(tmp_path).side("written")[1]
    assert p.offset is None and p.digest
    with pytest.raises(CaptureError, match="only its digest was kept"):
        p.read()


def test_a_truncated_bin_is_named_for_each_page_it_cuts(tmp_path: Path) -> None:
    write(tmp_path)
    binf = tmp_path / "worker-0.pages.bin"
    binf.write_bytes(binf.read_bytes()[: 16384 + 100])
    pages = read_capture(tmp_path).side("written")
    assert pages[0].check_present() is None
    assert "truncated" in (pages[1].check_present() or "") and "truncated" in (pages[2].check_present() or "")
    with pytest.raises(CaptureError, match=r"worker-0\.pages\.bin: truncated"):
        pages[1].read()
    binf.unlink()
    assert "missing" in (pages[0].check_present() or "")


def test_malformed_lines_are_listed_with_file_and_line(tmp_path: Path) -> None:
    write(tmp_path)
    with (tmp_path / "worker-0.pages.jsonl").open("a") as f:
        f.write('{"t": "page", "side": "written"}\nnot json\n')
    cap = read_capture(tmp_path)
    assert len(cap.side("written")) == 3
    where = [m.split(":")[:2] for m in cap.malformed]
    assert where == [["worker-0.pages.jsonl", "6"], ["worker-0.pages.jsonl", "7"]]


def test_a_missing_capture_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="no capture folder"):
        read_capture(tmp_path / "capture" / "consumer")
