"""The ``openai:<url>,key=value...`` spec -> :class:`OpenAIOptions`, and the request body every case
is sent with (the fields the harness owns, then the engine-specific ``body.<field>`` ones)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from harness.api import EngineRefused
from harness.sampling.transforms import CHAINS

OWNED = frozenset({"model", "prompt", "max_tokens", "logprobs", "stream", "stream_options", "echo", "n",
                   "best_of"})
"""Request fields the harness itself sets for every case; ``body.<field>`` may not replace them."""


@dataclass(frozen=True, slots=True)
class OpenAIOptions:
    """How to talk to one server (parsed from the candidate spec)."""

    base_url: str
    """Ends with ``/v1``."""
    concurrency: int = 1
    model: str | None = None
    key_env: str = "OPENAI_API_KEY"
    key_required: bool = False
    """True when ``key_env`` was named explicitly: then a missing variable is an error."""
    timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    retries: int = 2
    breaker: int = 3
    wait_s: float = 30.0
    stream: bool = True
    prompts: str = "auto"
    """``ids``, ``text`` or ``auto`` (ids; text when the server refuses ids)."""
    body: tuple[tuple[str, Any], ...] = ()
    """Engine-specific request fields (``body.<field>=<value>``), sent with every request."""
    chain: str = "vllm"
    """The sampler chain the server documents (:data:`harness.sampling.transforms.CHAINS`): what
    the sampling gate judges its draws against."""
    logprobs_mode: str = "raw_logprobs"
    """Which logprobs its draws come with (vLLM's ``--logprobs-mode``; its default is raw)."""
    probe: bool = False
    """The API gate may send this server requests that could kill it (``probe=yes``: the user says
    so; a server the harness starts itself is always probed)."""

    def settings(self) -> dict[str, Any]:
        """For the record: everything but the key itself."""
        return {"base_url": self.base_url, "concurrency": self.concurrency, "model": self.model,
                "api_key_env": self.key_env, "api_key_set": bool(os.environ.get(self.key_env)),
                "timeout_s": self.timeout_s, "request_timeout_s": self.request_timeout_s,
                "retries": self.retries, "breaker": self.breaker, "stream": self.stream,
                "prompts": self.prompts, "body": dict(self.body)}

    def request_fields(self) -> dict[str, Any]:
        """The sampling fields every request carries (the engine-specific ``body`` ones included)."""
        return {"temperature": 0.0, "seed": 0, **dict(self.body)}

    def completion_body(self, model: str | None, prompt: Sequence[int] | str, max_tokens: int, logprobs: int,
                        extras: Mapping[str, Any], stream: bool) -> dict[str, Any]:
        """One ``/v1/completions`` request: the prompt as ids (or text), greedy, ``logprobs`` top-k."""
        body: dict[str, Any] = {"model": model,
                                "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
                                "max_tokens": max_tokens}
        if logprobs > 0:
            body["logprobs"] = logprobs
        body.update(extras)
        body.update(self.request_fields())
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body


OPTION_KEYS = ("c", "model", "key_env", "timeout", "request_timeout", "retries", "breaker", "wait",
               "stream", "prompts", "chain", "logprobs_mode", "probe", "body.<field>")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits", "none")


def body_value(text: str) -> Any:
    """``body.<field>=<value>``: a JSON value (``1.0``, ``true``, ``null``, ``"x"``, ``[1, 2]``),
    else the text as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_openai_spec(spec: str, arg: str | None, concurrency: int = 1) -> OpenAIOptions:
    """``openai:<url>[,key=value...]`` -> options; every mistake names the spec and the option."""
    if not arg:
        raise EngineRefused(f"candidate {spec!r}: give the server's base URL, "
                            f"e.g. openai:http://127.0.0.1:8000")
    url, *rest = arg.split(",")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineRefused(f"candidate {spec!r}: {url!r} is not an http(s) URL")
    if parts.username or parts.password:
        raise EngineRefused(f"candidate {spec!r}: put credentials in an environment variable "
                            f"(key_env=NAME), not in the URL: specs are written into records")
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    opts: dict[str, Any] = {"base_url": base, "concurrency": concurrency}
    body: dict[str, Any] = {}
    for part in rest:
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if eq and key.startswith("body.") and len(key) > 5:
            field_name = key[5:]
            if field_name in OWNED:
                raise EngineRefused(f"candidate {spec!r}: body.{field_name} is set by the harness for every "
                                    f"case; it cannot be replaced")
            body[field_name] = body_value(value)
            continue
        if not eq or key not in OPTION_KEYS:
            raise EngineRefused(f"candidate {spec!r}: option {part!r} is not one of "
                                f"{', '.join(k + '=' for k in OPTION_KEYS)}")
        try:
            if key == "c":
                opts["concurrency"] = int(value)
            elif key in ("timeout", "request_timeout", "wait"):
                opts[{"timeout": "timeout_s", "request_timeout": "request_timeout_s",
                      "wait": "wait_s"}[key]] = float(value)
            elif key in ("retries", "breaker"):
                opts[key] = int(value)
            elif key == "probe":
                if value.lower() not in ("yes", "no"):
                    raise ValueError(value)
                opts["probe"] = value.lower() == "yes"
            elif key == "stream":
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                opts["stream"] = value.lower() == "true"
            elif key == "key_env":
                opts["key_env"], opts["key_required"] = value, True
            elif key == "prompts":
                if value not in ("ids", "text", "auto"):
                    raise ValueError(value)
                opts["prompts"] = value
            elif key == "chain" and value not in CHAINS:
                raise EngineRefused(f"candidate {spec!r}: chain {value!r} is not one of {', '.join(CHAINS)}")
            elif key == "logprobs_mode" and value not in LOGPROBS_MODES:
                raise EngineRefused(f"candidate {spec!r}: logprobs_mode {value!r} is not one of "
                                    f"{', '.join(LOGPROBS_MODES)}")
            else:
                opts[key] = value
        except ValueError:
            raise EngineRefused(f"candidate {spec!r}: option {key}={value!r} is not a valid value") from None
    o = OpenAIOptions(**opts, body=tuple(body.items()))
    if o.concurrency < 1 or o.retries < 0 or o.breaker < 1 or o.timeout_s <= 0:
        raise EngineRefused(f"candidate {spec!r}: c and breaker must be >= 1, retries >= 0, timeout > 0")
    return o
