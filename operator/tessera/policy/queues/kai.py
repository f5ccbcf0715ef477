"""KAI-style baseline: KAI-Scheduler's hierarchical queues — deserved quota (a queue's guarantee) and an
over-quota weight, the same division Tessera uses — with DRF inside a queue (GPUs to the app with the
smallest share, held until it finishes) and reclaim by preemption, at once, after a minimum runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tessera.policy.baselines.drf import Drf
from tessera.policy.queues.division import QueueNode
from tessera.policy.queues.reclaim import ReclaimRule
from tessera.policy.queues.training import QueuedPolicy


def kai_style(queues: Sequence[QueueNode], min_runtime_s: Mapping[str, float] | None = None) -> QueuedPolicy:
    """KAI reclaims from any queue above its deserved quota once the victim ran its minimum runtime."""
    mins = dict(min_runtime_s or {})
    rules = {
        q.name: ReclaimRule(mode="immediate", min_runtime_s=mins.get(q.name, 0.0), grace_s=0.0)
        for q in [*queues, QueueNode("default")]
    }
    return QueuedPolicy(Drf(), queues, rules, name="kai-style")
