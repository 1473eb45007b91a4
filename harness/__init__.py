"""parity-harness: correctness gates and parity tests for LLM inference engines."""

from harness.device_emulation import steer_cpu_isa as _steer_cpu_isa

# HARNESS_CPU_ISA (emulate a smaller CPU ISA) must reach torch before its first kernel runs and
# every engine process the harness starts: apply it as soon as the harness is imported.
_steer_cpu_isa()
