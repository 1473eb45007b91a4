"""The ``rl`` gate kind: trainer-vs-rollout parity across in-place weight updates of a running
engine, and MoE routing parity (docs/rl.md). :mod:`.kind` holds prepare/run/judge."""

from harness.kinds.base import register_kind
from harness.kinds.rl.kind import RLKind

register_kind(RLKind(), help="RL weight sync: trainer vs rollout across in-place weight updates, MoE routing")
