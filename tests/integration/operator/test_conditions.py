"""The Ready condition and observedGeneration as the operator writes them, against kmock: an invalid object
is Ready=False (InvalidSpec) for each generation with one event per distinct problem, and Ready=True once a
fix is reconciled; Ready follows an App and a TrialGroup from waiting for GPUs to running; an unchanged
state is not written again. kmock does not bump metadata.generation, so the tests do it with the spec."""

from __future__ import annotations

import json
from typing import Any

import kmock
from tessera.api import contract

from .conftest import (
    APPS,
    MDS,
    NS,
    TGS,
    add_node,
    app_body,
    events,
    job,
    md_body,
    pods,
    running_operator,
    status_of,
    tg_body,
    trial,
    wait_for,
)

G, V = contract.GROUP, contract.VERSION


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def ready_is(k: kmock.KubernetesEmulator, res: str, name: str, status: str, reason: str) -> Any:
    st = status_of(k, res, name)
    ready = cond(st, "Ready")
    return ready.get("status") == status and ready.get("reason") == reason and st


def with_generation(body: dict[str, Any], generation: int) -> dict[str, Any]:
    body["metadata"]["generation"] = generation
    return body


async def change_spec(
    k: kmock.KubernetesEmulator, plural: str, name: str, spec: Any, generation: int
) -> None:
    """A spec change the way the API server records it: the new spec and the next generation."""
    await k.patch(
        f"/apis/{G}/{V}/namespaces/{NS}/{plural}/{name}",
        json={"metadata": {"generation": generation}, "spec": spec},
    )


def status_patches(k: kmock.KubernetesEmulator, plural: str, name: str) -> int:
    return sum(
        1
        for r in list(k)
        if r.method == "PATCH" and r.resource is not None and r.resource.plural == plural and r.name == name
    )


def status_subresource_patches(k: kmock.KubernetesEmulator, plural: str, name: str) -> int:
    return sum(1 for r in list(k) if r.method == "PATCH" and str(r.url).endswith(f"/{plural}/{name}/status"))


def gateway(k: kmock.KubernetesEmulator, md: str) -> dict[str, Any] | None:
    try:
        return dict(k.objects["apps/v1/deployments", NS, f"{md}-gateway"])
    except KeyError:
        return None


def node(name: str, gpus: int) -> dict[str, Any]:
    inv = [
        {"uuid": f"GPU-{name}-{i}", "index": i, "model": "V100", "memoryMiB": 16384, "healthy": True}
        for i in range(gpus)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}},
    }


async def test_an_invalid_trialgroup_reports_each_generation_and_is_ready_once_fixed(
    api: kmock.KubernetesEmulator,
) -> None:
    add_node(api, "n1", 2)
    dup = [trial("x", 10), trial("x", 20)]
    api.objects[TGS, NS, "tg"] = with_generation(tg_body("tg", dup, gpus=2), 1)
    async with running_operator(api):
        st = await wait_for(lambda: ready_is(api, TGS, "tg", "False", "InvalidSpec"), what="Ready=False")
        assert st["phase"] == "Failed" and st["observedGeneration"] == 1
        assert cond(st, "Valid")["status"] == "False" and "unique" in cond(st, "Ready")["message"]
        assert [c["observedGeneration"] for c in st["conditions"]] == [1, 1]
        await wait_for(lambda: len(events(api, "InvalidSpec")) == 1, what="one InvalidSpec event")

        # Still invalid for the same reason: the new generation is reported, no second event.
        await change_spec(api, "trialgroups", "tg", {"trials": [trial("x", 10), trial("x", 30)]}, 2)
        st = await wait_for(
            lambda: status_of(api, TGS, "tg").get("observedGeneration") == 2 and status_of(api, TGS, "tg")
        )
        assert cond(st, "Ready")["observedGeneration"] == 2 and cond(st, "Ready")["reason"] == "InvalidSpec"
        # Invalid for another reason: reported with its own event.
        bad_fluid = {"fluid": {"maxPackPerGPU": 8}, "gpu": {"lane": {"memoryMiB": 8192}}}
        await change_spec(api, "trialgroups", "tg", {"trials": [trial("x", 10)], **bad_fluid}, 3)
        st = await wait_for(
            lambda: status_of(api, TGS, "tg").get("observedGeneration") == 3 and status_of(api, TGS, "tg")
        )
        assert "maxPackPerGPU" in cond(st, "Ready")["message"]
        # Events are posted in the background, so the status may land first.
        await wait_for(lambda: len(events(api, "InvalidSpec")) == 2, what="a second InvalidSpec event")

        await change_spec(
            api,
            "trialgroups",
            "tg",
            {"trials": [trial("x", 10), trial("y", 10)], "fluid": None, "gpu": None},
            4,
        )
        st = await wait_for(
            lambda: ready_is(api, TGS, "tg", "True", "Running"), what="Ready=True after the fix"
        )
    assert st["observedGeneration"] == 4 and st["phase"] != "Failed"
    assert [(c["type"], c["status"]) for c in st["conditions"]] == [("Valid", "True"), ("Ready", "True")]
    assert len(pods(api, **{contract.LABEL_TRIALGROUP: "tg"})) == 2


