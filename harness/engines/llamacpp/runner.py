"""``llamacpp``: llama.cpp (through llama-cpp-python's OpenAI server) as a candidate, on the very
weights the oracle runs.

The harness builds ``llama-cpp-python[server]`` into ``.venvs/llama-cpp-python-<version>/`` on first
use (llama.cpp compiled from source: minutes, once; :mod:`harness.engines.llamacpp.venv`), starts
``python -m llama_cpp.server`` on 127.0.0.1 and a free port with ``--logits_all true``, gates it over
HTTP through :class:`~harness.engines.openai.OpenAIRunner` and stops its process group when the run
ends, however it ends. Options, comma-separated:

===================  ==========================================================================
``gguf=f32``         (default) a F32 GGUF the harness writes from the model's safetensors: the
                     oracle's weights bit for bit, so only the engines differ
``gguf=f16``         the same in F16 (norms stay F32)
``gguf=source``      the GGUF the model was built from (the ``*.gguf`` in its folder); a
                     quantization name (``gguf=q4_1``) also checks the file is of that type
``gguf=<path>``      any GGUF file
``c=N``              requests in flight (the server answers one at a time)
``version=X.Y.Z``    the llama-cpp-python release (default :data:`VERSION`)
``body.<field>=v``   a request field, as for ``openai:`` (default ``body.repeat_penalty=1.0``;
                     ``body.repeat_penalty=`` sends none: the server's default applies)
``prefix_cache=on``  (default) ``make sampling`` only: the draws the seed lanes replay run through
                     ``Llama.generate`` with the prefix it holds, as the server does; ``off`` resets
                     it first, so every prompt is evaluated whole (the gate refuses ``off``)
``<flag>=v``         passed to the server as ``--<flag> v`` (``n_ctx=8192``, ``n_batch=256``)
===================  ==========================================================================

Greedy by default: llama-cpp-python's ``/v1/completions`` applies ``repeat_penalty`` 1.1 unless the
request says otherwise, and with ``temperature: 0`` its sampler is *penalties, then greedy* — so
"temperature 0" alone does not pick the model's top-1 (``top_k=1`` changes nothing: top-k is not
in the greedy chain). The harness sends ``repeat_penalty: 1.0``; the greedy self-check would catch
a server that still does not decode greedily.

The server refuses token-id prompts (HTTP 422) and keys logprobs by token text, so prompts go as
text with the tokenization read back through ``/extras/tokenize``, and token texts are mapped to ids
through the model's tokenizer (:mod:`harness.engines.openai`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.api import EngineFailed, EngineInfo, EngineRefused
from harness.engines.base import ENGINES, RunnerContext, parse_options
from harness.engines.launch.gguf_export import KINDS, GGUFExportError, GGUFFile, export_gguf, exportable
from harness.engines.launch.loopback import LoopbackServer
from harness.engines.launch.venvs import STAMP, VenvError, VenvInfo
from harness.engines.llamacpp.sampler import LlamaCppSampling
from harness.engines.llamacpp.venv import ensure_llamacpp_venv, llamacpp_dir
from harness.engines.openai import OWNED, OpenAIOptions, body_value
from harness.engines.openai.managed import ManagedServerRunner, ServerSpeedLevels
from harness.files import sha256_file
from harness.models import ModelRef
from harness.workspace import REPO_ROOT

VERSION = "0.3.36"
GREEDY_BODY: Mapping[str, Any] = {"repeat_penalty": 1.0}
"""What llama-cpp-python needs besides ``temperature: 0`` to decode greedily (see module doc)."""
N_CTX = 4096
START_TIMEOUT_S = float(os.environ.get("HARNESS_LLAMACPP_START_TIMEOUT_S", "600"))


def gguf_sources() -> Mapping[str, Any]:
    """Named models built from a GGUF file in a pinned PyPI wheel -> that pin (harness.models)."""
    from harness.models.named import SMOLLM2_WHEEL

    return {"smollm2-135m": SMOLLM2_WHEEL}


def source_gguf(model: ModelRef, scratch: Path | None = None) -> Path | None:
    """The GGUF ``model`` was built from: the one ``*.gguf`` file in its folder, else — for a named
    model built from a pinned wheel — that wheel's member, taken from the model cache's download
    (checked against its pinned sha256) into ``scratch``; None when there is none."""
    folder = Path(model.path)
    found = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
    if len(found) == 1:
        return found[0]
    pin = gguf_sources().get(model.name)
    if pin is None or scratch is None:
        return None
    from harness.models.built import extract_member, fetch_wheel

    dest = scratch / f"{model.slug}-source-{pin.member_sha256[:12]}.gguf"
    if not dest.exists():
        scratch.mkdir(parents=True, exist_ok=True)
        wheel = fetch_wheel(pin, folder.parent)  # built models live in the model cache, downloads beside
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            extract_member(pin, wheel, tmp)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest


def gguf_type(path: Path) -> str:
    """The file's predominant tensor type, lower case (``q4_1``, ``f32``)."""
    from collections import Counter

    import gguf

    r = gguf.GGUFReader(str(path))
    counts = Counter(t.tensor_type.name.lower() for t in r.tensors if len(t.shape) > 1)
    return counts.most_common(1)[0][0] if counts else "unknown"


