"""What a vLLM engine process really runs on: its kernel libraries, ATen's CPU capability, and the
peak memory of its whole process tree, read from /proc while it still runs.

Standard library only at import (torch inside :func:`kernel_facts`): run by
:mod:`harness.engines.vllm.worker` under any vLLM release's interpreter.
"""

from __future__ import annotations

import os
from typing import Any


def _process_tree(root: int) -> list[int]:
    """``root`` and its live descendants (vLLM's engine-core and worker processes), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parent[int(entry)] = int(fh.read().rsplit(")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, todo = [root], [root]
    while todo:
        me = todo.pop()
        kids = [pid for pid, ppid in parent.items() if ppid == me]
        tree += kids
        todo += kids
    return tree


def kernel_facts() -> dict[str, Any]:
    """Which CPU kernels this engine really uses: vLLM's compiled libraries (``_C``,
    ``_C_AVX512``, ``_C_AVX2``: the one ``import_kernels`` chose) mapped into this process or its
    engine-core / worker processes (their /proc/<pid>/maps; Linux only), torch's ATen CPU
    capability, and what ``torch.cpu``'s feature probes answer (vLLM chooses libraries and
    attention/GEMM paths by them)."""
    libs: set[str] = set()
    seen = 0
    try:
        for pid in _process_tree(os.getpid()):
            try:
                with open(f"/proc/{pid}/maps") as fh:
                    names = {line.rsplit("/", 1)[-1].strip() for line in fh if "/vllm/_C" in line}
            except OSError:
                continue
            found = {n.split(".", 1)[0] for n in names if n.endswith(".so")}
            seen += bool(found)
            libs |= found
    except OSError:
        pass
    facts: dict[str, Any] = {"kernel_libraries": sorted(libs), "processes_with_kernels": seen}
    try:
        import torch

        facts["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        facts["cpu_probes"] = {name: bool(getattr(torch.cpu, f"_is_{name}_supported")())
                               for name in ("avx2", "avx512", "avx512_bf16", "amx_tile")
                               if hasattr(torch.cpu, f"_is_{name}_supported")}
    except Exception as e:  # noqa: BLE001 - facts for the record, never a reason to fail the run
        facts["error"] = f"{type(e).__name__}: {e}"
    return facts



def peak_rss_kib() -> dict[str, Any]:
    """Peak resident memory (``VmHWM``) of this process and of every process it started (vLLM's
    engine core), read from /proc while they still run."""
    def hwm(pid: int | str) -> int | None:
        try:
            with open(f"/proc/{pid}/status") as f:
                return next((int(x.split()[1]) for x in f if x.startswith("VmHWM:")), None)
        except OSError:
            return None

    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    me, kids, todo = os.getpid(), {}, [os.getpid()]
    while todo:
        p = todo.pop()
        for c, pp in parents.items():
            if pp == p and c not in kids:
                kids[c] = hwm(c)
                todo.append(c)
    own = hwm(me) or 0
    children = {str(c): v for c, v in kids.items() if v}
    return {"worker": own, "children": children, "total": own + sum(children.values())}