async def test_app_ready_follows_leases_and_an_unchanged_state_is_not_rewritten(
    api: kmock.KubernetesEmulator,
) -> None:
    api.objects[APPS, NS, "a"] = with_generation(app_body("a", [job("j1", gpus=2)]), 1)
    async with running_operator(api) as ctl:
        # No node yet: admitted, bidding, nothing leased.
        st = await wait_for(lambda: ready_is(api, APPS, "a", "False", "WaitingForGPUs"), what="waiting")
        assert cond(st, "Admitted")["status"] == "True" and st["observedGeneration"] == 1
        await api.post("/api/v1/nodes", json=node("n1", 2))
        st = await wait_for(lambda: ready_is(api, APPS, "a", "True", "Running"), what="Ready=True")
        assert len(pods(api, **{contract.LABEL_APP: "a"})) == 1
        assert [c["type"] for c in st["conditions"]] == ["Admitted", "Ready"]
        assert ctl.arbiter is not None
        # One round to settle: a write still due (the pod watch listing the new pod after Ready was read)
        # lands in it, and rounds hold the arbiter's lock until their writes are done.
        ctl.arbiter.dirty = True
        await wait_for(
            lambda r=ctl.arbiter.rounds: ctl.arbiter is not None and ctl.arbiter.rounds > r, what="a round"
        )
        async with ctl.arbiter.lock:
            writes, rounds = status_patches(api, "apps", "a"), ctl.arbiter.rounds
        # The lease clock stands still, so rounds run only when something changed: force three. Nothing
        # about the App changed, so neither the arbiter nor kopf writes to it.
        for _ in range(3):
            ctl.arbiter.dirty = True
            await wait_for(
                lambda r=ctl.arbiter.rounds: ctl.arbiter is not None and ctl.arbiter.rounds > r,
                what="a round",
            )
        assert ctl.arbiter.rounds >= rounds + 3
        assert status_patches(api, "apps", "a") == writes
        assert cond(status_of(api, APPS, "a"), "Ready") == cond(st, "Ready")


async def test_a_modeldeployment_waiting_for_gpus_is_not_ready_and_not_invalid(
    api: kmock.KubernetesEmulator,
) -> None:
    # The only GPU is an App's: the deployment places no replica. It used to build the gateway's config
    # anyway, which wants a worker, and report that as an invalid spec (phase Failed, InvalidSpec event).
    add_node(api, "n1", 1)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=1)])
    async with running_operator(api):
        await wait_for(lambda: status_of(api, APPS, "a").get("leases"), what="a's lease")
        await api.post(
            f"/apis/{G}/{V}/namespaces/{NS}/modeldeployments", json=with_generation(md_body("m", 100), 1)
        )
        st = await wait_for(lambda: ready_is(api, MDS, "m", "False", "WaitingForGPUs"), what="m waiting")
        assert st["phase"] == "Placing" and st["replicas"] == 0 and st["observedGeneration"] == 1
        assert "0 of 1 replica placed" in cond(st, "Ready")["message"]
        assert cond(st, "Scaled")["status"] == "False"
        assert not events(api, "InvalidSpec") and not any(
            r == "apps/v1/deployments" for r, _, _ in api.objects
        )

        await api.delete(f"/apis/{G}/{V}/namespaces/{NS}/apps/a")
        st = await wait_for(
            lambda: ready_is(api, MDS, "m", "True", "Serving"), what="m serving once a is gone"
        )
    assert st["replicas"] == 1 and gateway(api, "m") is not None


async def test_a_running_trialgroup_is_not_rewritten_on_every_pass(api: kmock.KubernetesEmulator) -> None:
    """Every tick re-runs each TrialGroup's pass; once it has written Ready and observedGeneration, a pass
    that changes nothing must send nothing (before the fix the stored observedGeneration, absent from the
    pass's own status, made each pass patch the whole status again: 500 patches a minute at 5,000 Apps)."""
    add_node(api, "n1", 2)
    api.objects[TGS, NS, "tg"] = with_generation(tg_body("tg", [trial("a", 10**6)], gpus=1), 1)
    async with running_operator(api) as ctl:
        await wait_for(lambda: ready_is(api, TGS, "tg", "True", "Running"), what="Ready=True")
        assert ctl.trialgroups is not None
        passes = 0
        reconcile = ctl.trialgroups.reconcile

        async def counted(body: dict[str, Any], patch: Any) -> Any:
            nonlocal passes
            try:
                return await reconcile(body, patch)
            finally:
                passes += 1

        ctl.trialgroups.reconcile = counted  # type: ignore[method-assign]
        # The first passes after Ready may still see a body from before its last write (the watch lags).
        await wait_for(lambda: passes >= 5, what="five passes after Ready")
        writes, seen = status_subresource_patches(api, "trialgroups", "tg"), passes
        await wait_for(lambda: passes >= seen + 10, what="ten more passes")
        assert status_subresource_patches(api, "trialgroups", "tg") == writes
        assert status_of(api, TGS, "tg")["observedGeneration"] == 1
