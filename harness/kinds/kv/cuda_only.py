"""A connector that cannot run on this host because it moves KV to CUDA, told from its engine's log.

vLLM's ExampleConnector up to at least 0.18 loads a saved page with ``.cuda()``
(``example_connector.py``, ``start_load_kv``): on a CPU host its consumer dies with torch's "Found no
NVIDIA driver". That is no verdict on the connector's KV handling, and no harness error either: the
connector cannot run on this device. :func:`cuda_only` reads the failed phase's log and, when it
ends in torch's CUDA-unavailable error, names the frame that asked for CUDA, so the round trip is a
named ``skip`` ("ExampleConnector needs CUDA: …/example_connector.py:193 in start_load_kv:
``… .cuda()``") instead of an engine error.
"""

from __future__ import annotations

import ast
import re

NO_CUDA = ("Found no NVIDIA driver", "Torch not compiled with CUDA enabled", "No CUDA GPUs are available")
"""torch's words for a CUDA call on a host without CUDA."""
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_PREFIX = re.compile(r"^\([^)]*\)\s*(?:ERROR \S+ \S+ \[[^\]]*\]\s*)?")
"""vLLM's engine-core prefix on a log line: ``(EngineCore_DP0 pid=1) ERROR 12-05 11:17:59 [core.py:9] ``."""


def cuda_only(log: str, connector: str) -> str | None:
    """Why ``connector`` cannot run here, when ``log`` ends in a CUDA call on a host without CUDA;
    None otherwise."""
    lines = [_PREFIX.sub("", line).rstrip() for line in log.splitlines()]
    last_error = max((i for i, line in enumerate(lines) if any(m in line for m in NO_CUDA)), default=None)
    if last_error is None:
        return None
    caller = None
    for i, line in enumerate(lines[:last_error]):
        m = _FRAME.search(line)
        if m is None or "/torch/" in m.group(1):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.search(lines[i + 1]) else ""
        caller = (m.group(1), m.group(2), m.group(3), code)
    error = lines[last_error].strip()
    if caller is None:
        return f"{connector} needs CUDA and this host has none ({error})"
    path, line_no, func, code = caller
    short = path.split("site-packages/", 1)[-1]
    return (
        f"{connector} needs CUDA and this host has none: {short}:{line_no} in {func}"
        + (f": `{code}`" if code else "")
        + f" ({error})"
    )


def cuda_calls_in_source(text: str, cls: str) -> list[str]:
    """Where the class ``cls`` in a module's source moves a tensor to CUDA (``x.cuda()``), as
    ``method:line``: read from a release's wheel before it is installed. A class that is not
    there, or makes no such call, gives nothing."""
    tree = ast.parse(text)
    found = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if found is None:
        return []
    out = []
    for method in found.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(method):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "cuda"
                and not node.args
            ):
                out.append(f"{method.name}:{node.lineno}")
    return out


def host_has_cuda() -> bool:
    """Whether this host can run a CUDA call (torch sees a device)."""
    import torch

    return bool(torch.cuda.is_available())
