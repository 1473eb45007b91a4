"""Where a run reads suites/models/goldens and writes records. Tests point it at a temp folder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Workspace:
    root: Path

    @classmethod
    def default(cls) -> Workspace:
        return cls(Path(os.environ.get("HARNESS_ROOT", REPO_ROOT)).resolve())

    @property
    def suites(self) -> Path:
        return self.root / "suites"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def goldens(self) -> Path:
        return self.root / "goldens"

    @property
    def records(self) -> Path:
        return self.root / "reports" / "records"

    @property
    def model_cache(self) -> Path:
        """Models built on first use from pinned downloads (never committed): ``.cache/models/``,
        or ``$HARNESS_MODEL_CACHE``, which several checkouts may share."""
        env = os.environ.get("HARNESS_MODEL_CACHE")
        return Path(env).resolve() if env else self.root / ".cache" / "models"

    @property
    def runs(self) -> Path:
        """Scratch folders of individual runs (engine logs, plots); not committed."""
        return self.root / "reports" / "runs"
