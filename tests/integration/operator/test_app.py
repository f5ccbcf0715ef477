"""App: pods with placements and a filled status; lease expiry moves GPUs to the worse ρ; finalizer cleanup;
invalid objects; restart recovery. All against kmock, asserting on what reached the API."""

from __future__ import annotations

import json

import kmock
from conftest import APPS, NS, add_node, app_body, job, pods, running_operator, wait_for
from tessera.api import contract


def status(k: kmock.KubernetesEmulator, name: str) -> dict:
    return dict(k.objects[APPS, NS, name]).get("status") or {}


def events(k: kmock.KubernetesEmulator, reason: str) -> list[dict]:
    return [
        dict(o)
        for (r, _, _), o in list(k.objects.items())
        if dict(o).get("kind") == "Event" and dict(o).get("reason") == reason
    ]


async def test_app_gets_pods_with_placements_and_status(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 4)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=2), job("j2", gpus=1)])
    async with running_operator(api):
        got = await wait_for(
            lambda: len(pods(api, **{contract.LABEL_APP: "a"})) == 2 and pods(api), what="pods"
        )
        st = await wait_for(lambda: status(api, "a").get("leases") and status(api, "a"), what="status")
    assert st["phase"] == "Running" and st["gpus"] == 3 and st["rho"] > 0
    assert {j["name"]: j["gpus"] for j in st["jobs"]} == {"j1": 2, "j2": 1}
    used = set()
    for body in got.values():
        meta, spec = body["metadata"], body["spec"]
        assert spec["schedulerName"] == contract.SCHEDULER_NAME
        placement = json.loads(meta["annotations"][contract.ANN_PLACEMENT])
        assert placement["node"] == "n1"
        used.update(placement["gpuIndices"])
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env[contract.ENV_RANK] == "0" and env[contract.ENV_WORLD_SIZE] == "1"
        jobname = meta["labels"][contract.LABEL_JOB]
        assert env[contract.ENV_JOB] == jobname
        assert spec["containers"][0]["resources"]["limits"][contract.RESOURCE_GPU] == str(
            len(placement["gpuIndices"])
        )
        assert meta["ownerReferences"][0]["uid"] == "uid-a"
        assert meta["annotations"][contract.ANN_WORKLOAD].startswith("training")
    assert len(used) == 3
