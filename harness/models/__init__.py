"""Models a gate can run: a named one (:mod:`harness.models.named`: the committed tiny families and
trained models built on first use), any local HF checkpoint, or a hub id.

A model is named in records and goldens by name *and* content digest: a result is only true of
the weights it ran on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from harness.excerpt import clip
from harness.models.arch import ModelLimits
from harness.models.built import ModelBuildError
from harness.models.digest import DIGEST_GLOBS, content_digest
from harness.models.named import MODELS, ModelInfo
from harness.registry import UnknownName, unknown
from harness.workspace import Workspace

__all__ = ["DIGEST_GLOBS", "MODELS", "ModelBuildError", "ModelInfo", "ModelLimits", "ModelRef",
           "builtin_models", "content_digest", "known_digest", "resolve_model"]

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

    @cached_property
    def limits(self) -> ModelLimits:
        """Vocabulary and context the suites must fit in (from config.json)."""
        return ModelLimits.of(self.path)

    @property
    def slug(self) -> str:
        """A folder-safe name for goldens/records."""
        return self.name.strip("/").replace("/", "--")


def builtin_models(ws: Workspace) -> list[str]:
    """Every name ``--model`` accepts without a path: the registered models, and any other folder
    under ``models/`` holding a checkpoint."""
    extra = {p.name for p in ws.models.glob("*") if (p / "config.json").exists()}
    return sorted(set(MODELS.names()) | extra)


def known_digest(name: str, ws: Workspace) -> str | None:
    """The digest ``name`` resolves to, without building anything: a committed folder's content
    digest, a built model's pinned one; None for anything else."""
    if name in MODELS and (info := MODELS.entry(name).meta).source == "built":
        return info.digest
    folder = ws.models / name
    return content_digest(folder) if (folder / "config.json").exists() else None


def resolve_model(name: str, ws: Workspace) -> ModelRef:
    """``name`` as a registered model (built on first use if it is a built one), a folder under
    ``models/``, a local checkpoint folder, or a hub id (``org/name``)."""
    if name in MODELS:
        folder = MODELS.get(name)(ws)
        return ModelRef(name, str(folder), content_digest(folder))
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
                f"{clip(str(e))}). Without a hub, use a named model "
                f"({', '.join(builtin_models(ws))}) or a local checkpoint folder.") from None
        return ModelRef(name, str(snap), content_digest(snap))
    raise unknown("model", name, builtin_models(ws))
