"""Device fingerprint and class: cpuinfo parsing, class derivation, ISA steering, the start-up hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from typing import Any

import pytest

from harness.device import (
    CPU_ISA_ENV,
    HOOK_DIR,
    UNKNOWN,
    DeviceError,
    build_fingerprint,
    confirm_kernel_library,
    cpu_tier,
    describe,
    device_class,
    fingerprint,
    parse_cpuinfo,
    recorded_class,
    vllm_cpu_library,
)
from harness.device_emulation import steer_cpu_isa, steering_env
from harness.device_hook.sitecustomize import steer
from tests.pins import PIN

_X86 = """processor\t: 0
vendor_id\t: {vendor}
cpu family\t: 25
model name\t: {model}
flags\t\t: fpu vme de pse tsc msr pae mce cx8 sse sse2 ssse3 sse4_1 sse4_2 {flags}

processor\t: 1
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: fpu sse2
"""
ZEN4 = _X86.format(vendor="AuthenticAMD", model="AMD EPYC 9R14",
                   flags="fma avx f16c avx2 avx512f avx512dq avx512bw avx512vl avx_vnni avx512_bf16 "
                         "avx512_vnni avx512vbmi")
ZEN2 = _X86.format(vendor="AuthenticAMD", model="AMD EPYC 7R32", flags="fma avx f16c avx2 sha_ni")
SKYLAKE = _X86.format(vendor="GenuineIntel", model="Intel(R) Xeon(R) Platinum 8175M",
                      flags="fma avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl")
SAPPHIRE = _X86.format(vendor="GenuineIntel", model="Intel(R) Xeon(R) Platinum 8488C",
                       flags="fma avx2 avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8")
OLD = _X86.format(vendor="GenuineIntel", model="Intel(R) Core(TM)2 Duo", flags="")
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve sve2 bf16 i8mm
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd40
"""
GRAVITON2 = GRAVITON3.replace(" sve sve2 bf16 i8mm", "").replace("0xd40", "0xd0c")

CPU_TORCH = {"installed": True, "version": "2.13.0+cpu", "build": "cpu", "cuda": None,
             "cpu_capability": "AVX512", "threads": 2, "probes_steered_to": None}
H200 = {"name": "NVIDIA H200", "count": 1, "names": ["NVIDIA H200"], "compute_capability": "9.0",
        "arch": None, "driver": "570.133.20", "cuda": "12.8", "hip": None, "memory_gib": 139.8}


def _fp(text: str, machine: str = "x86_64", env: dict[str, str] | None = None,
        cap: str | None = "AVX512", gpu: dict[str, Any] | None = None) -> dict[str, Any]:
    return build_fingerprint(parse_cpuinfo(text, machine), env or {},
                             {**CPU_TORCH, "cpu_capability": cap}, None, gpu)


def test_x86_cpuinfo_yields_vendor_model_and_only_kernel_flags() -> None:
    cpu = parse_cpuinfo(ZEN4, "x86_64")
    assert cpu == {"arch": "x86_64", "vendor": "AuthenticAMD", "model": "AMD EPYC 9R14",
                   "flags": ["avx2", "avx512_bf16", "avx512_vnni", "avx512f", "avx_vnni", "fma"]}
    assert parse_cpuinfo(SAPPHIRE, "x86_64")["flags"] == [
        "amx_bf16", "amx_int8", "amx_tile", "avx2", "avx512_bf16", "avx512_fp16", "avx512_vnni",
        "avx512f", "fma"]


def test_aarch64_and_empty_cpuinfo_do_not_crash() -> None:
    cpu = parse_cpuinfo(GRAVITON3, "aarch64")
    assert cpu == {"arch": "aarch64", "vendor": "0x41", "model": "implementer 0x41 part 0xd40",
                   "flags": ["asimd", "bf16", "i8mm", "sve", "sve2"]}
    assert parse_cpuinfo("", "arm64") == {"arch": "arm64", "vendor": UNKNOWN, "model": UNKNOWN,
                                          "flags": []}
    assert parse_cpuinfo("garbage without colons\n\n", "riscv64")["flags"] == []


