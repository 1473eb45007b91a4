"""Any program speaking JSON lines (:mod:`.runner`): ``cmd:python my_engine.py {model}``."""

from harness.engines.cmd import runner  # noqa: F401 - it registers
