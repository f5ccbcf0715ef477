"""Bounded concurrent API calls (controller/concurrency.py) and the arbiter's clock guard."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import kopf
import pytest
from tessera.api import contract
from tessera.controller.apps import AppRecord, record_from_body
from tessera.controller.arbiter import Arbiter, RoundReport
from tessera.controller.concurrency import drain_limited, gather_limited
from tessera.controller.config import OperatorConfig
from tessera.controller.context import Context
from tessera.controller.kube import KubeApi
from tessera.controller.ledger import Ledger
from tessera.controller.metrics import operator_metrics
from tessera.controller.view import ClusterView

from tests.unit.controller.test_leases import body, cluster_of, job


def test_at_most_limit_in_flight_results_in_order_and_errors_returned() -> None:
    in_flight = peak = 0

    async def call(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001 * (i % 3))
        in_flight -= 1
        if i == 5:
            raise RuntimeError("boom")
        return i * i

    out = asyncio.run(gather_limited((call(i) for i in range(20)), 4))
    assert peak == 4
    assert [r for i, r in enumerate(out) if i != 5] == [i * i for i in range(20) if i != 5]
    assert isinstance(out[5], RuntimeError)
    with pytest.raises(ValueError, match=">= 1"):
        asyncio.run(gather_limited([], 0))
    with pytest.raises(ValueError, match="api_concurrency"):
        OperatorConfig(api_concurrency=0)


def test_a_caller_with_a_stale_clock_never_runs_a_round_back_in_time() -> None:
    # A handler reads the clock, then waits for the lock while a later round runs: its round must not
    # be dated before that one (N_avg would see time go backwards).
    t0 = 1_700_000_000.0
    config = OperatorConfig(lease_s=600.0, clock=lambda: t0)

    async def run() -> tuple[float, float]:
        api = KubeApi(kopf.ConnectionInfo(server="http://127.0.0.1:9"))
        arbiter = Arbiter(Context(config, ClusterView(), api, operator_metrics(), lambda *_: None))
        arbiter.ledger = Ledger()  # read (empty): no API here
        await arbiter.run_round(t0 + 601)
        arbiter.dirty = True
        report = await arbiter.maybe_run(t0)
        await api.close()
        assert report is not None
        return report.now, arbiter.last_round

    assert asyncio.run(run()) == (t0 + 601, t0 + 601)


def test_a_round_starts_when_the_earliest_lease_expires_as_leases_change() -> None:
    # Every App's timer asks whether a lease has expired; the answer is kept between rounds. It must
    # follow the leases: renewed by a round, brought by an App tracked later, gone with a removed App.
    t0 = 1_700_000_000.0
    cluster = cluster_of({"n1": 2})

    def app(name: str, gpu: str, expires: float) -> AppRecord:
        raw = body([job("j", 1)])
        raw["metadata"] = {"name": name, "namespace": "ml", "uid": f"u-{name}"}
        rec = record_from_body(raw, t0)
        rec.grant([gpu], expires, "auction", cluster)
        return rec

    async def run() -> list[float]:
        api = KubeApi(kopf.ConnectionInfo(server="http://127.0.0.1:9"))
        config = OperatorConfig(lease_s=600.0, clock=lambda: t0)
        arbiter = Arbiter(Context(config, ClusterView(), api, operator_metrics(), lambda *_: None))
        arbiter.ledger = Ledger()  # read (empty): no API here
        rounds: list[float] = []

        async def round_(now: float) -> RoundReport:  # what a round does to leases, without the API
            rounds.append(now)
            arbiter.dirty, arbiter.last_round = False, now
            for rec in arbiter.records.values():
                for lease in rec.leases:
                    if lease.expires <= now:
                        lease.expires = now + 300.0  # re-auctioned to the same App
            return RoundReport(now)

        arbiter._run_round = round_  # type: ignore[method-assign]
        arbiter.upsert(app("a", "n1/0", t0 + 100))
        assert await arbiter.maybe_run(t0) is not None  # a new App
        assert await arbiter.maybe_run(t0 + 99) is None
        assert await arbiter.maybe_run(t0 + 100) is not None  # a's lease ends; renewed to t0 + 400
        assert await arbiter.maybe_run(t0 + 399) is None  # the old expiry is not remembered
        arbiter.upsert(app("b", "n1/1", t0 + 200))
        assert await arbiter.maybe_run(t0 + 150) is not None  # a new App
        await arbiter.remove(("ml", "b"))
        assert await arbiter.maybe_run(t0 + 160) is not None  # an App left
        assert await arbiter.maybe_run(t0 + 200) is None  # b's lease left with b
        assert await arbiter.maybe_run(t0 + 400) is not None
        await api.close()
        return rounds

    assert asyncio.run(run()) == [t0, t0 + 100, t0 + 150, t0 + 160, t0 + 400]


class _SlowApi(KubeApi):
    """An API server that takes a moment per call: records the calls and how many were in flight."""

    def __init__(self) -> None:
        super().__init__(kopf.ConnectionInfo(server="http://127.0.0.1:9"))
        self.in_flight = self.peak = 0
        self.patched: list[str] = []

    async def _call(self, verb: str, kind: Any, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.counts[(kind.group, kind.plural + (f"/{kwargs['sub']}" if kwargs.get("sub") else ""), verb)] += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.002)
        self.in_flight -= 1
        if verb == "patch":
            self.patched.append(path)
        return {}


def test_a_round_writes_the_changed_statuses_together_and_queues_no_unchanged_one() -> None:
    """A round's status writes go out api_concurrency at a time, and only the statuses due are sent:
    a round that changes nothing queues no write at all (every App queued for an API slot only to find
    its status unchanged cost a 1000-App round 1000 tasks)."""
    t0 = 1_700_000_000.0
    view = ClusterView()
    for n in range(4):
        inv = [{"uuid": f"n{n}-{i}", "index": i, "memoryMiB": 16384} for i in range(2)]
        view.on_node(
            {"metadata": {"name": f"n{n}", "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}}
        )

    async def run() -> tuple[_SlowApi, list[int]]:
        api = _SlowApi()
        # ρ alone never makes a status due here (it moves a lot in an App's first second).
        config = OperatorConfig(lease_s=600.0, api_concurrency=4, status_rho_tolerance=1e9, clock=lambda: t0)
        arbiter = Arbiter(Context(config, view, api, operator_metrics(), lambda *_: None))
        arbiter.ledger = Ledger()  # read (empty): no API here
        for i in range(12):
            raw = body([job("j", 1)])
            raw["metadata"] = {"name": f"a{i:02d}", "namespace": "ml", "uid": f"u-{i}"}
            arbiter.upsert(record_from_body(raw, t0))
        queued: list[int] = []
        each = arbiter._each

        async def counted(calls: Any) -> None:
            calls = list(calls)
            queued.append(len(calls))
            await each(calls)

        arbiter._each = counted  # type: ignore[method-assign]
        await arbiter.run_round(t0)
        first = len(api.patched)
        queued.clear()
        await arbiter.run_round(t0 + 1)  # nothing changed: no lease expired, nobody came or left
        assert len(api.patched) == first
        return api, queued

    api, queued = asyncio.run(run())
    assert len(api.patched) == 12  # every App's first status
    assert api.peak == 4  # sent together, at most api_concurrency at once
    assert queued == [12, 0, 0]  # the second round: 12 pod syncs with nothing to do, no status write queued


def test_drain_limited_reads_the_calls_as_workers_free_up() -> None:
    """At most `limit` in flight, every result (or error) returned, and the calls read lazily: the next
    one is made only when a worker is free (a round works out each status while others are in flight)."""
    made = done = peak = 0

    async def call(i: int) -> int:
        nonlocal done, peak
        peak = max(peak, made - done)
        try:
            await asyncio.sleep(0.001)
        finally:
            done += 1
        if i == 3:
            raise RuntimeError("boom")
        return i

    def calls() -> Any:
        nonlocal made
        for i in range(10):
            assert made - done < 3  # a worker asks for the next call only once it is free
            made += 1
            yield call(i)

    out = asyncio.run(drain_limited(calls(), 3))
    assert peak == 3
    assert sorted(r for r in out if isinstance(r, int)) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert [str(r) for r in out if isinstance(r, RuntimeError)] == ["boom"]
    with pytest.raises(ValueError, match=">= 1"):
        asyncio.run(drain_limited([], 0))


def test_a_round_runs_with_the_cyclic_gc_off_and_restores_it() -> None:
    """Full collections walked the operator's few hundred thousand long-lived objects two or three times
    in a 1000-App round; the round defers them to its end, whatever way it ends."""
    config = OperatorConfig(lease_s=600.0)
    seen: list[bool] = []

    async def run() -> None:
        api = KubeApi(kopf.ConnectionInfo(server="http://127.0.0.1:9"))
        arbiter = Arbiter(Context(config, ClusterView(), api, operator_metrics(), lambda *_: None))
        arbiter.ledger = Ledger()  # read (empty): no API here

        async def round_(now: float) -> RoundReport:
            seen.append(gc.isenabled())
            if now > 1:
                raise RuntimeError("a failed round")
            return RoundReport(now)

        arbiter._run_round = round_  # type: ignore[method-assign]
        await arbiter.run_round(1.0)
        assert gc.isenabled()
        with pytest.raises(RuntimeError):
            await arbiter.run_round(2.0)
        assert gc.isenabled()
        gc.disable()  # a process that runs without it keeps it off
        try:
            await arbiter.run_round(1.0)
            assert not gc.isenabled()
        finally:
            gc.enable()
        await api.close()

    asyncio.run(run())
    assert seen == [False, False, False]