@pytest.mark.parametrize(("text", "machine", "cls", "lib"), [
    (ZEN4, "x86_64", "cpu-x86_64-avx512bf16", "_C"),
    (ZEN2, "x86_64", "cpu-x86_64-avx2", "_C_AVX2"),
    (SKYLAKE, "x86_64", "cpu-x86_64-avx512", "_C_AVX512"),
    (SAPPHIRE, "x86_64", "cpu-x86_64-amx", "_C"),
    (OLD, "x86_64", "cpu-x86_64-baseline", "_C_AVX2"),
    (GRAVITON3, "aarch64", "cpu-aarch64-svebf16", "_C"),
    (GRAVITON2, "aarch64", "cpu-aarch64-neon", "_C"),
])
def test_class_and_vllm_library_follow_the_isa(text: str, machine: str, cls: str, lib: str) -> None:
    cap = {"avx2": "AVX2", "baseline": "DEFAULT"}.get(cls.rsplit("-", 1)[1], "AVX512")
    fp = _fp(text, machine, cap=cap)
    assert device_class(fp) == cls
    assert vllm_cpu_library(machine, fp["cpu"]["effective_flags"]) == lib


def test_steering_makes_the_class_the_emulated_one_and_says_so() -> None:
    env = {CPU_ISA_ENV: "avx2", **steering_env("avx2", {})}
    fp = _fp(ZEN4, env=env, cap="AVX2")
    assert fp["cpu"]["flags"][0] == "avx2" and "avx512f" in fp["cpu"]["flags"]  # the hardware
    assert fp["cpu"]["effective_flags"] == ["avx2", "fma"]
    assert fp["steering"]["setting"] == "HARNESS_CPU_ISA=avx2"
    assert fp["steering"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert device_class(fp) == "cpu-x86_64-avx2" == device_class(_fp(ZEN2, cap="AVX2"))
    assert vllm_cpu_library("x86_64", fp["cpu"]["effective_flags"]) == "_C_AVX2"
    assert "steered by HARNESS_CPU_ISA=avx2" in describe(fp)
    fp512 = _fp(ZEN4, env={CPU_ISA_ENV: "avx512", **steering_env("avx512", {})})
    assert device_class(fp512) == "cpu-x86_64-avx512"
    assert vllm_cpu_library("x86_64", fp512["cpu"]["effective_flags"]) == "_C_AVX512"


def test_partial_steering_is_a_class_of_its_own() -> None:
    """ATEN_CPU_CAPABILITY alone moves torch's kernels but not oneDNN's or vLLM's library."""
    assert device_class(_fp(ZEN4, env={"ATEN_CPU_CAPABILITY": "avx2"}, cap="AVX2")) == \
        "cpu-x86_64-avx512bf16+aten-avx2"
    assert device_class(_fp(ZEN4, env={"ONEDNN_MAX_CPU_ISA": "AVX2"})) == "cpu-x86_64-avx512bf16+onednn-avx2"
    assert device_class(_fp(ZEN4, env={"MKL_ENABLE_INSTRUCTIONS": "AVX2"})) == "cpu-x86_64-avx512bf16+mkl-avx2"
    # a cap at or above the tier changes nothing
    assert device_class(_fp(ZEN2, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, cap="AVX2")) == "cpu-x86_64-avx2"


def test_gpu_class_and_the_cpu_side_of_a_gpu_machine() -> None:
    fp = _fp(ZEN4, gpu=H200)
    assert device_class(fp) == "cuda-sm90" == device_class(fp, "cuda")
    assert device_class(fp, "cpu") == "cpu-x86_64-avx512bf16"
    assert device_class(_fp(ZEN4), "cuda") == UNKNOWN
    rocm = {**H200, "hip": "6.2", "arch": "gfx942:sramecc+:xnack-"}
    assert device_class(_fp(ZEN4, gpu=rocm)) == "rocm-gfx942"
    with pytest.raises(DeviceError, match="device 'tpu'"):
        device_class(fp, "tpu")


def test_missing_or_malformed_fingerprints_are_unknown() -> None:
    assert device_class({}) == device_class({"cpu": "x"}) == UNKNOWN
    assert device_class() == device_class(fingerprint())  # no fingerprint: this machine's
    assert recorded_class({"schema": 1, "platform": {"machine": "x86_64"}}) == UNKNOWN
    assert recorded_class({"device": {"class": ""}}) == UNKNOWN
    assert recorded_class({"device": {"class": "cpu-x86_64-avx2"}}) == "cpu-x86_64-avx2"


def test_steering_env_refuses_unknown_isas_and_conflicting_settings() -> None:
    env = steering_env("avx2", {"PYTHONPATH": "/somewhere"})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(HOOK_DIR), "/somewhere"]
    assert env["VLLM_CACHE_ROOT"].endswith(os.path.join("vllm", "harness-cpu-isa-avx2"))
    assert steering_env("avx2", env) == env  # idempotent: a child harness process applies it again
    assert steering_env("avx2", {"VLLM_CACHE_ROOT": "/c"})["VLLM_CACHE_ROOT"] == "/c/harness-cpu-isa-avx2"
    # inductor's kernel cache too: kernels compiled for another ISA are never loaded
    assert env["TORCHINDUCTOR_CACHE_DIR"].endswith("harness-cpu-isa-avx2")
    assert steering_env("avx2", {"TORCHINDUCTOR_CACHE_DIR": "/i"})["TORCHINDUCTOR_CACHE_DIR"] == \
        "/i/harness-cpu-isa-avx2"
    with pytest.raises(DeviceError, match="HARNESS_CPU_ISA='sse'.*avx2, avx512, avx512bf16"):
        steering_env("sse", {})
    with pytest.raises(DeviceError, match="ATEN_CPU_CAPABILITY=avx512 is already set"):
        steering_env("avx2", {"ATEN_CPU_CAPABILITY": "avx512"})
    with pytest.raises(DeviceError, match="DNNL_MAX_CPU_ISA=ALL"):
        steering_env("avx2", {"DNNL_MAX_CPU_ISA": "ALL"})


