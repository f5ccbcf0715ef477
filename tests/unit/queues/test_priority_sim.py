"""Priority inside a queue in the simulator: a high-priority app arriving in a full queue, under each
preemption setting, against a low-priority app that holds all of the queue's GPUs."""

from __future__ import annotations

from typing import Any

from tessera.sim.training import scenario as training

LEASE_S = 600.0


def finishes(
    within_queue: str = "Never", priority: int = 10, preemptible: bool = True, min_runtime_s: float = 0.0
) -> dict[str, float]:
    """8 GPUs, one queue guaranteed all 8. `low` (8 GPUs for 1 h) arrives at 0; `high` (4 GPUs for
    10 min) at 60 s. Each app's finish time."""
    data: dict[str, Any] = {
        "kind": "training",
        "seed": 1,
        "cluster": {"machines": [{"count": 2, "slots": 1, "gpus_per_slot": 4}]},
        "queues": [
            {"name": "team", "guaranteed": 8, "within_queue": within_queue, "min_runtime_s": min_runtime_s}
        ],
        "policies": [{"policy": "themis", "label": "tessera"}],
        "themis": {"lease_s": LEASE_S},
        "sim": {"restart_s": 0},
        "trace": {
            "apps": [
                {
                    "id": "low",
                    "queue": "team",
                    "arrival": 0,
                    "preemptible": preemptible,
                    "jobs": [{"iterations": 3600, "iter_time": 8.0, "gpus": 8}],
                },
                {
                    "id": "high",
                    "queue": "team",
                    "arrival": 60,
                    "priority": priority,
                    "jobs": [{"iterations": 600, "iter_time": 4.0, "gpus": 4}],
                },
            ]
        },
    }
    result = training.run(training.load(data, "test"), workers=1)
    return {a.app_id: a.finish for a in result.runs[0].apps}


def test_within_queue_lower_priority_starts_the_high_priority_app_at_once() -> None:
    # Taken from `low` in the next round (at most a round gap after it arrives), not at low's lease end.
    assert finishes("LowerPriority")["high"] <= 60 + 60 + 600 + 1


def test_within_queue_never_waits_for_the_lease_then_serves_the_high_priority_first() -> None:
    f = finishes("Never")
    assert LEASE_S + 600 - 1 <= f["high"] <= LEASE_S + 600 + 60 + 1


def test_a_non_preemptible_app_keeps_its_gpus_until_it_is_done() -> None:
    # low is renewed at every lease end and never preempted: high starts when low finishes (after 1 h).
    f = finishes("LowerPriority", preemptible=False)
    assert f["high"] >= f["low"] + 600 - 1


def test_the_minimum_runtime_holds_back_within_queue_preemption() -> None:
    # low holds its GPUs from t=0; with a 300 s minimum runtime high starts at 300 (the next round after).
    high = finishes("LowerPriority", min_runtime_s=300)["high"]
    assert 300 + 600 - 1 <= high <= 300 + 60 + 600 + 1
