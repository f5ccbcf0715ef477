"""DRA mode's manifests (controller/dra.py, issue 30): what a worker pod and its ResourceClaimTemplate look like
when the template brings fields of its own, the CEL that pins a GPU, the UUID lookup, and a gang whose GPU the
inventory lacks failing with the reason while a deleted pod takes its template along (`PodSync`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tessera.api import contract
from tessera.controller.dra import (
    CLAIM,
    RESOURCE_CLAIM_TEMPLATES,
    DraLanes,
    LanesError,
    claim_requests,
    uuid_selector,
)
from tessera.controller.kube import PODS, Kind
from tessera.controller.pods import Owner, PodPlan, build_pod
from tessera.controller.sync import PodSync
from tessera.controller.view import ClusterView, PodInfo

OWNER = Owner("App", "a", "ml", "uid-a")
PLAN = PodPlan(node="n1", gpu_indices=(1, 0), labels={}, env={}, workload="training", base="a-j1")


def test_uuid_selector_is_a_cel_equality_on_the_drivers_uuid_attribute() -> None:
    assert uuid_selector("GPU-1") == 'device.attributes["gpu.tessera.io"].uuid == "GPU-1"'
    assert uuid_selector('a"b') == 'device.attributes["gpu.tessera.io"].uuid == "a\\"b"'


def test_one_request_per_gpu_in_plan_order_with_the_lane_as_capacity() -> None:
    got = claim_requests([(1, "U1"), (0, "U0")], 5461, 33)
    assert [r["name"] for r in got] == ["gpu-1", "gpu-0"]  # CUDA_VISIBLE_DEVICES follows this order
    assert got[0]["exactly"]["capacity"] == {"requests": {"memory": "5461Mi", "computeShare": "33"}}
    assert all(r["exactly"]["deviceClassName"] == contract.DRA_DEVICE_CLASS for r in got)
    # a whole GPU asks for no capacity: the request policies' defaults are all of it
    assert "capacity" not in claim_requests([(0, "U0")], None, None)[0]["exactly"]
    assert claim_requests([(0, "U0")], None, 40)[0]["exactly"]["capacity"] == {
        "requests": {"computeShare": "40"}
    }


def test_the_templates_own_affinity_claims_and_scheduler_are_kept_and_the_node_pin_added_to_each_term() -> (
    None
):
    expr = {"key": "gpu-kind", "operator": "In", "values": ["a100"]}
    template: dict[str, Any] = {
        "spec": {
            "schedulerName": "kai-scheduler",
            "resourceClaims": [{"name": "scratch", "resourceClaimName": "nvme"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [expr]}, {"matchExpressions": [expr]}]
                    }
                },
                "podAntiAffinity": {"x": 1},
            },
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "scratch"}]},
                },
                {"name": "sidecar", "image": "y"},
            ],
        }
    }
    before = json.dumps(template, sort_keys=True)
    pod = build_pod(template, PLAN, OWNER, "best-effort", dra=True)
    spec = pod["spec"]
    assert json.dumps(template, sort_keys=True) == before  # the custom resource's template is not changed
    assert spec["schedulerName"] == "kai-scheduler"  # any DRA scheduler honours the selectors
    assert spec["resourceClaims"] == [
        {"name": "scratch", "resourceClaimName": "nvme"},
        {"name": CLAIM, "resourceClaimTemplateName": pod["metadata"]["name"]},
    ]
    main, sidecar = spec["containers"]
    assert main["resources"] == {"limits": {"cpu": "1"}, "claims": [{"name": "scratch"}, {"name": CLAIM}]}
    assert "resources" not in sidecar
    pin = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchExpressions": [expr], "matchFields": [pin]}] * 2
    assert spec["affinity"]["podAntiAffinity"] == {"x": 1}
    assert json.loads(pod["metadata"]["annotations"][contract.ANN_PLACEMENT])["gpuIndices"] == [1, 0]
    # rebuilt from itself (a re-created pod), the claim and the pin are not doubled
    again = build_pod(pod, PLAN, OWNER, "best-effort", dra=True)["spec"]
    assert [c["name"] for c in again["resourceClaims"]] == ["scratch", CLAIM]
    assert again["containers"][0]["resources"]["claims"] == [{"name": "scratch"}, {"name": CLAIM}]


def test_the_device_plugin_path_is_unchanged() -> None:
    pod = build_pod({"spec": {"containers": [{"name": "m", "image": "x"}]}}, PLAN, OWNER, "best-effort")
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {contract.RESOURCE_GPU: "2"}
    assert "resourceClaims" not in pod["spec"] and "affinity" not in pod["spec"]


def view_with_node(gpus: int) -> ClusterView:
    inv = [{"uuid": f"GPU-n1-{i}", "index": i, "memoryMiB": 16384} for i in range(gpus)]
    view = ClusterView()
    view.on_node({"metadata": {"name": "n1", "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}})
    return view


def test_uuids_come_from_the_nodes_inventory_and_unknown_gpus_are_refused() -> None:
    lanes = DraLanes(view_with_node(2))
    assert lanes.uuids("n1", [1, 0]) == [(1, "GPU-n1-1"), (0, "GPU-n1-0")]
    with pytest.raises(LanesError, match="node n1 has no GPU with index 7"):
        lanes.uuids("n1", [0, 7])
    with pytest.raises(LanesError, match="node n9 publishes no GPU inventory"):
        lanes.uuids("n9", [0])


class RecordingApi:
    """The two calls PodSync makes, recorded in order (404 on delete counts as done, as in KubeApi)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.created: dict[tuple[str, str], dict[str, Any]] = {}

    async def create(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", kind.plural, obj["metadata"]["name"]))
        self.created[(kind.plural, obj["metadata"]["name"])] = obj
        return obj

    async def delete(
        self, kind: Kind, namespace: str, name: str, *, grace_seconds: int | None = None
    ) -> None:
        self.calls.append(("delete", kind.plural, name))


async def test_a_gang_on_an_unknown_gpu_fails_with_the_reason_and_a_doomed_pod_takes_its_template() -> None:
    api = RecordingApi()
    sync = PodSync(api, grace_seconds=5, dra=DraLanes(view_with_node(2)))  # type: ignore[arg-type]
    template = {"spec": {"containers": [{"name": "m", "image": "x"}]}}
    good = PodPlan(node="n1", gpu_indices=(1,), labels={}, env={"J": "1"}, workload="training", base="a-j1")
    bad = PodPlan(node="n1", gpu_indices=(5,), labels={}, env={"J": "2"}, workload="training", base="a-j2")
    old = PodInfo("ml", "a-j0-old", {}, "n1", (0,), "Running", False)
    result = await sync(
        OWNER,
        [good, bad],
        [old],
        gang_of=lambda p: p.env["J"],
        template_of=lambda _: template,
        workload_class="best-effort",
    )
    assert result.failed_gangs == {"2": "node n1 has no GPU with index 5"}
    assert result.created == [good.name] and result.deleted == ["a-j0-old"]
    # the doomed pod's template goes first, then the pod; each new pod's template comes before the pod
    assert api.calls[:2] == [
        ("delete", RESOURCE_CLAIM_TEMPLATES.plural, "a-j0-old"),
        ("delete", PODS.plural, "a-j0-old"),
    ]
    assert api.calls[2:4] == [
        ("create", RESOURCE_CLAIM_TEMPLATES.plural, good.name),
        ("create", PODS.plural, good.name),
    ]
    # the failed gang made nothing, and its (never created) template is deleted again, harmlessly
    assert ("create", PODS.plural, bad.name) not in api.calls
    assert api.calls[4:] == [("delete", RESOURCE_CLAIM_TEMPLATES.plural, bad.name)]
    made = api.created[(RESOURCE_CLAIM_TEMPLATES.plural, good.name)]
    assert made["metadata"]["ownerReferences"][0]["uid"] == "uid-a"
    (request,) = made["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["selectors"] == [{"cel": {"expression": uuid_selector("GPU-n1-1")}}]
