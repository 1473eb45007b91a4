"""A model folder converted to another engine's format, once per model digest.

The converter is the engine's own (CTranslate2's transformers converter, ONNX Runtime GenAI's model
builder, optimum-intel's OpenVINO export), run by the engine's worker in the engine's venv
(``worker.py convert SOURCE DEST OPTIONS``) on the model's own folder: the oracle's weights, in
float32. The result is cached in the model cache::

    <model cache>/converted/<engine>-<version>/<model slug>-<digest[:12]>[-<options hash>]/
        conversion.json     what converted it, with which settings, in how many seconds

written last, in a temporary folder renamed into place, under a lock: a folder without
``conversion.json`` does not exist for the harness. A refusal (the converter does not know the
architecture) is :class:`~harness.api.EngineRefused` with the converter's words, never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.api import EngineFailed, EngineRefused
from harness.engines.launch.procs import kill_group, parent_death_signal, track
from harness.excerpt import clip, tail
from harness.files import locked
from harness.models import ModelRef
from harness.provenance import now_utc

STAMP = "conversion.json"
TIMEOUT_S = float(os.environ.get("HARNESS_CONVERT_TIMEOUT_S", "3600"))


@dataclass(frozen=True, slots=True)
class Converted:
    path: Path
    facts: Mapping[str, Any]
    """The converter's own facts plus ``convert_s`` (the conversion's wall time, when it ran)."""
    cached: bool
    """True when an earlier gate had converted it already."""

    def to_json(self) -> dict[str, Any]:
        return {"folder": self.path.name, "cached": self.cached, **self.facts}


def conversion_dir(cache: Path, engine: str, model: ModelRef, options: Mapping[str, Any]) -> Path:
    tail = ""
    if options:
        tail = "-" + hashlib.sha256(json.dumps(dict(options), sort_keys=True).encode()).hexdigest()[:8]
    return cache / "converted" / engine / f"{model.slug}-{model.digest[:12]}{tail}"


def ensure_converted(cache: Path, engine: str, python: Path, worker: Path, model: ModelRef,
                     options: Mapping[str, Any], what: str) -> Converted:
    """The converted folder of ``model`` for ``engine`` (``ctranslate2-4.8.5``), converting first if
    needed with the engine's worker under its own interpreter. ``what`` names the engine in
    messages."""
    def convert(source: Path, dest: Path, log: Path) -> dict[str, Any]:
        return _convert(python, worker, source, dest, options, log, what)

    return ensure_converted_by(cache, engine, model, options, convert)


def ensure_converted_by(cache: Path, engine: str, model: ModelRef, options: Mapping[str, Any],
                        convert: Callable[[Path, Path, Path], Mapping[str, Any]]) -> Converted:
    """The converted folder of ``model`` for ``engine``, made by ``convert(source, dest, log)`` (which
    returns its facts) on first use: under a lock, into a scratch folder renamed into place once
    its stamp is written, so a half-made conversion is never used."""
    folder = conversion_dir(cache, engine, model, options)
    with locked(folder.with_name(folder.name + ".lock")):
        if (folder / STAMP).exists():
            return Converted(folder, json.loads((folder / STAMP).read_text()), True)
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log = folder.with_name(folder.name + ".convert.log")
        t0 = time.perf_counter()
        try:
            out = dict(convert(Path(model.path), tmp, log))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        facts = {**out, "convert_s": round(time.perf_counter() - t0, 1), "created": now_utc(),
                 "model_digest": model.digest, "bytes": _size(tmp)}
        _write_json(tmp / STAMP, facts)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        return Converted(folder, facts, False)


def _convert(python: Path, worker: Path, source: Path, dest: Path, options: Mapping[str, Any], log: Path,
             what: str) -> dict[str, Any]:
    cmd = [str(python), str(worker), "convert", str(source), str(dest), json.dumps(dict(options))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("w") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, env=env, start_new_session=True,
                                preexec_fn=parent_death_signal())
        track(proc)
        try:
            stdout, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise EngineFailed(f"{what}: the conversion of {source.name} took over {TIMEOUT_S:.0f} s "
                               f"(log: {log})") from None
        finally:
            kill_group(proc)
    lines = [x for x in stdout.decode(errors="replace").splitlines() if x.startswith("{")]
    last = json.loads(lines[-1]) if lines else {}
    if proc.returncode == 3 and "refused" in last:
        raise EngineRefused(f"{what}: {last['refused']}")
    if proc.returncode != 0 or not lines:
        text = without_paths(log.read_text(errors="replace"), {
            str(python.parent.parent.parent): ".venvs", str(worker.parent): _in_repo(worker.parent),
            str(source): source.name, str(dest.parent): "converted"})
        raise EngineFailed(f"{what}: converting {source.name} failed (exit {proc.returncode}): "
                           f"{last_error(text)}", tail(text) + f"\n(the whole log: {log.name})")
    return last


def _in_repo(folder: Path) -> str:
    """``folder`` relative to the repository when it is inside it (a worker's folder)."""
    root = Path(__file__).resolve().parents[3]
    return str(folder.resolve().relative_to(root)) if folder.resolve().is_relative_to(root) else folder.name


def without_paths(text: str, places: Mapping[str, str]) -> str:
    """``text`` (a log, a traceback) with this machine's folders named by what they are, longest
    first, so records say ``.venvs/onnxruntime-genai-0.18.0/...``, not where the venvs lie here."""
    for place in sorted(places, key=len, reverse=True):
        if place and place != "/":
            text = text.replace(place, places[place])
    return text


def last_error(log: str) -> str:
    """The converter's own last error line (``KeyError: 'rope_type'``), else its last line."""
    lines = [x.strip() for x in log.splitlines() if x.strip()]
    errors = [x for x in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", x)]
    return clip(errors[-1] if errors else lines[-1] if lines else "no output")


def _write_json(path: Path, obj: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(obj), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
