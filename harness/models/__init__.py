"""Models a gate can run: the committed tiny ones, any local HF checkpoint, or a hub id.

A model is named in records and goldens by name *and* content digest: a result is only true of
the weights it ran on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from harness.registry import UnknownName, unknown
from harness.workspace import Workspace

# Files whose bytes define a model's behaviour (weights, config, tokenizer).
DIGEST_GLOBS = ("config.json", "generation_config.json", "*.safetensors", "*.bin",
                "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                "special_tokens_map.json")


@dataclass(frozen=True)
class ModelRef:
    name: str
    """What the user typed: ``tiny-llama``, a folder, or a hub id."""
    path: str
    """What engines load: a local folder (or a hub id for users with a hub)."""
    digest: str
    """sha256 over the weights, config and tokenizer files (``hub:<id>`` when not local)."""

    @cached_property
    def _tokenizer(self):  # noqa: ANN202 - tokenizers.Tokenizer or a transformers tokenizer
        tj = Path(self.path) / "tokenizer.json"
        if tj.exists():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(tj))
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.path)

    @property
    def encode(self) -> Callable[[str], Sequence[int]]:
        tok = self._tokenizer
        if hasattr(tok, "encode") and type(tok).__module__.startswith("tokenizers"):
            return lambda text: tok.encode(text, add_special_tokens=False).ids
        return lambda text: tok.encode(text, add_special_tokens=False)

    @property
    def decode(self) -> Callable[[Sequence[int]], str]:
        tok = self._tokenizer
        return lambda ids: tok.decode(list(ids), skip_special_tokens=False)

    @property
    def slug(self) -> str:
        """A folder-safe name for goldens/records."""
        return self.name.strip("/").replace("/", "--")


def content_digest(folder: Path) -> str:
    h = hashlib.sha256()
    files = sorted({p for g in DIGEST_GLOBS for p in folder.glob(g) if p.is_file()})
    if not files:
        raise FileNotFoundError(f"{folder}: no model files (config.json, *.safetensors) found")
    for p in files:
        h.update(p.name.encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def builtin_models(ws: Workspace) -> list[str]:
    return sorted(p.name for p in ws.models.glob("*") if (p / "config.json").exists())


def resolve_model(name: str, ws: Workspace) -> ModelRef:
    """``name`` as a committed model, a local checkpoint folder, or a hub id (``org/name``)."""
    builtin = ws.models / name
    if (builtin / "config.json").exists():
        return ModelRef(name, str(builtin), content_digest(builtin))
    local = Path(name).expanduser()
    if (local / "config.json").exists():
        return ModelRef(name, str(local.resolve()), content_digest(local))
    if name.count("/") == 1 and not local.exists():
        try:
            from huggingface_hub import snapshot_download

            snap = Path(snapshot_download(name))
        except Exception as e:  # noqa: BLE001 - any hub failure gets the same explanation
            raise UnknownName(
                f"model {name!r} looks like a hub id but could not be fetched ({type(e).__name__}: "
                f"{str(e)[:200]}). Without a hub, use a committed model "
                f"({', '.join(builtin_models(ws))}) or a local checkpoint folder.") from None
        return ModelRef(name, str(snap), content_digest(snap))
    raise unknown("model", name, builtin_models(ws))
