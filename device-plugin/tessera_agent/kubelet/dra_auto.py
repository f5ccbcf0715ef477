"""`--lanes-api auto` on the node: DRA lanes when the API server keeps a ResourceSlice's consumable capacity
(`tessera.dra_support`), else the device plugin, said in the log and in a Warning Event on the Node."""

from __future__ import annotations

import logging

from tessera.api import contract
from tessera.dra_support import REASON_FALLBACK, LanesApi, fallback_message, slice_refusal
from tessera.kube import KubeClient

from tessera_agent.gpus.backend import MIB, GpuDevice
from tessera_agent.kubelet.dra_slice import device
from tessera_agent.lanes.restarts import KubernetesEventSink

log = logging.getLogger(__name__)


def probe_slice(node: str, slots: int) -> dict[str, object]:
    """A slice of one device shaped as the agent publishes every GPU (shared, three capacities with request
    policies): what the dry run must keep. Not the node's GPUs: the choice comes before NVML is opened."""
    gpu = GpuDevice(0, "GPU-probe", "probe", 1024 * MIB, 0)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {},
        "spec": {
            "driver": contract.DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [device(gpu, slots=slots)],
        },
    }


async def agent_lanes_api(api: KubeClient, node: str, slots: int) -> LanesApi:
    refusal = await slice_refusal(api, probe_slice(node, slots))
    if refusal is None:
        log.info("lanes api auto: the API server keeps consumable capacity; running the DRA driver")
        return "dra"
    message = fallback_message(refusal)
    log.warning("%s", message)
    await KubernetesEventSink(api, node).node_event(REASON_FALLBACK, message, warning=True)
    return "devicePlugin"