class LlamaCppServer(LoopbackServer):
    label = "llama.cpp server"
    kind = "llamacpp-server"
    health_path = "/v1/models"

    def __init__(self, python: str, gguf: Path, alias: str, flags: Mapping[str, str],
                 log_path: Path | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        super().__init__(log_path=log_path, start_timeout_s=start_timeout_s)
        self.python = python
        self.gguf = gguf
        self.alias = alias
        self.model_name = alias
        self.flags = dict(flags)

    def args(self) -> list[str]:
        out = ["--model_alias", self.alias]
        for key, value in self.flags.items():
            out += [f"--{key}", str(value)]
        return out

    def command(self) -> list[str]:
        return [self.python, "-m", "llama_cpp.server", "--model", str(self.gguf), *self.args(),
                "--host", self.host, "--port", str(self.port)]


class LlamaCppRunner(ServerSpeedLevels, ManagedServerRunner, LlamaCppSampling):
    """``llamacpp[:options]``: build (once), write the GGUF (once), start the server, gate, stop.
    Its sampler draws in the venv, without a server (:mod:`harness.engines.llamacpp.sampler`)."""

    tensors_why_not = "llama.cpp's server answers tokens and logprobs over HTTP, never its hidden states"

    def __init__(self, model: ModelRef, options: Mapping[str, str], name: str = "llamacpp",
                 run_dir: Path | None = None, concurrency: int = 1, repo_root: Path = REPO_ROOT) -> None:
        super().__init__(model, options, name, run_dir, concurrency)
        opts = self.options
        self.version = opts.pop("version", VERSION)
        try:
            llamacpp_dir(repo_root, self.version)
        except VenvError as e:
            raise EngineRefused(f"candidate {name!r}: {e}") from None
        self.gguf_choice = opts.pop("gguf", "f32")
        cache = opts.pop("prefix_cache", "on")
        if cache not in ("on", "off"):
            raise EngineRefused(f"candidate {name!r}: prefix_cache must be on or off, not {cache!r}")
        self.prefix_cache = cache == "on"
        body = dict(GREEDY_BODY)
        for key in [k for k in opts if k.startswith("body.")]:
            field_name = key[5:]
            if field_name in OWNED or not field_name:
                raise EngineRefused(f"candidate {name!r}: {key} is set by the harness for every case")
            value = opts.pop(key)
            if value == "":
                body.pop(field_name, None)  # left to the server's default
            else:
                body[field_name] = body_value(value)
        self.body = body
        self.flags = {"logits_all": "true", "n_ctx": str(N_CTX), "n_threads": str(os.cpu_count() or 1),
                      **opts}
        self.repo_root = repo_root
        self.venv: VenvInfo | None = None
        self.gguf: GGUFFile | None = None

    def info(self) -> EngineInfo:
        """settings: what decides the results (which GGUF, server flags, request fields);
        environment: the build, the file's facts, how the server was talked to."""
        settings: dict[str, Any] = {"gguf": self.gguf_choice, "server_flags": dict(self.flags),
                                    "body": dict(self.body), "prefix_cache": self.prefix_cache}
        env: dict[str, Any] = {}
        if self.gguf is not None:
            settings["gguf_sha256"] = self.gguf.facts.get("sha256")
            env["gguf"] = self.gguf.to_json()
        if self.venv is not None:
            env["venv"] = {k: v for k, v in self.venv.to_json().items() if k != "path"}
        if self.client is not None:
            base = self.client.info()
            keep = ("model", "prompts", "concurrency", "stream")
            settings.update({k: v for k, v in base.settings.items() if k in keep})
            env.update({k: v for k, v in base.environment.items() if k == "protocol"})
        return EngineInfo(self.name, "llama.cpp", f"llama-cpp-python {self.version}", settings=settings,
                          environment=env)

    def prepare(self) -> tuple[VenvInfo, GGUFFile]:
        """The build and the GGUF, made first when missing (what ``start`` serves, and what the
        sampler loads in-process with the same ``llama_cpp``)."""
        t0 = time.perf_counter()
        folder = llamacpp_dir(self.repo_root, self.version)
        if not (folder / STAMP).exists():
            print(f"{self.name}: building llama-cpp-python=={self.version} into {folder} (llama.cpp from "
                  f"source: minutes, once; log: {folder.name}.install.log beside it)", file=sys.stderr)
        try:
            self.venv = ensure_llamacpp_venv(self.repo_root, self.version)
        except VenvError as e:
            raise EngineFailed(f"{self.name}: cannot build llama-cpp-python=={self.version}: {e}") from None
        self.timings["venv_ready_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.gguf = self._gguf()
        self.timings["gguf_ready_s"] = time.perf_counter() - t0
        return self.venv, self.gguf

    def preflight(self) -> None:
        """A GGUF the harness would write but cannot (an architecture its export does not write) is
        refused from ``config.json`` before anything starts, in the words ``start`` would use."""
        if self.gguf_choice in KINDS:
            try:
                exportable(Path(self.model.path))
            except GGUFExportError as e:
                raise EngineRefused(f"{self.name}: {e}") from None

    def start(self) -> None:
        if not self.prefix_cache:
            raise EngineRefused(f"{self.name}: prefix_cache=off is the sampler's (make sampling): the "
                                "server always reuses the prefix it holds")
        self.prepare()
        assert self.venv is not None and self.gguf is not None
        self.start_server(LlamaCppServer(str(self.venv.python), self.gguf.path, self.model.name, self.flags,
                                         log_path=self.server_log("llamacpp-")))
        self.connect(OpenAIOptions(self.base_url, self.concurrency, model=self.model.name,
                                   body=tuple(self.body.items())))

    def _gguf(self) -> GGUFFile:
        choice = self.gguf_choice
        try:
            source = source_gguf(self.model, self.run_dir / "gguf" if self.run_dir else None)
        except Exception as e:  # noqa: BLE001 - a missing or corrupt download is the engine's failure
            raise EngineFailed(f"{self.name}: the GGUF {self.model.name} was built from: {e}") from None
        if choice in KINDS:
            if self.run_dir is None:
                raise EngineRefused(f"{self.name}: gguf={choice} needs a run folder to write the GGUF in")
            try:
                return export_gguf(Path(self.model.path), choice, self.run_dir / "gguf", self.model.name,
                                   self.model.digest, source=source)
            except GGUFExportError as e:
                raise EngineRefused(f"{self.name}: {e}") from None
        path = Path(choice).expanduser() if choice.endswith(".gguf") else source
        if path is None or not path.is_file():
            raise EngineRefused(
                f"{self.name}: gguf={choice}: " + (f"no such file {choice}" if choice.endswith(".gguf") else
                f"{self.model.name} has no GGUF it was built from (a *.gguf in its folder, or a "
                f"named model built from one); "
                f"use gguf=f32, gguf=f16 or gguf=<path>"))
        kind = gguf_type(path)
        if choice not in ("source",) and not choice.endswith(".gguf") and kind != choice.lower():
            raise EngineRefused(f"{self.name}: gguf={choice}, but {path.name} holds {kind} tensors")
        return GGUFFile(path, "source" if not choice.endswith(".gguf") else "path",
                        {"tensor_type": kind, "bytes": path.stat().st_size, "sha256": sha256_file(path)})



@ENGINES.register("llamacpp", help="llama.cpp's server on the model's weights, built on first use "
                                   "(llamacpp:gguf=f32|f16|q4_1|<path>)")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> LlamaCppRunner:
    return LlamaCppRunner(model, parse_options(arg, spec), name=ctx.name or spec, run_dir=ctx.run_dir,
                          concurrency=ctx.concurrency or 1)
