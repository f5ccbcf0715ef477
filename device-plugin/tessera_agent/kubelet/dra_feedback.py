"""The BE feedback loop (`lanes/interference.py`) on DRA lanes, whose book keys are claim UIDs.

- `ClaimLanes.pods_of`: the pods running in a claim's lane, the pods on this node its prepared claim is
  reserved for (as the checkpoint last read `status.reservedFor`), each with its own UID, name,
  `tessera.io/checkpoints` and `tessera.io/p99-dedicated-seconds`; events and restarts are theirs.
- `ClaimLanes.lanes_of`: the claims a pod holds, so its progress reports time its HP claim's lane.
- `ClaimPodRestarter`: before the pod restarter's own checks (pod UID precondition, checkpoints annotation,
  not latency-critical, minimum interval), the claim is read again: still the one prepared here, still
  reserved for the pod, still best-effort, and given the new share (`DraServicer.apply_be_share`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tessera_agent.kubelet.dra_lanes import ClaimError, ResourceClaim, claim_lane_class
from tessera_agent.kubelet.dra_plugin import DraServicer, reserved_pod_uids
from tessera_agent.lanes.book import PodLane
from tessera_agent.lanes.interference import Restarter
from tessera_agent.lanes.restarts import RestartRefused
from tessera_agent.pods import NodePod


class ClaimLanes:
    def __init__(self, servicer: DraServicer) -> None:
        self.servicer = servicer
        self._pods: dict[str, NodePod] = {}  # by UID, from the agent's last listing of the node's pods

    def note_pods(self, pods: Iterable[NodePod]) -> None:
        self._pods = {p.uid: p for p in pods if not p.finished}

    def pods_of(self, lane: PodLane) -> list[PodLane]:
        known = self.servicer.checkpoint.claims.get(lane.uid)
        if known is None or known.state != "prepared":
            return []
        out = []
        for uid in known.pod_uids:
            pod = self._pods.get(uid)
            if pod is not None:
                out.append(
                    dataclasses.replace(
                        lane,
                        uid=pod.uid,
                        pod=pod.key,
                        checkpoints=pod.checkpoints,
                        p99_dedicated_s=pod.p99_dedicated_s,
                        claim=lane.uid,
                    )
                )
        return out

    def lanes_of(self, pod: NodePod) -> set[str]:
        return {
            uid
            for uid, c in self.servicer.checkpoint.claims.items()
            if c.state == "prepared"
            and not c.observer
            and c.namespace == pod.namespace
            and pod.uid in c.pod_uids
        }


class ClaimPodRestarter:
    """Restart a pod of a BE claim's lane: the claim checked again, then `pods` (the pod restarter) deletes it."""

    def __init__(self, pods: Restarter, servicer: DraServicer) -> None:
        self.pods = pods
        self.servicer = servicer

    async def restart(self, lane: PodLane, reason: str) -> None:
        if lane.claim is None:
            raise RestartRefused("it runs in no claim's lane")
        known = self.servicer.checkpoint.claims.get(lane.claim)
        if known is None or known.state != "prepared":
            raise RestartRefused(f"its claim {lane.claim} is no longer prepared on this node")
        name = f"{known.namespace}/{known.name}"
        why = self.servicer.unshared.get(lane.claim)
        if why is not None:
            raise RestartRefused(f"its claim {name} could not be given the new share ({why})")
        try:
            claim = ResourceClaim.model_validate(
                await self.servicer.api.get_claim(known.namespace, known.name)
            )
        except Exception as err:  # gone, unreachable, unreadable: nothing is deleted
            raise RestartRefused(f"cannot read its claim {name}: {err}") from None
        if claim.metadata.uid != lane.claim:
            raise RestartRefused(
                f"its claim {name} was replaced (UID {claim.metadata.uid}, lane {lane.claim})"
            )
        if lane.uid not in reserved_pod_uids(claim):
            raise RestartRefused(f"its claim {name} is no longer reserved for it")
        if claim.status.allocation is None:
            raise RestartRefused(f"its claim {name} is no longer allocated")
        try:
            klass = claim_lane_class(claim)
        except ClaimError as err:
            raise RestartRefused(str(err)) from None
        if klass != "BE":
            raise RestartRefused(f"its claim {name} is latency-critical")
        await self.pods.restart(lane, reason)
