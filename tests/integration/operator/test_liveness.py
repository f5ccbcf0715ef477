"""kopf's liveness endpoint (`tessera operator --liveness`) reports the operator's passes: 200 with each
controller's pass counts while they end, 500 once a pass has run past the deadline (the kubelet then
restarts the operator), against kmock."""

from __future__ import annotations

from typing import Any

import aiohttp
import kmock

from tests.integration.clock import ManualClock
from tests.ports import free_port

from .conftest import APPS, NS, add_node, app_body, job, running_operator, status_of, wait_for


async def probe(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        return r.status, await r.json() if r.status == 200 else await r.text()


async def test_liveness_fails_while_a_pass_overruns_its_deadline(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 1)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j")])
    clock = ManualClock()
    url = f"http://127.0.0.1:{free_port()}/healthz"
    async with running_operator(api, liveness=url, clock=clock, pass_deadline_s=30.0) as ctl:
        await wait_for(lambda: status_of(api, APPS, "a").get("leases"), what="a round that leased the GPU")
        arbiter = ctl.need(ctl.arbiter)
        # A round that does not end (an await that never returns) holds the arbiter's lock for good.
        async with arbiter.lock:
            with arbiter.passes.timing():
                clock.advance(31.0)
                status, text = await probe(url)
                assert status == 500, text
        # kopf caches only answers that succeeded: the next probe runs the check again.
        status, report = await probe(url)
        assert status == 200, report
        passes = report["passes"]
        arbiter_report = passes["arbiter"]
        # The overrun pass counts; a round the lapsed leases started may be running now, on time.
        assert arbiter_report["passes"] >= 2 and arbiter_report["runningSeconds"] in (None, 0.0)
        assert arbiter_report["secondsSinceLastPass"] == 0.0  # the test's clock has not moved since
        assert {"trialgroups", "deployments", "secondsSinceWatchEvent"} <= set(passes)
