"""A model's identity: the sha256 over the files whose bytes define its behaviour."""

from __future__ import annotations

import hashlib
from pathlib import Path

# Files whose bytes define a model's behaviour (weights, config, tokenizer). ``chat_template.jinja``
# is left out on purpose: the token gates never render a chat, so a template must not move their
# digests or goldens; the API gate records the template's own digest (TEMPLATE_FILE).
TEMPLATE_FILE = "chat_template.jinja"
DIGEST_GLOBS = ("config.json", "generation_config.json", "*.safetensors", "*.bin",
                "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                "special_tokens_map.json")


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