def test_steer_cpu_isa_refuses_to_emulate_upwards() -> None:
    env: dict[str, str] = {CPU_ISA_ENV: "avx512bf16"}
    with pytest.raises(DeviceError, match="this CPU .AMD EPYC 7R32. is avx2"):
        steer_cpu_isa(env, cpu=parse_cpuinfo(ZEN2, "x86_64"))
    with pytest.raises(DeviceError, match="cannot be emulated on aarch64"):
        steer_cpu_isa({CPU_ISA_ENV: "avx2"}, cpu=parse_cpuinfo(GRAVITON3, "aarch64"))
    assert steer_cpu_isa({}, cpu=parse_cpuinfo(ZEN2, "x86_64")) is None
    env = {CPU_ISA_ENV: "AVX2"}
    assert steer_cpu_isa(env, cpu=parse_cpuinfo(ZEN4, "x86_64")) == "avx2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["PYTHONPATH"] == str(HOOK_DIR)


def test_hook_denies_the_probes_above_the_isa() -> None:
    probes = ("_is_avx2_supported", "_is_avx512_supported", "_is_avx512_bf16_supported",
              "_is_vnni_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported")
    fake = types.SimpleNamespace(**{p: (lambda: True) for p in probes})
    steer(fake, "avx512")
    assert fake._is_avx512_supported() and fake._is_avx2_supported()
    assert not fake._is_avx512_bf16_supported() and not fake._is_amx_tile_supported()
    steer(fake, "avx2")
    assert not fake._is_avx512_supported() and fake._is_avx2_supported()
    assert fake._harness_cpu_isa == "avx2"


_CHILD = """
import multiprocessing as mp, json, torch

def probe(q):
    import torch
    q.put([torch.cpu._is_avx512_supported(), torch.backends.cpu.get_cpu_capability()])

if __name__ == "__main__":
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=probe, args=(q,))
    p.start()
    child = q.get(timeout=120)
    p.join()
    print(json.dumps({"parent": [torch.cpu._is_avx512_supported(), torch.backends.cpu.get_cpu_capability()],
                      "child": child}))
"""


