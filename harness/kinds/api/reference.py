"""The host-side reference: transformers' ``apply_chat_template`` renders, its tokenizer's decode, and
the model's raw next-token logprobs (float32), read from the model folder the servers serve."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.models.digest import TEMPLATE_FILE


@dataclass(frozen=True, slots=True)
class TemplateFacts:
    """Which chat template the reference renders with, for the record."""

    source: str
    """``chat_template.jinja`` (the file beside the tokenizer), ``tokenizer_config.json`` or ``none``."""
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "sha256": self.sha256}


def template_facts(folder: Path, tokenizer: Any) -> TemplateFacts:
    path = folder / TEMPLATE_FILE
    if path.is_file():
        return TemplateFacts(TEMPLATE_FILE, hashlib.sha256(path.read_bytes()).hexdigest())
    text = getattr(tokenizer, "chat_template", None)
    if isinstance(text, str) and text:
        return TemplateFacts("tokenizer_config.json", hashlib.sha256(text.encode()).hexdigest())
    return TemplateFacts("none", "")


@dataclass(eq=False)
class Reference:
    """transformers on the model's folder. The model itself loads on the first :meth:`raw_logprobs`."""

    folder: Path
    tokenizer: Any = None
    _model: Any = field(default=None, repr=False)
    _rows: dict[tuple[tuple[int, ...], tuple[int, ...]], list[list[float]]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))

    @property
    def template(self) -> TemplateFacts:
        return template_facts(self.folder, self.tokenizer)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        generation_prompt: bool = True,
    ) -> list[int]:
        """``apply_chat_template(..., add_generation_prompt=generation_prompt)`` as token ids."""
        out = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=True,
            return_dict=False,
        )
        if isinstance(out, Mapping):  # some releases return a BatchEncoding
            out = out["input_ids"]
        return [int(t) for t in out]

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=True)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def piece(self, token: int) -> str:
        return self.decode([token], skip_special_tokens=False)

    def special_ids(self) -> list[int]:
        return sorted(int(t) for t in self.tokenizer.all_special_ids)

    def raw_logprobs(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[list[float]]:
        """Per continuation position, the full raw log-softmax row before that token (float32); each
        sequence is computed once (every planted control judges the same replies again)."""
        key = (tuple(prompt), tuple(continuation))
        if key not in self._rows:
            self._rows[key] = self._forward(prompt, continuation)
        return self._rows[key]

    def _forward(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[list[float]]:
        import torch

        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(str(self.folder), dtype=torch.float32)
            self._model.eval()
        ids = torch.tensor([list(prompt) + list(continuation)])
        with torch.no_grad():
            logits = self._model(ids).logits[0].float()
        rows = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) - 1 + len(continuation)]
        return [r.tolist() for r in rows]
