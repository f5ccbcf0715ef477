"""Lanes of finished pods leave the book, and an HP pod's `tessera.io/p99-dedicated-seconds` gives the BE
feedback loop its baseline on a GPU that never ran the HP lane alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera_agent.lanes.book import LaneBook
from tessera_agent.lanes.interference import InterferenceLoop, WindowedLatency
from tessera_agent.pods import pod_info_from_manifest

from .test_interference_loop import U0, Recorder, hp_p99


def manifest(name: str, workload: str, *, phase: str = "Running", **ann: str) -> dict[str, Any]:
    a = Assignment(node="n", gpu_uuids=[U0], lane_id=name, memory_mib=6000, compute_percent=100)
    annotations = {
        contract.ANN_ASSIGNMENT: a.to_annotation(),
        contract.ANN_ALLOCATED: f"{U0}::1",
        contract.ANN_WORKLOAD: workload,
        **ann,
    }
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"containers": [{"name": "m", "resources": {"limits": {contract.RESOURCE_GPU: "1"}}}]},
        "status": {"phase": phase},
    }


def test_finished_pods_lanes_are_dropped_and_free_their_memory() -> None:
    book = LaneBook({U0: 16000})
    hp = pod_info_from_manifest(manifest("hp", "serving:latency-critical"))
    be = pod_info_from_manifest(manifest("be", "training:best-effort"))
    assert book.refresh([hp, be]) == [] and len(book.on_gpu(U0)) == 2
    done = pod_info_from_manifest(manifest("be", "training:best-effort", phase="Succeeded"))
    assert done.finished and not be.finished
    book.refresh([hp, done])  # the pod object is still there, its work is not
    assert [ln.pod for ln in book.on_gpu(U0)] == ["ns/hp"]
    failed_hp = pod_info_from_manifest(manifest("hp", "serving:latency-critical", phase="Failed"))
    book.refresh([failed_hp])
    assert book.on_gpu(U0) == []
    # a new HP pod is admitted on the GPU the failed one held, with the memory the finished ones held
    new_hp = pod_info_from_manifest(manifest("hp2", "serving:latency-critical"))
    other = pod_info_from_manifest(manifest("be2", "training:best-effort"))
    assert book.refresh([failed_hp, done, new_hp, other]) == []
    assert sorted(ln.pod for ln in book.on_gpu(U0)) == ["ns/be2", "ns/hp2"]


@pytest.mark.parametrize("raw", ["0", "-1", "fast", "nan", "inf"])
def test_bad_p99_dedicated_is_ignored(raw: str) -> None:
    p = pod_info_from_manifest(
        manifest("hp", "serving:latency-critical", **{contract.ANN_P99_DEDICATED: raw})
    )
    assert p.p99_dedicated_s is None


def run_shared(
    book: LaneBook, loop: InterferenceLoop, lat: WindowedLatency, rec: Recorder, steps: int
) -> None:
    async def go() -> None:
        for _ in range(steps):
            for _ in range(30):
                lat.record(U0, hp_p99(book.be_percent_of(U0)), rec.now)
            await loop.step(rec.now)
            rec.now += 400

    asyncio.run(go())


def shared_gpu(**hp_ann: str) -> tuple[LaneBook, InterferenceLoop, WindowedLatency, Recorder]:
    """A GPU that starts shared: the HP and a checkpointing BE pod are admitted together at 90 %."""
    book = LaneBook({U0: 16000}, default_be_percent=90)
    lat = WindowedLatency(window_s=30, min_samples=20)
    rec = Recorder()
    loop = InterferenceLoop(book, lat, rec, rec, node="n", hysteresis=3)
    hp = manifest("hp", "serving:latency-critical", **hp_ann)
    be = manifest("be", "training:best-effort", **{contract.ANN_CHECKPOINTS: "true"})
    assert book.refresh([pod_info_from_manifest(hp), pod_info_from_manifest(be)]) == []
    return book, loop, lat, rec


def test_without_a_baseline_a_gpu_that_starts_shared_is_left_alone() -> None:
    book, loop, lat, rec = shared_gpu()
    run_shared(book, loop, lat, rec, 10)
    assert U0 not in loop.p99_dedicated and rec.restarts == [] and book.be_percent_of(U0) == 90


def test_annotated_baseline_lets_the_loop_converge_on_a_gpu_that_starts_shared() -> None:
    book, loop, lat, rec = shared_gpu(**{contract.ANN_P99_DEDICATED: "0.010"})
    run_shared(book, loop, lat, rec, 12)
    assert loop.p99_dedicated[U0] == pytest.approx(0.010)
    assert rec.restarts, "the loop never lowered the BE share"
    # target 11.5 ms ↔ p_be ≤ 50 in the simulated signal: settled at or just under it, HP p99 within target
    assert 40 <= book.be_percent_of(U0) <= 50
    assert hp_p99(book.be_percent_of(U0)) <= 1.15 * 0.010
