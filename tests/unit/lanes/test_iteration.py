"""Iteration scheduler: one iteration at a time per lane, and each policy's order (Salus §2.4)."""

from __future__ import annotations

import pytest
from tessera.policy.lanes.iteration import IterationSchedulerError, make_iteration_scheduler


def test_one_iteration_at_a_time_in_a_lane() -> None:
    s = make_iteration_scheduler("PACK")
    s.add_job("a", 0.0)
    s.add_job("b", 0.0)
    s.request("a", 0.0)
    s.request("b", 0.0)
    assert s.grant(0.0) == "a"
    assert s.grant(0.1) is None  # a is still running
    s.finish("a", 1.0)
    assert s.grant(1.0) == "b"
    assert s.grant(1.0) is None


def test_fifo_runs_oldest_job_to_completion() -> None:
    s = make_iteration_scheduler("FIFO")
    s.add_job("old", 0.0)
    s.add_job("new", 1.0)
    order = []
    t = 1.0
    for _ in range(3):
        s.request("old", t)
        s.request("new", t)
        job = s.grant(t)
        order.append(job)
        assert job is not None
        t += 1.0
        s.finish(job, t)
    assert order == ["old", "old", "old"]
    s.remove_job("old", t)
    assert s.grant(t) == "new"


def test_srtf_preemption_order_of_fig_2_8a() -> None:
    """#0 runs; #1 arrives and preempts it; #3 (shorter) runs before #2; #0 runs last (Salus §2.5.1)."""
    s = make_iteration_scheduler("SRTF")
    s.add_job("0", 0.0, remaining_seconds=100.0)
    s.request("0", 0.0)
    assert s.grant(0.0) == "0"
    s.add_job("1", 0.5, remaining_seconds=5.0)
    s.request("1", 0.5)
    assert s.grant(0.5) is None  # preemption only at the iteration boundary
    s.finish("0", 1.0, remaining_seconds=99.0)
    s.request("0", 1.0)
    assert s.grant(1.0) == "1"
    s.add_job("2", 1.2, remaining_seconds=20.0)
    s.add_job("3", 1.4, remaining_seconds=10.0)
    s.request("2", 1.2)
    s.request("3", 1.4)
    s.finish("1", 2.0, remaining_seconds=0.0)
    s.remove_job("1", 2.0)
    assert s.grant(2.0) == "3"  # arrived after #2 but shorter
    s.finish("3", 3.0, remaining_seconds=9.0)
    s.request("3", 3.0)
    assert s.grant(3.0) == "3"
    s.remove_job("3", 4.0)
    assert s.grant(4.0) == "2"
    s.remove_job("2", 5.0)
    assert s.grant(5.0) == "0"  # the long background job runs only when nothing shorter exists


def test_srtf_priority_ranks_before_remaining_time() -> None:
    s = make_iteration_scheduler("SRTF")
    s.add_job("short", 0.0, remaining_seconds=1.0)
    s.add_job("urgent", 0.0, remaining_seconds=50.0, priority=1)
    s.request("short", 0.0)
    s.request("urgent", 0.0)
    assert s.grant(0.0) == "urgent"


def _fair_shares(newcomer: str) -> list[dict[str, int]]:
    """3 identical jobs arriving at 0/15/30 s, 0.1 s iterations; iterations per job in each 15 s window."""
    s = make_iteration_scheduler("FAIR", newcomer_service=newcomer)  # type: ignore[arg-type]
    arrivals = {"j0": 0.0, "j1": 15.0, "j2": 30.0}
    windows: list[dict[str, int]] = [{}, {}, {}]
    t, step = 0.0, 0.1
    while t < 45.0 - 1e-9:
        for job, at in arrivals.items():
            if at <= t + 1e-9 and job not in s.jobs():
                s.add_job(job, t)
        for job in s.jobs():
            if job not in s.waiting():
                s.request(job, t)
        job = s.grant(t)
        assert job is not None
        t = round(t + step, 6)
        s.finish(job, t)
        w = windows[int((t - step / 2) // 15.0)]  # window of the iteration's midpoint
        w[job] = w.get(job, 0) + 1
    return windows


def test_fair_shares_one_half_one_third_of_fig_2_9() -> None:
    """Salus §2.5.1 (Fig. 2.9): each job gets ≈1, ≈1/2, ≈1/3 of throughput; aggregate stays constant."""
    w = _fair_shares("least")
    assert w[0] == {"j0": 150}
    assert sum(w[1].values()) == 150 and abs(w[1]["j0"] - w[1]["j1"]) <= 1
    assert sum(w[2].values()) == 150
    assert max(w[2].values()) - min(w[2].values()) <= 1


def test_fair_literal_zero_newcomer_monopolises_until_caught_up() -> None:
    w = _fair_shares("zero")
    assert w[1].get("j0", 0) == 0  # j1 starts at 0 service and runs alone for 15 s


def test_fair_service_accounts_memory_seconds_when_asked() -> None:
    s = make_iteration_scheduler("FAIR", service_measure="memory_seconds")
    s.add_job("a", 0.0, memory_mib=100)
    s.request("a", 0.0)
    assert s.grant(0.0) == "a"
    s.finish("a", 2.0)
    assert s.service() == {"a": 200.0}


def test_errors_name_the_problem() -> None:
    s = make_iteration_scheduler("FIFO")
    with pytest.raises(IterationSchedulerError, match="not in this lane"):
        s.request("ghost", 0.0)
    s.add_job("a", 0.0)
    with pytest.raises(IterationSchedulerError, match="already in this lane"):
        s.add_job("a", 0.0)
    with pytest.raises(IterationSchedulerError, match="not running"):
        s.finish("a", 1.0)
    s.request("a", 0.0)
    s.grant(0.0)
    with pytest.raises(IterationSchedulerError, match="finish"):
        s.request("a", 0.5)
    with pytest.raises(IterationSchedulerError, match="unknown lane policy"):
        make_iteration_scheduler("LIFO")  # type: ignore[arg-type]


def test_removing_the_running_job_frees_the_lane() -> None:
    s = make_iteration_scheduler("FAIR")
    s.add_job("a", 0.0)
    s.add_job("b", 0.0)
    s.request("a", 0.0)
    s.request("b", 0.0)
    assert s.grant(0.0) == "a"
    s.remove_job("a", 1.0)
    assert s.grant(1.0) == "b"
