"""Faults under the KV gate's store: the planted-fault stores of every round trip (:mod:`.store`)
and the storage-fault suite (``[kv.faults]``: :mod:`.inject`, :mod:`.run`, :mod:`.verdict`,
:mod:`.doubles`, :mod:`.controls`, :mod:`.table`). Imports nothing: the connectors load
:mod:`.store` inside the engine."""
