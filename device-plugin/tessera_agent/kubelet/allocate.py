"""Allocate and GetPreferredAllocation decisions, free of gRPC: pick the pod a request serves, build its env.

The kubelet's requests carry only slot IDs (device plugin API v1beta1), never the pod. The pod is the one pod on
this node that has an assignment, no `tessera.io/allocated` mark, has neither finished nor begun to be deleted,
and asks for as many slots:
the extender hands a node one such pod at a time (it binds the next only once this agent has marked the last
one allocated, docs/extender.md). Where several are waiting all the same (a handoff that timed out, an
extender that does not hand off), no rule could tell which one the kubelet is admitting (it admits in an order
of its own, and the slots it asks for were steered by a preference given without knowing the pod either), so
Allocate refuses with the pods' names rather than guess: a guess that is wrong gives two tenants each other's
GPU and lane. The kubelet then fails the pod it was admitting, and the next one is unambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from tessera.api import contract
from tessera.api.assignment import Assignment

from tessera_agent.config import AgentConfig
from tessera_agent.enforce.device_nodes import DeviceNode, DeviceNodeError, lane_device_nodes
from tessera_agent.enforce.lane_daemons import LaneLimits
from tessera_agent.gpus.backend import GpuDevice
from tessera_agent.kubelet.slots import gpu_of
from tessera_agent.lanes.book import LaneAdmissionError, LaneBook
from tessera_agent.pods import NodePod

ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"  # read by the NVIDIA container runtime


class AllocateRequestError(RuntimeError):
    """Allocate cannot serve a request; the message is what kubelet shows on the pod."""


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerAllocation:
    pod: NodePod
    envs: dict[str, str]
    mounts: tuple[Mount, ...]
    devices: tuple[DeviceNode, ...] = ()

    def limits(self) -> LaneLimits:
        """What the lane's own MPS daemon holds server-side: the env's values, which then only lower them."""
        a = self.pod.assignment
        assert a is not None  # container_allocation refuses a pod without one
        priority = self.envs.get(contract.ENV_MPS_CLIENT_PRIORITY)
        return LaneLimits(
            gpus=tuple(a.gpu_uuids),
            memory_mib=(a.memory_mib,) * len(a.gpu_uuids),
            thread_percent=int(self.envs[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE]),
            client_priority=int(priority) if priority is not None else None,
        )


def waiting_pods(pods: Sequence[NodePod], node: str, size: int) -> list[NodePod]:
    """Pods on `node` waiting for Allocate with `size` slots: assigned, not yet served, not finished and not
    being deleted (the extender's handoff counts the same pods: `tessera.extender.handoff.waiting_node`)."""
    return [
        p
        for p in pods
        if p.assignment is not None
        and not p.allocated
        and not p.finished
        and not p.deleting
        and p.assignment.node == node
        and size in p.gpu_requests
    ]


def choose_pod(device_ids: Sequence[str], pods: Sequence[NodePod], node: str) -> NodePod:
    """The pod this Allocate serves: the one waiting pod of that size, else a refusal that says why."""
    n = len(device_ids)
    if n == 0:
        raise AllocateRequestError("Allocate called with no device IDs")
    for d in device_ids:
        gpu_of(d)  # a malformed ID is refused (ValueError) before any pod is considered
    candidates = waiting_pods(pods, node, n)
    if not candidates:
        broken = [f"{p.key}: {p.assignment_error}" for p in pods if p.assignment_error and not p.allocated]
        hint = f"; assignments that could not be read: {'; '.join(broken)}" if broken else ""
        raise AllocateRequestError(
            f"no pod on node {node} has a {contract.ANN_ASSIGNMENT} annotation, is not yet allocated and requests "
            f"{n} {contract.RESOURCE_GPU}; was it scheduled by {contract.SCHEDULER_NAME}?{hint}"
        )
    if len(candidates) > 1:
        names = ", ".join(sorted(p.key for p in candidates))
        raise AllocateRequestError(
            f"{len(candidates)} pods on node {node} wait for {n} {contract.RESOURCE_GPU} at once ({names}) and "
            f"the kubelet does not say which one it is admitting; refused rather than risk giving one pod "
            f"another's GPU and lane (the extender hands a node one pod at a time: was its handoff off or timed out?)"
        )
    return candidates[0]


def container_allocation(
    pod: NodePod,
    cfg: AgentConfig,
    lanes: LaneBook | None = None,
    gpus: Mapping[str, GpuDevice] | None = None,
) -> ContainerAllocation:
    """The env, mounts and device nodes that put the container in its lane (the `ENV_*` names in
    `tessera.api.contract`).

    The mounts are the lane's own pipe directory (its MPS daemon's) and its own /dev/shm (`enforce/lane_dirs`),
    never a directory another lane uses; with `gpus` (the node's, by UUID) the device nodes are the lane's
    GPUs' and the driver's control nodes (`enforce/device_nodes`). With a `LaneBook` the lane is admitted as
    HP or BE (at most one HP per GPU, lanes' memory within the GPU less its reserve) and gets its class's
    active-thread percentage and MPS client priority (`lanes.py`).
    """
    a: Assignment | None = pod.assignment
    if a is None:
        raise AllocateRequestError(f"pod {pod.key} has no {contract.ANN_ASSIGNMENT} annotation")
    visible = ",".join(a.gpu_uuids)
    keys = [str(i) for i in range(len(a.gpu_uuids))] if cfg.mem_limit_key == "ordinal" else list(a.gpu_uuids)
    pipe_in_container = f"{cfg.mps_container_root}/pipe"
    envs = {
        contract.ENV_CUDA_VISIBLE_DEVICES: visible,
        ENV_NVIDIA_VISIBLE_DEVICES: visible,
        contract.ENV_MPS_PIPE_DIRECTORY: pipe_in_container,
        contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE: str(a.compute_percent),
        contract.ENV_MPS_PINNED_DEVICE_MEM_LIMIT: ",".join(f"{k}={a.memory_mib}M" for k in keys),
        contract.ENV_LANE_ID: a.lane_id,
    }
    if lanes is not None:
        try:
            lanes.admit(pod)
            envs.update(lanes.env(pod))
        except LaneAdmissionError as err:
            raise AllocateRequestError(str(err)) from None
    devices: list[DeviceNode] = []
    if gpus is not None:
        missing = [u for u in a.gpu_uuids if u not in gpus]
        if missing:
            raise AllocateRequestError(f"pod {pod.key}: GPU {', '.join(missing)} is not on this node")
        try:
            devices = lane_device_nodes([gpus[u] for u in a.gpu_uuids], cfg.dev_root)
        except DeviceNodeError as err:
            raise AllocateRequestError(f"pod {pod.key}: {err}") from None
    lane = cfg.lane_layout().lane_paths(pod.uid, a.gpu_uuids)
    mounts = [Mount(pipe_in_container, str(lane.pipe)), Mount("/dev/shm", str(lane.shm))]
    if cfg.coordinator_socket is not None:
        envs[contract.ENV_COORDINATOR_SOCKET] = (
            f"{cfg.coordinator_container_dir}/{cfg.coordinator_socket.name}"
        )
        mounts.append(Mount(cfg.coordinator_container_dir, str(cfg.coordinator_socket.parent)))
    if cfg.progress_socket is not None:
        envs[contract.ENV_PROGRESS_ENDPOINT] = progress_endpoint(
            f"{cfg.progress_container_dir}/{cfg.progress_socket.name}", pod.namespace, pod.name
        )
        mounts.append(Mount(cfg.progress_container_dir, str(cfg.progress_socket.parent)))
    return ContainerAllocation(pod=pod, envs=envs, mounts=tuple(mounts), devices=tuple(devices))


def progress_endpoint(socket_in_container: str, namespace: str, name: str) -> str:
    """The pod's progress URL on the agent's unix socket (`tessera_agent.lanes.progress`), in the http+unix form
    whose host is the percent-encoded socket path."""
    return f"http+unix://{quote(socket_in_container, safe='')}/v1/namespaces/{namespace}/pods/{name}/progress"


def preferred_slots(
    available: Sequence[str], must_include: Sequence[str], size: int, pods: Sequence[NodePod], node: str
) -> list[str]:
    """Slots for a request of `size`: one on each GPU of the pod waiting for that size, when there is one.

    Steering slots onto the assigned GPUs keeps kubelet's per-GPU slot count equal to the lanes on that GPU.
    With several pods waiting no preference is given (Allocate will refuse; see the module's docstring).
    """
    if size < len(must_include):
        raise AllocateRequestError(
            f"allocation size {size} is smaller than the {len(must_include)} required devices"
        )
    chosen = list(must_include)
    waiting = waiting_pods(pods, node, size)
    wanted = list(waiting[0].assignment.gpu_uuids) if len(waiting) == 1 and waiting[0].assignment else []
    have = {gpu_of(d) for d in chosen}
    for uuid in wanted:
        if len(chosen) >= size or uuid in have:
            continue
        slot = next((d for d in available if d not in chosen and gpu_of(d) == uuid), None)
        if slot is not None:
            chosen.append(slot)
            have.add(uuid)
    for d in available:
        if len(chosen) >= size:
            break
        if d not in chosen:
            chosen.append(d)
    if len(chosen) < size:
        raise AllocateRequestError(f"only {len(chosen)} devices available for an allocation of {size}")
    return chosen
