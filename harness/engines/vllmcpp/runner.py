"""``vllmcpp``: vllm.cpp, the C++20 port of vLLM's V1 engine, built from the user's source and
driven token by token through a worker of the harness's own.

``make gate MODEL=tiny-llama CANDIDATE=vllmcpp:src=PATH`` (PATH: a vllm.cpp checkout or a .tar.gz
of one; or ``$HARNESS_VLLMCPP_SRC``) builds vllm.cpp once into the build cache
(:mod:`harness.engines.vllmcpp.build`, ~15 minutes on 2 cores), converts the model's weights to
what vllm.cpp loads, and runs the harness's worker (``vllmcpp/vllmcpp_worker.cpp``, compiled
against that build) over the suite: every request submitted at once, so the engine's own scheduler
batches them. Options, comma-separated:

=================  ===========================================================================
``src=PATH``       the vllm.cpp source (else ``$HARNESS_VLLMCPP_SRC``)
``dtype=float32``  the model's float32 safetensors as they are (default ``bfloat16``: converted)
``gguf=f16``       a GGUF the harness writes from the model's safetensors (``f16``, ``q8_0``,
                   ``f32``), loaded by vllm.cpp's GGUF path; default: BF16 safetensors
``num_blocks=N``   KV-cache blocks (default 256) · ``max_num_seqs=N`` (default 8) ·
                   ``block_size=N`` (default 32)
=================  ===========================================================================

What vllm.cpp offers at the source this was written for, and what the harness does about it:

* its dense loader takes **BF16 safetensors only** (``expected BF16 for model.embed_tokens.weight``):
  the runner converts the oracle's float32 weights to BF16 (cached by model digest). Judge it with
  ``smoke`` (float32 goldens; near-tie forgives the rounding's near-ties) and strictly with
  ``smoke_bf16`` (goldens the pinned vLLM records in bfloat16);
* its engine takes **text prompts only**: the worker sends the text of the oracle's ids and reports
  the ids the engine made of it, so the tokenizer verdict comes first (:mod:`harness.kinds.parity.checks`);
* it returns **no logprobs**: strict and near-tie are judged (near-tie reads the oracle's logprobs at
  the divergence); KL, NMSE and drift are impossible, and the record says why.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.capabilities import Capabilities
from harness.device import device_block
from harness.engines.base import ENGINES, NoTensors, RunnerContext, parse_options
from harness.engines.launch.converted import Converted, ensure_converted_by
from harness.engines.launch.gguf_export import KINDS, GGUFExportError, GGUFFile, export_gguf
from harness.engines.launch.worker_run import case_lines, output_from_fields, run_worker
from harness.engines.vllmcpp.build import Build, BuildError, ensure_build, source_path
from harness.models import ModelRef
from harness.workspace import REPO_ROOT, Workspace

TIMEOUT_S = float(os.environ.get("HARNESS_VLLMCPP_TIMEOUT_S", "3600"))
ENGINE_OPTIONS = {"num_blocks": "KV-cache blocks", "max_num_seqs": "requests the scheduler admits",
                  "block_size": "tokens per KV block"}
DTYPES = ("bfloat16", "float32")
OPTIONS = {"src": "the vllm.cpp source: a checkout or a .tar.gz of one",
           "dtype": "bfloat16 (default: the oracle's weights converted) or float32 (the model's "
                    "safetensors as they are: vllm.cpp's dense loader refuses them at d85906ae)",
           "gguf": f"load a GGUF the harness writes ({', '.join(KINDS)}) instead of BF16 safetensors",
           **ENGINE_OPTIONS}
NO_LOGPROBS = ("vllm.cpp returns no logprobs at this source: its CompletionOutput keeps them as an "
               "opaque flag (the payload is deferred upstream)")
TEXT_ONLY = "vllm.cpp's engine takes text prompts only (its input processor tokenizes them)"
CONVERSION = "bfloat16 safetensors, converted from the model's float32 weights (round to nearest even)"


def to_bf16(source: Path, dest: Path, log: Path) -> dict[str, Any]:
    """``source``'s checkpoint in ``dest`` with every floating tensor in bfloat16 and config.json
    saying so; every other file copied as it is."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    n = 0
    for f in sorted(source.iterdir()):
        if f.suffix == ".safetensors":
            tensors = load_file(str(f))
            out = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in tensors.items()}
            n += sum(1 for v in tensors.values() if v.is_floating_point())
            save_file(out, str(dest / f.name), metadata={"format": "pt"})
        elif f.name == "config.json":
            cfg = json.loads(f.read_text())
            cfg["torch_dtype"] = "bfloat16"
            if "dtype" in cfg:
                cfg["dtype"] = "bfloat16"
            (dest / f.name).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        elif f.is_file():
            shutil.copy2(f, dest / f.name)
    template = source / "chat_template.jinja"
    facts_extra: dict[str, Any] = {}
    if template.is_file() and (dest / "tokenizer_config.json").is_file():
        # vllm.cpp reads a chat template from tokenizer_config.json only; transformers and vLLM read
        # either place, and the text is the same file's
        tc = json.loads((dest / "tokenizer_config.json").read_text())
        tc["chat_template"] = template.read_text()
        (dest / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
        facts_extra["chat_template"] = "chat_template.jinja copied into tokenizer_config.json"
    log.write_text(f"{n} floating tensors converted to bfloat16\n")
    if n == 0:
        raise EngineRefused(f"vllmcpp: {source.name} has no floating safetensors to convert to BF16")
    return {"converter": "torch " + torch.__version__, "dtype": "bfloat16", "tensors": n, **facts_extra}


def template_key(model: ModelRef) -> dict[str, str]:
    """The chat template's digest when the model folder has one: it is copied with the BF16 weights
    (vllm.cpp's server renders chats with it) but is no part of the model digest, so it keys the
    conversion itself."""
    import hashlib

    from harness.models.digest import TEMPLATE_FILE

    path = Path(model.path) / TEMPLATE_FILE
    return {"chat_template": hashlib.sha256(path.read_bytes()).hexdigest()[:12]} if path.is_file() else {}


class VllmCppRunner(NoTensors):
    """vllm.cpp through the harness's worker (see module doc)."""

    tensors_why_not = ("the harness's vllm.cpp worker reads tokens only; its per-layer hidden states "
                       "are computed inside the C++ model classes and not exposed by the engine's API")

    def __init__(self, model: ModelRef, options: Mapping[str, str], name: str,
                 run_dir: Path | None = None, repo_root: Path = REPO_ROOT) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            valid = ", ".join(f"{k} ({v})" for k, v in OPTIONS.items())
            raise EngineRefused(f"candidate {name!r}: unknown option(s) {', '.join(unknown)}; valid: {valid}")
        gguf = options.get("gguf")
        self.dtype = options.get("dtype", "bfloat16")
        if self.dtype not in DTYPES:
            raise EngineRefused(f"candidate {name!r}: dtype={self.dtype!r}; valid: {', '.join(DTYPES)}")
        if gguf is not None and "dtype" in options:
            raise EngineRefused(f"candidate {name!r}: gguf= and dtype= both name the weights; give one")
        if gguf is not None and gguf not in KINDS:
            raise EngineRefused(f"candidate {name!r}: gguf={gguf!r}; the harness writes {', '.join(KINDS)}")
        self.engine_opts: dict[str, int] = {}
        for key in ENGINE_OPTIONS:
            if key in options:
                try:
                    self.engine_opts[key] = int(options[key])
                except ValueError:
                    raise EngineRefused(
                        f"candidate {name!r}: {key}={options[key]!r} is not an integer") from None
        self.name, self.model, self.options = name, model, dict(options)
        self.run_dir, self.repo_root = run_dir, repo_root
        self.build: Build | None = None
        self.weights: Converted | GGUFFile | Path | None = None
        self.timings: dict[str, float] = {}
        self.meta: dict[str, Any] = {}
        self.log_path: Path | None = None
        self.served: dict[str, tuple[int, ...]] = {}
        self.asked: list[str] = []
        self.logprobs_returned = False

    # --- the Runner contract -------------------------------------------------------------------

    def info(self) -> EngineInfo:
        gguf = self.options.get("gguf")
        weights = (f"GGUF {gguf}, written by the harness from the model's safetensors" if gguf else
                   "float32: the model's safetensors as they are" if self.dtype == "float32" else CONVERSION)
        settings: dict[str, Any] = {
            "weights": weights, **({"dtype": self.dtype} if gguf is None else {}),
            "prompts": "text", "engine": dict(self.engine_opts), "request": {"temperature": 0.0}}
        env: dict[str, Any] = {}
        if self.build is not None:
            env["build"] = {k: v for k, v in self.build.facts.items() if k != "built"}
            env["build"]["cached"] = self.build.cached
        if isinstance(self.weights, Converted):
            env["converted"] = self.weights.to_json()
        elif isinstance(self.weights, GGUFFile):
            env["gguf"] = {"kind": self.weights.kind, **self.weights.facts}
        version = self.meta.get("engine_version", "")
        commit = (self.build.facts.get("commit") or "") if self.build else ""
        digest = str(self.build.facts.get("source_digest", ""))[:12] if self.build else ""
        label = f"vllm.cpp {version}".strip() + (f" ({commit[:8] or 'source ' + digest})" if digest else "")
        return EngineInfo(self.name, "vllm.cpp", label, settings=settings, environment=env)

    def preflight(self) -> None:
        """The Preflight ability: the source the spec names exists (the build itself waits for
        ``start``)."""
        try:
            source_path(self.options.get("src"))
        except BuildError as e:
            raise FileNotFoundError(f"{self.name}: {e}") from None

    def start(self) -> None:
        t0 = time.perf_counter()
        print(f"{self.name}: vllm.cpp from its source (built once into the build cache: ~15 minutes "
              f"on 2 cores the first time)", file=sys.stderr)
        try:
            self.build = ensure_build(self.repo_root, self.options.get("src"))
        except BuildError as e:
            raise EngineFailed(f"{self.name}: {e}") from None
        self.timings["build_ready_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cache = Workspace.default().model_cache
        gguf = self.options.get("gguf")
        if gguf is not None:
            try:
                self.weights = export_gguf(Path(self.model.path), gguf, cache / "gguf", self.model.name,
                                           self.model.digest)
            except GGUFExportError as e:
                raise EngineRefused(f"{self.name}: {e}") from None
        elif self.dtype == "float32":
            self.weights = Path(self.model.path)
        else:
            self.weights = ensure_converted_by(cache, "vllmcpp-bf16", self.model, template_key(self.model),
                                               to_bf16)
        self.timings["weights_ready_s"] = time.perf_counter() - t0

    @property
    def model_path(self) -> Path:
        assert self.weights is not None, "start() first"
        return self.weights if isinstance(self.weights, Path) else self.weights.path

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        assert self.build is not None, "start() first"
        work = Path(tempfile.mkdtemp(prefix="vllmcpp-", dir=self.run_dir))
        self.log_path = work / "engine.log"
        engine = {"max_num_seqs": max(1, min(len(cases), 8)), **self.engine_opts}
        request = {
            "model": str(self.model_path), "engine": engine,
            "sampling": {"temperature": 0.0, "ignore_eos": False},
            "cases": [{"id": c.id, "prompt_text": self.prompt_text(c), "max_tokens": sampling.max_tokens}
                      for c in cases]}
        done = run_worker([str(self.build.worker)], request, work, timeout_s=TIMEOUT_S, env=dict(os.environ),
                          label=f"vllm.cpp {self.name} ({self.model.name}, {len(cases)} cases)",
                          who=f"the vllm.cpp worker of {self.name}",
                          doing=f"running {len(cases)} cases of {self.model.name}", name=self.name,
                          places=self._places())
        self.meta = done.meta
        self.timings.update({k: float(v) for k, v in done.meta["timings"].items()})
        self.timings["output_tokens"] = float(done.meta["output_tokens"])
        return self._outputs(cases, done.body)

    def prompt_text(self, case: Case) -> str:
        """The text whose tokenization should give the case's ids: the suite's own text when the
        model's tokenizer makes exactly those ids of it, else the ids decoded."""
        if case.prompt_text and list(self.model.encode(case.prompt_text)) == list(case.prompt_ids):
            return case.prompt_text
        return self.model.decode(case.prompt_ids)

    def _outputs(self, cases: Sequence[Case], lines: list[dict[str, Any]]) -> list[Output]:
        outs = []
        for c, d, failed in case_lines(cases, lines, "vllm.cpp", self.served):
            if failed is not None:
                outs.append(failed)
                continue
            self.logprobs_returned |= bool(d.get("logprobs_returned"))
            outs.append(output_from_fields(c.id, d))
        self.asked = [c.id for c in cases]
        return outs

    def facts(self) -> RunFacts:
        lost = {c: "the engine returned no prompt ids" for c in self.asked if c not in self.served}
        caps = Capabilities(prompts="text", top_logprobs=False, reasons={"top_logprobs": NO_LOGPROBS},
                            notes=(TEXT_ONLY,), request={"temperature": 0.0},
                            tokenized_by="the engine's RequestOutput.prompt_token_ids",
                            served_prompt_ids=dict(self.served), tokenize_errors=lost)
        return RunFacts(timings=dict(self.timings), capabilities=caps, batched=True,
                        device=device_block("cpu") if self.meta else {})

    def close(self) -> None:
        """The worker has exited by the time ``run`` returns."""

    # --- helpers ----------------------------------------------------------------------------------

    def _places(self) -> dict[str, str]:
        """This machine's folders, as a failure's text names them."""
        places = {self.model.path: self.model.name}
        if self.build is not None:
            places[str(self.build.folder)] = "<vllm.cpp build>"
        if self.weights is not None and not isinstance(self.weights, Path):
            places[str(self.weights.path.parent)] = "<converted>"
        if self.run_dir is not None:
            places[str(self.run_dir)] = "<run folder>"
        return places


@ENGINES.register("vllmcpp", help="vllm.cpp built from its source on first use (vllmcpp:src=PATH,gguf=f16)")
def _vllmcpp(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> VllmCppRunner:
    return VllmCppRunner(model, parse_options(arg, spec), ctx.name or spec, run_dir=ctx.run_dir)
