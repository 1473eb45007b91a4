"""The oracle pin, read from requirements/oracle.txt (the one place it is written)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PIN_FILE = Path(__file__).resolve().parents[1] / "requirements" / "oracle.txt"


@dataclass(frozen=True, slots=True)
class OraclePin:
    package: str
    version: str

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def engine(self) -> str:
        """The engine spec that runs the pin: the ``vllm`` engine of this project's venv."""
        return "vllm"


def oracle_pin(path: Path = PIN_FILE) -> OraclePin:
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*(vllm[\w-]*)==([\w.+-]+)\s*$", line)
        if m:
            return OraclePin(m.group(1), m.group(2))
    raise ValueError(f"{path}: no 'vllm...==VERSION' line: the oracle pin is missing")
