"""The BE feedback loop over lanes keyed by claim (DRA mode, issue 39): the HP baseline from the annotation of the
pod in the HP claim's lane, the new share handed to the claims (`on_share`) before any pod is restarted, every
pod of a shared BE claim restarted or kept on its own, and events on pods, never on claims."""

from __future__ import annotations

import asyncio
import dataclasses

from tessera_agent.lanes.book import LaneBook, PodLane
from tessera_agent.lanes.interference import (
    REASON_CHANGED,
    REASON_NOT_RESTARTED,
    InterferenceLoop,
    WindowedLatency,
)

from .test_interference_loop import U0, Recorder

# pods per claim UID: (pod name, checkpoints, p99 alone)
CLAIM_PODS = {
    "claim-hp": [("ns/serve", False, 0.010)],
    "claim-be": [("ns/train-0", True, None), ("ns/train-1", False, None)],  # one ResourceClaim, two pods
}


def pods_of(lane: PodLane) -> list[PodLane]:
    return [
        dataclasses.replace(
            lane, uid=f"uid-{name}", pod=name, checkpoints=cp, p99_dedicated_s=p99, claim=lane.uid
        )
        for name, cp, p99 in CLAIM_PODS.get(lane.uid, [])
    ]


def test_a_change_reaches_the_claims_first_then_each_pod_of_a_be_claim() -> None:
    book = LaneBook({U0: 16000}, default_be_percent=90)
    book.admit_lane("claim-hp", "claim ns/serve", {U0: 4000}, "HP", 40)
    book.admit_lane("claim-be", "claim ns/train", {U0: 4000}, "BE", 100, checkpoints=False)
    lat = WindowedLatency(window_s=30, min_samples=20)
    rec = Recorder()
    order: list[str] = []

    async def on_share(gpu: str, percent: int) -> None:
        assert book.be_percent_of(gpu) == percent  # the book has it: a claim prepared now gets it too
        order.append(f"share {percent}")

    async def restart(lane: PodLane, reason: str) -> None:
        order.append(f"restart {lane.pod}")
        await Recorder.restart(rec, lane, reason)

    rec.restart = restart  # type: ignore[method-assign]
    loop = InterferenceLoop(book, lat, rec, rec, node="n", pods_of=pods_of, on_share=on_share)
    for _ in range(30):
        lat.record(U0, 0.016, 0.0)  # over the 11.5 ms target of the HP pod's own 10 ms

    (change,) = asyncio.run(loop.step(0.0))

    assert loop.p99_dedicated[U0] == 0.010  # the pod's annotation, though the claim's lane never ran alone
    assert change.new < 90 and order == [f"share {change.new}", "restart ns/train-0"]
    assert (change.restarted, change.kept) == (("ns/train-0",), ("ns/train-1",))
    assert [(p, r) for p, r, _ in rec.events] == [
        ("ns/train-0", REASON_CHANGED),
        ("ns/train-1", REASON_NOT_RESTARTED),
    ]
