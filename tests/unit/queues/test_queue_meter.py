"""The simulator's queue figures on a run worked out by hand."""

from __future__ import annotations

import random

import pytest
from tessera.cluster import Cluster
from tessera.policy.queues import QueueNode
from tessera.policy.queues.kai import kai_style
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.themis import Themis, ThemisConfig
from tessera.sim.training.queues import QueueMeter, figures
from tessera.sim.training.simulator import SimConfig, simulate
from tessera.sim.training.trace import Trace, TraceApp, TraceJob

QUEUES = [QueueNode("a", guaranteed=2), QueueNode("b", guaranteed=2)]
# B's app takes all 4 GPUs at t=0 (A is idle); A's 2-GPU app arrives at t=100. Both run for hours.
TRACE = Trace(
    [
        TraceApp("b1", 0.0, tuple(TraceJob(36000, 1.0, 1) for _ in range(4)), queue="b"),
        TraceApp("a1", 100.0, tuple(TraceJob(36000, 1.0, 1) for _ in range(2)), queue="a"),
    ]
)


def run(policy: object) -> dict[str, object]:
    meter = QueueMeter(QUEUES)
    cluster = Cluster.homogeneous(1, 4)
    out = simulate(policy, cluster, TRACE, random.Random(0), SimConfig(restart_s=0), observers=[meter])  # type: ignore[arg-type]
    return figures(out, meter, QUEUES, 4, {"a1": "a", "b1": "b"}).to_json()


def test_lease_end_reclaim_leaves_a_below_its_guarantee_until_b_lease_ends() -> None:
    # Leases of 600 s: A waits from 100 to 600 with 2 GPUs short → one spell of 500 s, 1000 GPU-seconds.
    f = run(QueuedPolicy(Themis(ThemisConfig(lease_s=600)), QUEUES))
    assert f["longest_violation_s"] == pytest.approx(500)
    assert f["violation_gpu_s"] == pytest.approx(1000)


def test_immediate_reclaim_leaves_no_spell() -> None:
    # KAI-style preempts in the round A's arrival triggers (100 s after the last one ≥ the 60 s round gap).
    f = run(kai_style(QUEUES))
    assert f["violation_gpu_s"] == 0 and f["longest_violation_s"] == 0
