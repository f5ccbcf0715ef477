"""The chart with `lanes.api: auto` on the real node (Kubernetes 1.37, so DRA): the agent's DaemonSet runs the
DRA driver under its own ServiceAccount (the chart's grants), the chart's DeviceClass selects its GPU, and a
pod's claim is allocated by the default kube-scheduler and prepared by the agent pod (issue 30)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
from tessera.api import contract

from tests.integration.k8s.controlplane import wait_until
from tests.unit.chart.chart_render import CHART

from .node import Node
from .test_chart_on_node import chart_values, describe, pods, ready
from .test_dra_on_node import (
    DEADLINE_S,
    GPU0,
    RESOURCE_API,
    cdi_specs,
    lane_env,
    lane_pod,
    lane_template,
    logged,
    phase,
    pod_claim,
    published_slice,
)

NS = "tessera-dra"
RELEASE = "tessera-dra"


@pytest.fixture(scope="module")
def dra_release(node: Node) -> Iterator[helm.Config]:
    if node.containerd_dir is None:
        pytest.fail("DRA needs CDI: run the node with the built containerd (TESSERA_NODE_CONTAINERD=built)")
    values: dict[str, Any] = chart_values(node)
    values["lanes"] = {"api": "auto"}
    values["agent"].update(
        {"fakeGpus": 1, "kubeletRootDir": str(node.kubelet_root), "cdiDir": str(node.cdi_dir)}
    )
    t0 = time.monotonic()
    with helm.Config(kubeconfig_path=str(node.plane.kubeconfig), namespace=NS) as cfg:
        installed = cfg.install(CHART, RELEASE, values, create_namespace=True, timeout=300)
        assert installed["status"] == "deployed"
        try:
            wait_until(
                lambda: len(got := pods(node, NS)) == 4 and all(ready(p) for p in got),
                300,
                "the chart's 4 pods to be Running and Ready",
            )
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{describe(node, NS)}") from err
        node.timings["chart ready (lanes.api auto = dra)"] = time.monotonic() - t0
        try:
            yield cfg
        finally:
            cfg.uninstall(RELEASE, timeout=300)
            # The slice is owned by the Node, which outlives the release.
            node.plane.request("DELETE", f"{RESOURCE_API}/resourceslices/{node.name}-{contract.DRA_DRIVER}")


def test_auto_on_137_runs_the_dra_driver_and_a_claim_gets_its_lane(
    node: Node, namespace: str, dra_release: helm.Config
) -> None:
    status, dc = node.plane.request("GET", f"{RESOURCE_API}/deviceclasses/{contract.DRA_DEVICE_CLASS}")
    assert status == 200, dc
    # published by the agent pod with the chart's grants
    wait_until(lambda: published_slice(node) is not None, DEADLINE_S, "the agent pod's ResourceSlice")
    lane_template(node, namespace, "lane-30", "10Gi", "30")
    lane_pod(node, namespace, "p", "lane-30", sleep_s=3600)
    try:
        wait_until(
            lambda: phase(node, namespace, "p") == "Running" and logged(node, namespace, "p"),
            DEADLINE_S,
            "the lane pod to run",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{describe(node, namespace)}\n{describe(node, NS)}") from err
    claim = pod_claim(node, namespace, "p")
    assert claim is not None
    uid = claim["metadata"]["uid"]
    env = lane_env(node, namespace, "p")
    assert env["CUDA_VISIBLE_DEVICES"] == GPU0 and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["TESSERA_LANE_ID"] == uid
    # the chart's progress socket is mounted and named for this pod
    assert env["TESSERA_PROGRESS_ENDPOINT"].endswith(f"/v1/namespaces/{namespace}/pods/p/progress")
    assert cdi_specs(node, uid)
    node.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/p")
    wait_until(lambda: not cdi_specs(node, uid), DEADLINE_S, "the agent pod to unprepare the claim")
