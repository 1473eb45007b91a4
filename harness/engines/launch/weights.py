"""``weights=PATH``: an engine runs another checkpoint of the named model (converted, quantized,
fine-tuned, patched) and is gated against the named model's goldens.

``make gate MODEL=tiny-llama CANDIDATE=hf:weights=PATH`` asks "did my checkpoint break the model,
and where?": the goldens, the suite's token ids and the tokenizer are the named model's; only the
weights differ. That question only means something when PATH has the same architecture and
tokenizer, so :func:`checkpoint_for` refuses a checkpoint whose ``config.json`` differs in any field
that shapes the model, or whose tokenizer files differ, naming the field. A record names both
digests: the named model's (``Record.model``) and the weights' (the candidate's ``weights`` setting).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.api import EngineRefused
from harness.models import ModelRef, content_digest

FREE_CONFIG_FIELDS = frozenset({
    "_name_or_path", "transformers_version", "torch_dtype", "dtype", "quantization_config",
    "use_cache", "_attn_implementation_autoset"})
"""``config.json`` fields a checkpoint of the same model may change: how its weights are stored
(dtype, quantization) and bookkeeping. Every other field must be equal."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt")
FREE_TOKENIZER_FIELDS = frozenset({"name_or_path", "tokenizer_file"})


@dataclass(frozen=True, slots=True)
class Weights:
    """A checkpoint an engine loads instead of the named model's files."""

    path: str
    """As the user wrote it (a relative path stays relative in records)."""
    digest: str
    """Its content digest (:func:`harness.models.content_digest`)."""

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "digest": self.digest}


def _json(path: Path, what: str) -> Mapping[str, Any]:
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise EngineRefused(f"{what}: no {path.name} in {path.parent}") from None
    except (OSError, ValueError) as e:
        raise EngineRefused(f"{what}: {path} is not readable JSON: {e}") from None
    if not isinstance(d, dict):
        raise EngineRefused(f"{what}: {path} is not a JSON object")
    return d


def _short(v: Any, n: int = 80) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else repr(v)
    return text if len(text) <= n else text[:n] + "..."


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """The first path (``model.vocab['x']``) at which two JSON values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            here = f"{where}.{k}" if where else str(k)
            if k not in a or k not in b:
                side = "the weights" if k not in b else "the model"
                return f"{here} is missing in {side}'s file"
            d = first_difference(a[k], b[k], here)
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = first_difference(x, y, f"{where}[{i}]")
            if d is not None:
                return d
        return None
    return None if a == b else f"{where} is {_short(b)} in the weights, {_short(a)} in the model"


def check_config(model: ModelRef, folder: Path, what: str) -> None:
    mine, theirs = _json(Path(model.path) / "config.json", what), _json(folder / "config.json", what)
    a = {k: v for k, v in mine.items() if k not in FREE_CONFIG_FIELDS}
    b = {k: v for k, v in theirs.items() if k not in FREE_CONFIG_FIELDS}
    diff = first_difference(a, b)
    if diff is not None:
        raise EngineRefused(f"{what}: not the architecture of {model.name}: config.json field {diff}")


def check_tokenizer(model: ModelRef, folder: Path, what: str) -> None:
    """Every tokenizer file of the named model is in ``folder`` and says the same (JSON compared
    field by field, other files byte for byte)."""
    named = Path(model.path)
    present = [n for n in TOKENIZER_FILES if (named / n).exists()]
    if not present:
        return
    for name in present:
        mine, theirs = named / name, folder / name
        if not theirs.exists():
            raise EngineRefused(f"{what}: no {name} beside the weights (copy {model.name}'s tokenizer files "
                                f"there: the suite's token ids are {model.name}'s)")
        if name.endswith(".json"):
            a = {k: v for k, v in _json(mine, what).items() if k not in FREE_TOKENIZER_FIELDS}
            b = {k: v for k, v in _json(theirs, what).items() if k not in FREE_TOKENIZER_FIELDS}
            diff = first_difference(a, b)
            if diff is not None:
                raise EngineRefused(f"{what}: not the tokenizer of {model.name}: {name} field {diff}")
        elif mine.read_bytes() != theirs.read_bytes():
            raise EngineRefused(f"{what}: not the tokenizer of {model.name}: {name} differs")


def checkpoint_for(model: ModelRef, path: str, spec: str) -> Weights:
    """The checkpoint at ``path`` for an engine gated as ``model``, or :class:`EngineRefused` naming
    the config field or tokenizer file that makes it another model."""
    what = f"candidate {spec!r}" + ("" if path in spec else f" (weights={path})")
    folder = Path(path).expanduser()
    if not (folder / "config.json").exists():
        raise EngineRefused(f"{what}: not a checkpoint folder (no config.json)")
    check_config(model, folder, what)
    check_tokenizer(model, folder, what)
    return Weights(path, content_digest(folder))
