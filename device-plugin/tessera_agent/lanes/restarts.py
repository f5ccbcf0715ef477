"""Applying a BE share change on Kubernetes: delete BE pods that checkpoint, and say so in events.

MPS reads a client's active-thread percentage only when its CUDA context starts, so the BE feedback loop
(`interference.py`) applies a new share by deleting BE pods; their controller recreates them and Allocate
gives the new pods the new share. Deleting is the agent's most destructive act, so the restarter checks
again, against the API server and not only the agent's lane book:
- the pod is still the one that holds the lane (delete precondition on its UID);
- it still says `tessera.io/checkpoints: "true"` and is not latency-critical;
- it was not deleted by this agent within `min_interval_s` (a per-pod limit beside the loop's per-GPU one).
A refusal is a `RestartRefused` with the reason; the loop turns it into an event on the pod.

Events are core/v1 Events on the pod (`reportingComponent: tessera-agent`); a failed event write is logged
and never stops the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from tessera.api import contract
from tessera.kube import KubeClient, KubeError

from tessera_agent.lanes.book import LaneAdmissionError, PodLane, lane_class
from tessera_agent.pods import pod_info_from_manifest

log = logging.getLogger(__name__)

COMPONENT = "tessera-agent"


class RestartRefused(RuntimeError):
    """A BE pod the restarter will not delete, with the reason."""


class KubernetesPodRestarter:
    def __init__(
        self,
        api: KubeClient,
        *,
        min_interval_s: float,
        hp_priority_classes: tuple[str, ...] = (contract.CLASS_LATENCY_CRITICAL,),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not min_interval_s >= 0:
            raise ValueError(f"minimum restart interval must be non-negative, got {min_interval_s}")
        self._api = api
        self.min_interval_s = min_interval_s
        self.hp_priority_classes = hp_priority_classes
        self._clock = clock
        self._last: dict[str, float] = {}  # namespace/name → when this agent last deleted it
        self.deleted: list[str] = []

    async def restart(self, lane: PodLane, reason: str) -> None:
        now = self._clock()
        last = self._last.get(lane.pod)
        if last is not None and now - last < self.min_interval_s:
            raise RestartRefused(
                f"deleted {now - last:.0f}s ago, within the {self.min_interval_s:.0f}s minimum interval"
            )
        namespace, name = lane.pod.split("/", 1)

        try:
            pod = pod_info_from_manifest(await self._api.get_pod(namespace, name))
        except (KubeError, ValueError) as err:  # gone, unreachable, or not a pod: nothing is deleted
            raise RestartRefused(f"cannot read the pod: {_short(err)}") from None
        if pod.uid != lane.uid:
            raise RestartRefused(f"the pod was replaced (UID {pod.uid}, lane held by {lane.uid})")
        if not pod.checkpoints:
            raise RestartRefused(f'it does not say {contract.ANN_CHECKPOINTS}: "true"')
        try:
            klass = lane_class(pod, self.hp_priority_classes)
        except LaneAdmissionError as err:
            raise RestartRefused(str(err)) from None
        if klass != "BE":
            raise RestartRefused("it is latency-critical")
        try:
            await self._api.delete_pod(namespace, name, uid=lane.uid)
        except KubeError as err:
            raise RestartRefused(f"delete failed: {_short(err)}") from None
        self._last[lane.pod] = now
        self.deleted.append(lane.pod)
        log.info("deleted BE pod %s to apply a new share: %s", lane.pod, reason)


class KubernetesEventSink:
    """core/v1 Events on pods and on this node, from this node's agent."""

    def __init__(self, api: KubeClient, node: str) -> None:
        self._api = api
        self.node = node

    async def event(self, pod: str, reason: str, message: str, *, warning: bool = False) -> None:
        namespace, name = pod.split("/", 1)
        involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}
        await self._post(namespace, involved, reason, message, warning)

    async def node_event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """An event on this Node (in `default`, where the kubelet writes its Node events too)."""
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node}
        await self._post("default", involved, reason, message, warning)

    async def _post(
        self, namespace: str, involved: dict[str, str], reason: str, message: str, warning: bool
    ) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": f"{COMPONENT}-{self.node}",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self._api.create_event(namespace, body)
        except KubeError as err:  # an event lost is logged; the caller goes on
            what = f"{involved['kind'].lower()} {involved.get('namespace', '')}/{involved['name']}".replace(
                " /", " "
            )
            log.warning("event %s on %s not written: %s (%s)", reason, what, _short(err), message)


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."
