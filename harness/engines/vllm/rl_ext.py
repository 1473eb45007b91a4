"""The harness's methods on vLLM's worker, for the RL gate over HTTP (``--worker-extension-cls
rl_ext.HarnessRLExtension``, :mod:`harness.engines.vllm.rl_serve`).

The server's ``POST /collective_rpc {"method", "args"}`` calls a worker method by name with string
arguments only, so the taps the offline lane sends as functions (:mod:`harness.engines.vllm.rl_taps`,
:mod:`harness.engines.vllm.rl_backend`) are methods here, each taking and returning JSON-able values.
Imported by name in the engine core's worker (this folder is on its path), which registers the
harness's weight-transfer backend there before the model loads.
"""

from __future__ import annotations

from typing import Any

import rl_backend  # type: ignore[import-not-found]
import rl_taps  # type: ignore[import-not-found]

rl_backend.register()


class HarnessRLExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker."""

    def harness_tap_weights(self, path: str) -> dict[str, str]:
        """Every parameter as the engine computes with it, into ``path`` (see ``rl_taps.weights``)."""
        return rl_taps.weights(self, path)

    def harness_received(self) -> list[dict[str, Any]]:
        """What the backend loaded during the last update."""
        return rl_backend.received(self)

    def harness_repacked(self) -> list[str]:
        """What the CPU repack redid after the last update."""
        return rl_backend.repacked(self)

    def harness_install_routes(self, top_k: str) -> list[int]:
        return rl_taps.install_routes(self, int(top_k))

    def harness_arm_routes(self) -> None:
        rl_taps.arm_routes(self)

    def harness_take_routes(self) -> dict[str, Any]:
        return rl_taps.take_routes(self)
