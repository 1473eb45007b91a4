"""The harness's own KV store: chunks of pages in a folder, each page checked on read.

A chunk is ``chunk_size`` tokens (a whole number of engine blocks) of one layer, named by the key
of its token prefix. Layout under the store root::

    <key[:2]>/<key>/<layer>.kv     the chunk's pages back to back, raw bytes
    <key[:2]>/<key>/<layer>.json   key, token range, page size, dtype, shape, one digest per page

Both files are written to a temporary name and renamed, ``.json`` last, so a chunk is visible only
once complete; a write that fails (no space, a read-only folder) removes what it wrote and raises.
``get`` never raises for a bad chunk: it answers per page, with a named problem
(``missing``, ``truncated``, ``corrupt``) for each page it cannot vouch for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.kv_pages.digest import digest_bytes, matches


@dataclass(frozen=True, slots=True)
class PageRead:
    """One page of a chunk as the store served it: bytes, or why not."""

    data: bytes | None
    problem: str | None = None
    """``missing``, ``truncated`` or ``corrupt``."""
    reason: str = ""


def _safe(layer: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in layer)


class PageStore:
    """A folder of chunks; one instance per process, any number of processes over one folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def chunk_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def has(self, key: str, layers: Sequence[str]) -> bool:
        """True when every layer of the chunk was stored (the ``.json`` is written last)."""
        d = self.chunk_dir(key)
        return all((d / f"{_safe(layer)}.json").exists() for layer in layers)

    def put(self, key: str, layer: str, pages: np.ndarray, digests: Sequence[str],
            meta: dict[str, Any]) -> Path:
        """Store one layer of a chunk: ``pages`` is [P, page_nbytes] uint8."""
        if pages.ndim != 2 or pages.dtype != np.uint8 or len(digests) != pages.shape[0]:
            raise ValueError(f"put({key}, {layer}): pages must be [P, nbytes] uint8 with P digests")
        d = self.chunk_dir(key)
        base = _safe(layer)
        tmp = d / f".{base}.{os.getpid()}.tmp"
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(np.ascontiguousarray(pages).tobytes())
            os.replace(tmp, d / f"{base}.kv")
            info = {**meta, "key": key, "layer": layer, "pages": int(pages.shape[0]),
                    "page_nbytes": int(pages.shape[1]), "digests": list(digests)}
            tmp.write_text(json.dumps(info, sort_keys=True))
            os.replace(tmp, d / f"{base}.json")
        except OSError:
            # a store that failed mid-write (no space, read-only, I/O error) leaves no half chunk
            # behind that a reader could take for whole: the index (.json) is never published
            for p in (tmp, d / f"{base}.kv"):
                try:
                    p.unlink()
                except OSError:
                    pass
            raise
        return d / f"{base}.kv"

    def meta(self, key: str, layer: str) -> dict[str, Any]:
        path = self.chunk_dir(key) / f"{_safe(layer)}.json"
        return json.loads(path.read_text())

    def get(self, key: str, layer: str, n_pages: int) -> list[PageRead]:
        """The ``n_pages`` pages of one layer of a chunk, each verified against its digest."""
        d = self.chunk_dir(key)
        meta_path, data_path = d / f"{_safe(layer)}.json", d / f"{_safe(layer)}.kv"
        rel = f"{key[:2]}/{key}/{_safe(layer)}"

        def all_pages(problem: str, reason: str) -> list[PageRead]:
            return [PageRead(None, problem, reason) for _ in range(n_pages)]

        try:
            info = json.loads(meta_path.read_text())
            digests = list(info["digests"])
            page_nbytes = int(info["page_nbytes"])
        except FileNotFoundError:
            return all_pages("missing", f"{rel}.json: not in the store")
        except (OSError, ValueError, KeyError, TypeError) as e:
            return all_pages("corrupt", f"{rel}.json: unreadable ({type(e).__name__}: {e})")
        if len(digests) != n_pages:
            return all_pages("corrupt", f"{rel}.json: holds {len(digests)} pages, expected {n_pages}")
        try:
            blob = data_path.read_bytes()
        except FileNotFoundError:
            return all_pages("missing", f"{rel}.kv: not in the store")
        except OSError as e:
            return all_pages("corrupt", f"{rel}.kv: unreadable ({e})")
        want = page_nbytes * n_pages
        if len(blob) > want:
            return all_pages("corrupt", f"{rel}.kv: {len(blob)} bytes, expected {want}")
        out = []
        for i, digest in enumerate(digests):
            page = blob[i * page_nbytes:(i + 1) * page_nbytes]
            if len(page) < page_nbytes:
                out.append(PageRead(None, "truncated", f"{rel}.kv: page {i} is cut short "
                                    f"({len(blob)} of {want} bytes in the file)"))
            elif matches(page, digest) is False:  # by the algorithm the digest names
                out.append(PageRead(None, "corrupt", f"{rel}.kv: page {i} digest "
                                    f"{digest_bytes(page, digest.split(':', 1)[0])} but the store "
                                    f"recorded {digest}"))
            else:
                out.append(PageRead(page))
        return out

    def chunk_keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.glob("*/*") if p.is_dir())
