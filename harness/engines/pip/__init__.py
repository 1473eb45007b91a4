"""Engines installed from PyPI into their own venvs (:mod:`.venvs`), one runner for all of them
(:mod:`.runner`), each declared by a spec module (:mod:`.ct2`, :mod:`.ortgenai`, :mod:`.openvino`,
:mod:`.mistralrs`) and driven by its worker in ``workers/``."""

from harness.engines.pip import ct2, mistralrs, openvino, ortgenai  # noqa: F401 - they register
