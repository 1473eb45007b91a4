"""``cmd:<command>``: any program as a candidate, through JSON lines (no HTTP, no Python API).

The harness starts the command once per run and writes the workload as JSONL, one line per case,
to its stdin, or to a file when the command contains ``{workload}``. ``{model}`` is replaced by
the model folder (also in ``$HARNESS_MODEL``). Workload line::

    {"id": "c01", "prompt_ids": [15, 7], "max_tokens": 32, "logprobs": 5, "temperature": 0.0, "seed": 0}

The command writes one JSON object per case to stdout, in any order (logs go to stderr)::

    {"id": "c01", "token_ids": [5, 9, ...], "text": "...", "finish_reason": "length",
     "top_ids": [[5, 2, ...], ...], "top_logprobs": [[-0.1, -2.3, ...], ...],
     "chosen_logprobs": [-0.1, ...], "ttft_ms": 12.5}

``token_ids`` is required. The three logprob fields are optional but go together: ``top_ids`` and
``top_logprobs`` have one row of k entries (best first) per generated token. ``{"id": ..., "error":
"..."}`` reports a case the engine failed. An optional ``{"stats": {"generate_s": 1.2}}`` line gives
the generation time without start-up, from which output tok/s is computed.

Bad output never crashes the gate: a non-JSON line, a missing or repeated case, or arrays of the
wrong length become that case's ``error`` verdict naming the stdout line.

**Tensors (optional).** To localize where the command's engine parts from the oracle (``harness
localize``), the harness starts the command once more with a workload of tensor requests, one line
per sequence, fed whole (teacher forcing)::

    {"id": "c03", "tensors": {"ids": [15, 7, ...], "dir": "/path/for/files"}}

and the command answers each with the residual stream after every layer's attention and MLP
sub-block, the final norm and the logits at every position, named as
:mod:`harness.engines.launch.layer_taps` names them (``layer.<i>.attn``, ``layer.<i>.mlp`` or ``.moe``,
``final_norm``, ``logits``), one row per token::

    {"id": "c03", "tensors": {"layer.0.attn": [[0.1, ...], ...], ..., "logits": [[...], ...]}}

or ``{"id": "c03", "tensors": "c03.npz"}``: an ``.npz`` (no pickle) it wrote into ``dir`` holding
those arrays. A command that answers ``{"id": ..., "error": "..."}``, or anything without
``tensors``, cannot localize: the diagnosis is refused with its answer, never a crash.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.abilities import TensorAbility
from harness.api import Case, EngineFailed, EngineInfo, EngineRefused, Output, RunFacts, Sampling
from harness.capabilities import Capabilities
from harness.engines.base import ENGINES, RunnerContext
from harness.engines.launch.procs import kill_group, spawn
from harness.excerpt import file_tail
from harness.models import ModelRef
from harness.speed import Speed

TIMEOUT_S = float(os.environ.get("HARNESS_CMD_TIMEOUT_S", "1800"))
EXCERPT = 120


class LineError(ValueError):
    """One stdout line broke the protocol; the message says how."""


def _excerpt(text: str) -> str:
    return repr(text[:EXCERPT] + ("..." if len(text) > EXCERPT else ""))


def _int_list(v: Any, field: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise LineError(f"field {field!r} must be a list of ints")
    return v


def _float_list(v: Any, field: str) -> list[float]:
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                          or x is None for x in v):
        raise LineError(f"field {field!r} must be a list of numbers")
    return [math.nan if x is None else float(x) for x in v]


def parse_case_line(d: Mapping[str, Any], case_id: str, sampling: Sampling) -> tuple[Output, float | None]:
    """One validated answer line -> (Output, ttft seconds or None). Raises :class:`LineError`."""
    if d.get("error") is not None:
        return Output(case_id, (), error=f"the engine reported: {str(d['error'])[:500]}"), None
    if "token_ids" not in d:
        raise LineError("missing field 'token_ids'")
    ids = _int_list(d["token_ids"], "token_ids")
    n = len(ids)
    if n > sampling.max_tokens:
        raise LineError(f"{n} token_ids but max_tokens is {sampling.max_tokens}")
    text = d.get("text", "")
    if not isinstance(text, str):
        raise LineError("field 'text' must be a string")
    lp_fields = [f for f in ("top_ids", "top_logprobs", "chosen_logprobs") if d.get(f) is not None]
    top_ids = top_lps = chosen = None
    if lp_fields:
        if len(lp_fields) != 3:
            raise LineError(f"give all of top_ids, top_logprobs, chosen_logprobs or none (got "
                            f"{', '.join(lp_fields)})")
        rows_i, rows_l = d["top_ids"], d["top_logprobs"]
        if not isinstance(rows_i, list) or not isinstance(rows_l, list):
            raise LineError("top_ids and top_logprobs must be lists of rows")
        if len(rows_i) != n or len(rows_l) != n:
            raise LineError(f"wrong length: {len(rows_i)} top_ids rows and {len(rows_l)} top_logprobs "
                            f"rows for {n} token_ids")
        ri = [_int_list(r, f"top_ids[{p}]") for p, r in enumerate(rows_i)]
        rl = [_float_list(r, f"top_logprobs[{p}]") for p, r in enumerate(rows_l)]
        k = len(ri[0]) if ri else sampling.logprobs
        for p, (a, b) in enumerate(zip(ri, rl, strict=True)):
            if len(a) != k or len(b) != k:
                raise LineError(f"wrong length at position {p}: {len(a)} top_ids and {len(b)} "
                                f"top_logprobs, row 0 has {k}")
        if k < 1:
            raise LineError("top_ids rows are empty")
        ch = _float_list(d["chosen_logprobs"], "chosen_logprobs")
        if len(ch) != n:
            raise LineError(f"wrong length: {len(ch)} chosen_logprobs for {n} token_ids")
        top_ids = np.asarray(ri, np.int32).reshape(n, k)
        top_lps = np.asarray(rl, np.float32).reshape(n, k)
        chosen = np.asarray(ch, np.float32)
    ttft = d.get("ttft_ms")
    ttft_s = float(ttft) / 1000 if isinstance(ttft, (int, float)) and not isinstance(ttft, bool) else None
    return Output(case_id, tuple(ids), text, top_ids, top_lps, chosen,
                  str(d.get("finish_reason") or "")), ttft_s


def tensor_reply(v: Any, rows: int, folder: Path) -> dict[str, np.ndarray]:
    """A tensors answer (name -> rows, or the name of an ``.npz`` in ``folder``) as float32 arrays of
    ``rows`` rows each. Raises :class:`LineError`."""
    if isinstance(v, str):
        path = (folder / v).resolve()
        if folder.resolve() not in path.parents:
            raise LineError(f"tensors file {v!r} is outside the folder the request gave")
        try:
            with np.load(path, allow_pickle=False) as z:
                v = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise LineError(f"cannot read tensors file {v!r}: {e}") from None
    if not isinstance(v, dict) or not v:
        raise LineError("field 'tensors' must be an object of name -> rows, or an .npz file name")
    out = {}
    for name, rows_ in v.items():
        try:
            a = np.asarray(rows_, np.float32)
        except (TypeError, ValueError):
            raise LineError(f"tensor {name!r} is not a rectangular array of numbers") from None
        if a.ndim != 2 or a.shape[0] != rows:
            raise LineError(f"tensor {name!r} has shape {list(a.shape)}, expected [{rows}, width]")
        out[str(name)] = a
    return out


class CmdRunner:
    """``command`` runs in ``cwd`` (default: the harness's own) with ``{repo}`` replaced by ``cwd``;
    ``sha``: the commit of the engine's own tree that ``command`` runs (``EngineInfo.sha``: the
    record is then a per-SHA truth about that engine, as ``harness bisect --repo`` makes them)."""

    def __init__(self, command: str, model: ModelRef, name: str = "cmd", run_dir: Path | None = None,
                 timeout_s: float = TIMEOUT_S, *, cwd: Path | None = None, sha: str | None = None) -> None:
        self.name = name
        self.cwd = cwd
        self.sha = sha
        self.model = model
        self.command = command
        try:
            self.argv = shlex.split(command)
        except ValueError as e:
            raise EngineRefused(f"candidate {name!r}: cannot split the command: {e}") from None
        if not self.argv:
            raise EngineRefused(f"candidate {name!r}: give a command, e.g. "
                                f"cmd:'python examples/cmd_engine.py {{model}}'")
        self.run_dir = run_dir
        self.timeout_s = timeout_s
        self.timings: dict[str, float] = {}
        self.speed: Speed | None = None
        self.capabilities: Capabilities | None = None
        self.problems: list[str] = []
        """Protocol problems not tied to one case (junk lines, unknown ids), for the record."""
        self.returncode: int | None = None
        self.log_path: Path | None = None

    def info(self) -> EngineInfo:
        env = {"timeout_s": self.timeout_s, "returncode": self.returncode,
               "problems": list(self.problems[:20])}
        return EngineInfo(self.name, "cmd", "unknown", self.sha, settings={"command": self.command},
                          environment=env)

    def facts(self) -> RunFacts:
        return RunFacts(timings=dict(self.timings), speed=self.speed, capabilities=self.capabilities)

    def start(self) -> None:
        """The command starts in ``run``: it gets the whole workload at once."""

    def run(self, cases: Sequence[Case], sampling: Sampling) -> list[Output]:
        lines = [{"id": c.id, "prompt_ids": list(c.prompt_ids), **sampling.to_json()} for c in cases]
        out, why, _ = self._exchange(lines, "cmd-")
        return self._collect(out, cases, sampling, why)

    def _exchange(self, lines: Sequence[Mapping[str, Any]], prefix: str) -> tuple[str, str, Path]:
        """Start the command on a workload of ``lines`` (stdin, or ``{workload}``); its stdout, why it
        failed ("" if it did not) and its run folder."""
        work = Path(tempfile.mkdtemp(prefix=prefix, dir=self.run_dir))
        workload = "".join(json.dumps(line) + "\n" for line in lines)
        wl_path = work / "workload.jsonl"
        wl_path.write_text(workload)
        self.log_path = work / "stderr.log"
        use_file = any("{workload}" in a for a in self.argv)
        argv = [a.replace("{workload}", str(wl_path)).replace("{model}", self.model.path)
                .replace("{repo}", str(self.cwd or ".")) for a in self.argv]
        env = {**os.environ, "HARNESS_MODEL": self.model.path, "PYTHONUNBUFFERED": "1"}
        t0 = time.perf_counter()
        with self.log_path.open("wb") as err:
            try:
                proc = spawn(argv, stdin=subprocess.DEVNULL if use_file else subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, env=env, cwd=self.cwd)
            except OSError as e:
                raise EngineFailed(f"{self.name}: cannot start {argv[0]!r}: {e}") from None
            why = ""
            try:
                out, _ = proc.communicate(None if use_file else workload.encode(), timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc, grace_s=3.0)
                out, _ = proc.communicate()
                why = f"the command did not finish within {self.timeout_s:g} s and was killed"
            finally:
                kill_group(proc, grace_s=3.0)  # whatever it forked and left behind
        self.timings["command_wall_s"] = time.perf_counter() - t0
        self.returncode = proc.returncode
        (work / "stdout.jsonl").write_bytes(out)
        if not why and proc.returncode != 0:
            why = f"the command exited with {proc.returncode}"
        if why:
            why += f"; stderr tail: {_excerpt(file_tail(self.log_path, 2000))}"
        return out.decode(errors="replace"), why, work

    def tensor_ability(self) -> TensorAbility:
        return TensorAbility(layers=True, why_not={
            "continuation": "the cmd protocol's tensors request covers whole sequences (capture_layers)"},
            note="asks the command (the protocol's optional tensors request); a command that does not "
                 "answer it is refused with its answer")

    def capture_tensors(self, cases: Sequence[Case], continuations: Mapping[str, Sequence[int]]
                        ) -> dict[str, dict[str, np.ndarray]]:
        raise EngineRefused(f"{self.name}: {self.tensor_ability().reason('continuation')}")

    def capture_layers(self, sequences: Mapping[str, Sequence[int]]) -> dict[str, dict[str, np.ndarray]]:
        """The protocol's tensors request, one line per sequence; every answer validated (2-D arrays,
        one row per token). A missing or refused answer is :class:`EngineRefused` with it."""
        folder = Path(tempfile.mkdtemp(prefix="cmd-tensors-files-", dir=self.run_dir))
        lines = [{"id": sid, "tensors": {"ids": [int(t) for t in ids], "dir": str(folder)}}
                 for sid, ids in sequences.items()]
        out, why, _ = self._exchange(lines, "cmd-tensors-")
        answers: dict[str, tuple[int, Mapping[str, Any]]] = {}
        for no, line in enumerate(out.splitlines(), 1):
            try:
                d = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                continue
            if isinstance(d, dict) and d.get("id") in sequences and d["id"] not in answers:
                answers[d["id"]] = (no, d)
        got = {}
        for sid, ids in sequences.items():
            if sid not in answers:
                raise EngineRefused(f"{self.name}: no answer to the tensors request for {sid}"
                                    + (f" ({why})" if why else ""))
            no, d = answers[sid]
            if d.get("error") is not None or "tensors" not in d:
                said = str(d.get("error")) if d.get("error") is not None else _excerpt(json.dumps(d))
                raise EngineRefused(f"{self.name}: the command does not answer tensors requests (stdout line "
                                    f"{no}, {sid}: {said[:300]})")
            try:
                got[sid] = tensor_reply(d["tensors"], len(ids), folder)
            except LineError as e:
                raise EngineFailed(f"{self.name}: stdout line {no} ({sid}): {e}") from None
        return got

    def _collect(self, stdout: str, cases: Sequence[Case], sampling: Sampling, why: str) -> list[Output]:
        wanted = {c.id for c in cases}
        got: dict[str, tuple[Output, float | None, int]] = {}
        bad: dict[str, str] = {}
        stats: Mapping[str, Any] = {}
        for no, line in enumerate(stdout.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                self.problems.append(f"stdout line {no} is not JSON: {_excerpt(line)}")
                continue
            if not isinstance(d, dict):
                self.problems.append(f"stdout line {no} is not a JSON object: {_excerpt(line)}")
                continue
            if "stats" in d and "id" not in d:
                stats = d["stats"] if isinstance(d["stats"], dict) else {}
                continue
            cid = d.get("id")
            if cid not in wanted:
                self.problems.append(f"stdout line {no} answers unknown case {cid!r}")
                continue
            if cid in got or cid in bad:
                bad[cid] = f"case {cid} answered twice (again on stdout line {no})"
                got.pop(cid, None)
                continue
            try:
                out, ttft = parse_case_line(d, cid, sampling)
                got[cid] = (out, ttft, no)
            except LineError as e:
                bad[cid] = f"stdout line {no} (case {cid}): {e}: {_excerpt(line)}"
        outs: list[Output] = []
        for c in cases:
            if c.id in got:
                outs.append(got[c.id][0])
            elif c.id in bad:
                outs.append(Output(c.id, (), error=bad[c.id]))
            else:
                extra = f" ({why})" if why else ""
                junk = f"; {self.problems[0]}" if self.problems else ""
                outs.append(Output(c.id, (), error=f"no stdout line for case {c.id}{extra}{junk}"))
        answered = [o for o in outs if o.error is None]
        with_lp = [o for o in answered if o.has_logprobs]
        reasons = {} if with_lp or not answered else {
            "top_logprobs": "the command's lines carry no top_ids/top_logprobs"}
        self.capabilities = Capabilities(
            token_ids=True, top_logprobs=bool(with_lp) or not answered,
            logprobs_served=int(with_lp[0].top_ids.shape[1]) if with_lp and with_lp[0].top_ids is not None
            else 0, logprobs_asked=sampling.logprobs, reasons=reasons, notes=tuple(self.problems[:20]))
        n_tok = sum(len(o.token_ids) for o in answered)
        self.timings["output_tokens"] = float(n_tok)
        gen = stats.get("generate_s")
        if isinstance(gen, (int, float)) and gen > 0:
            self.timings["generate_s"] = float(gen)
            ttfts = tuple(got[c][1] for c in got if got[c][1] is not None)  # type: ignore[misc]
            conc = stats.get("concurrency", 1)
            self.speed = Speed(int(conc) if isinstance(conc, int) else 1, len(cases), n_tok, float(gen),
                               ttfts, "subprocess (engine-reported generate_s)")
        return outs

    def close(self) -> None:
        """The command has exited (or was killed) by the time ``run`` returns."""



@ENGINES.register("cmd", help="a program reading workload JSONL, writing one JSON line per case "
                              "(cmd:'./engine {model}')")
def _factory(spec: str, arg: str | None, model: ModelRef, ctx: RunnerContext) -> CmdRunner:
    return CmdRunner(arg or "", model, name=ctx.name or spec, run_dir=ctx.run_dir)
