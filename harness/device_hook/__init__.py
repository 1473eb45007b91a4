"""The start-up hook of emulated-ISA runs: this folder goes on child processes' PYTHONPATH."""