def test_steering_reaches_a_child_python_and_its_spawned_processes(tmp_path) -> None:  # noqa: ANN001
    """What vLLM's engine-core processes see: a fresh interpreter under the steered environment
    (the hook on PYTHONPATH), started by ``spawn``, reports no AVX-512 and ATen at AVX2."""
    pytest.importorskip("torch")
    if "avx512f" not in parse_cpuinfo(open("/proc/cpuinfo").read(), "x86_64")["flags"]:
        pytest.skip("needs an AVX-512 CPU to steer down from")
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", CPU_ISA_ENV)}
    env = {**env, CPU_ISA_ENV: "avx2", **steering_env("avx2", env)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert json.loads(out) == {"parent": [False, "AVX2"], "child": [False, "AVX2"]}
    plain = {k: v for k, v in env.items() if k not in ("ATEN_CPU_CAPABILITY", CPU_ISA_ENV, "PYTHONPATH")}
    out = subprocess.run([sys.executable, str(script)], env=plain, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert json.loads(out)["child"] == [True, "AVX512"]  # the control: unsteered, it sees AVX-512


def test_this_machines_fingerprint_is_json_cached_and_classed() -> None:
    fp = fingerprint()
    assert fingerprint() is fp
    json.dumps(fp)
    assert fp["schema"] == 1 and fp["cpu"]["arch"]
    assert device_class(fp, "cpu").startswith(f"cpu-{fp['cpu']['arch']}-")
    assert fp["torch"]["installed"] in (True, False)


def test_an_observed_kernel_library_replaces_the_prediction_and_a_mismatch_is_kept() -> None:
    fp = build_fingerprint(parse_cpuinfo(ZEN4, "x86_64"), {}, CPU_TORCH,
                           {"installed": True, "kernel_library": "_C"}, None)
    same = confirm_kernel_library(fp, "_C")
    assert same["vllm"]["kernel_library_from"].startswith("observed")
    assert "kernel_library_predicted" not in same["vllm"]
    other = confirm_kernel_library(fp, "_C_AVX2")
    assert other["vllm"]["kernel_library"] == "_C_AVX2"
    assert other["vllm"]["kernel_library_predicted"] == "_C"
    assert fp["vllm"]["kernel_library"] == "_C"  # the input is not modified
    assert cpu_tier("riscv64", []) == "generic"


def test_an_engine_child_is_fingerprinted_with_its_own_steering_and_report() -> None:
    from harness.device import engine_fingerprint

    host = fingerprint()
    if host["cpu"]["arch"] != "x86_64" or "avx512f" not in host["cpu"]["flags"]:
        pytest.skip("needs an AVX-512 x86 CPU to steer down from")
    env = {CPU_ISA_ENV: "avx2", **steering_env("avx2", {})}
    meta = {"version": PIN.version, "kernel": {"kernel_libraries": ["_C_AVX2"], "cpu_capability": "AVX2",
                                            "cpu_probes": {"avx512": False}}}
    fp = engine_fingerprint(meta, env)
    assert device_class(fp, "cpu") == "cpu-x86_64-avx2"
    assert fp["vllm"]["kernel_library"] == "_C_AVX2" and "kernel_library_predicted" not in fp["vllm"]
    assert fp["vllm"]["kernel_library_from"] == "observed in the engine process"
    assert fp["steering"]["setting"] == "HARNESS_CPU_ISA=avx2" and fp["torch"]["probes_steered_to"] == "avx2"
    # an engine that reported AVX-512 kernels under that steering is not classed as AVX2
    leaky = engine_fingerprint({"kernel": {"kernel_libraries": ["_C"], "cpu_capability": "AVX512"}}, env)
    assert device_class(leaky, "cpu") == "cpu-x86_64-avx2+aten-avx512+vllm-c"
    assert leaky["vllm"]["kernel_library_predicted"] == "_C_AVX2"
    # nothing reported, nothing steered: this process's view
    assert device_class(engine_fingerprint(None, {}), "cpu") == device_class(host, "cpu")


def test_the_vllm_worker_looks_for_kernel_libraries_in_its_whole_process_tree() -> None:
    """The engine core is a grandchild of the worker's parent: the worker reads every descendant's
    memory map, not only its own (its own may not hold vLLM's kernels). The worker is loaded from
    its file, outside the package, as a vLLM release's python runs it: its helpers beside it
    resolve."""
    import importlib.util

    from harness.engines.vllm.runner import WORKER

    spec = importlib.util.spec_from_file_location("vllm_worker_under_test", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    assert worker.vllm_facts.__name__ == "facts"  # the script's own import, not the package's
    child = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        for _ in range(100):
            tree = worker.vllm_facts._process_tree(os.getpid())
            if len(tree) >= 3:
                break
            time.sleep(0.05)
        assert tree[0] == os.getpid() and child.pid in tree and len(tree) >= 3  # sh and its sleep
    finally:
        child.kill()
        child.wait()
    facts = worker.kernel_facts()
    assert isinstance(facts["kernel_libraries"], list) and "cpu_capability" in facts
