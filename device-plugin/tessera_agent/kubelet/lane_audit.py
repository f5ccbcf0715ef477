"""The lane audit: every container that holds the agent's slots runs on its own pod's lane, or is not left running.

Allocate is not told which pod it serves (`allocate.py`); it records the device IDs it served each pod with in
that pod's `tessera.io/allocated` annotation before it answers. The kubelet's PodResources API says which device
IDs each pod's containers actually received. Where the two disagree, a container runs with the env (GPU, lane
limits, MPS pipe) of another pod: a tenant on another tenant's lane. A pod found so in two audits in a row (a
single sighting may be a pod replaced under the same name between the two reads) is reported — a Warning event on
the pod and on the Node, `tessera_agent_lane_mismatches_total` — and deleted, so its controller recreates it and
Allocate serves the new pod its own lane. Restarting the container would not do: the kubelet keeps a pod's device
allocation, and the env Allocate gave it, for the pod's whole life.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from tessera_agent.kubelet.pod_resources import DeviceHolders, PodResourcesUnavailable
from tessera_agent.metrics_factory import AgentMetrics
from tessera_agent.pods import NodePod, PodSource

log = logging.getLogger(__name__)

OnMismatch = Literal["delete", "report"]


@dataclass(frozen=True)
class Mismatch:
    pod: NodePod  # the pod whose containers hold `devices`
    devices: tuple[str, ...]  # what the kubelet gave them
    served: str  # whose lane Allocate served with those devices: "namespace/name", or "" when no pod says

    def describe(self) -> str:
        whose = f"pod {self.served}'s lane" if self.served else "a lane no pod records"
        own = ",".join(self.pod.allocated_ids) or "none"
        return (
            f"the kubelet gave pod {self.pod.key} devices {','.join(self.devices)}, which Allocate served with "
            f"{whose}; the devices recorded for this pod's own lane are {own}"
        )


def find_mismatches(held: Mapping[str, tuple[str, ...]], pods: Sequence[NodePod]) -> list[Mismatch]:
    """Pods whose containers hold devices Allocate did not serve them with (pure: the audit's rule).

    Pods the API no longer has, pods that finished, and devices no pod records (an Allocate before this
    mechanism, or a pod recreated under the same name before the kubelet's list caught up) are left alone."""
    by_key = {p.key: p for p in pods}
    served_by = {tuple(sorted(p.allocated_ids)): p.key for p in pods if p.allocated_ids and not p.finished}
    out = []
    for key, devices in held.items():
        pod = by_key.get(key)
        if pod is None or pod.finished or pod.assignment is None:
            continue
        if tuple(sorted(pod.allocated_ids)) == tuple(sorted(devices)):
            continue
        served = served_by.get(tuple(sorted(devices)), "")
        if not pod.allocated_ids and not served:
            continue  # nothing says whose lane these devices carry
        out.append(Mismatch(pod, tuple(devices), served))
    return out


class AuditEvents(Protocol):
    async def event(self, pod: str, reason: str, message: str, *, warning: bool = False) -> None: ...

    async def node_event(self, reason: str, message: str, *, warning: bool = False) -> None: ...


class PodDeleter(Protocol):
    async def delete_pod(self, namespace: str, name: str, *, uid: str | None = None) -> object: ...


@dataclass
class LaneAudit:
    node: str
    kubelet: DeviceHolders
    pods: PodSource
    events: AuditEvents | None
    deleter: PodDeleter | None
    metrics: AgentMetrics | None = None
    on_mismatch: OnMismatch = "delete"
    _suspects: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)  # (pod uid, devices) seen once
    _acted: set[str] = field(default_factory=set)  # pod UIDs already reported (and deleted)
    _unavailable: str | None = None

    async def check(self) -> list[Mismatch]:
        """One audit: the mismatches confirmed now (seen in the last audit too), each acted on once."""
        try:
            held = await self.kubelet.devices()
        except PodResourcesUnavailable as err:
            if self._unavailable != str(err):
                log.warning("lane audit cannot read the kubelet's PodResources API: %s", err)
            self._unavailable = str(err)
            return []
        if self._unavailable is not None:
            log.info("lane audit reads the kubelet's PodResources API again")
            self._unavailable = None
        pods = await self.pods.pods_on_node(self.node)
        found = find_mismatches(held, pods)
        seen = {(m.pod.uid, m.devices) for m in found}
        confirmed = [
            m for m in found if (m.pod.uid, m.devices) in self._suspects and m.pod.uid not in self._acted
        ]
        self._suspects = seen
        live = {p.uid for p in pods}
        self._acted &= live
        for m in confirmed:
            self._acted.add(m.pod.uid)
            await self._act(m)
        return confirmed

    async def _act(self, m: Mismatch) -> None:
        delete = self.on_mismatch == "delete" and self.deleter is not None
        what = (
            "deleting the pod so that its controller recreates it and Allocate serves the new pod its own lane"
            if delete
            else "left running (--on-lane-mismatch report): delete the pod to put it on its own lane"
        )
        message = f"{m.describe()}: its containers run with another lane's GPU and limits; {what}"
        log.error("lane mismatch on %s: %s", self.node, message)
        if self.metrics is not None:
            self.metrics.counter("tessera_agent_lane_mismatches_total").labels(
                node=self.node, action="deleted" if delete else "reported"
            ).inc()
        if self.events is not None:
            await self.events.event(m.pod.key, "LaneMismatch", message, warning=True)
            await self.events.node_event("LaneMismatch", message, warning=True)
        if delete and self.deleter is not None:
            try:
                await self.deleter.delete_pod(m.pod.namespace, m.pod.name, uid=m.pod.uid)
            except Exception as err:  # an API error must not stop the audit; it is logged and counted above
                log.error("could not delete pod %s after a lane mismatch: %s", m.pod.key, err)

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        while not stop.is_set():
            try:
                await self.check()
            except Exception:  # an API hiccup must not end the audit; the next round retries
                log.exception("lane audit round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
