"""What every engine family shares: the one launcher (procs, guard), the one worker protocol
(worker_lines), the engine-start ledger, the managed server process (loopback), venvs, and the
model forms more than one family loads (a converted folder, a GGUF, planted weights, layer taps,
seeded draws). Nothing here imports an engine family."""
