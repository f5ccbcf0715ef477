"""One GPU pod at a time between bind and the node agent's Allocate, per node.

The kubelet's device-plugin calls (GetPreferredAllocation, Allocate) carry slot IDs, never the pod they are
for, and the kubelet admits pods in an order of its own. With two pods of the same request bound to a node
and not yet allocated, nothing tells the agent which one an Allocate serves: a wrong guess gives each tenant
the other's GPU and lane. So the extender hands a node one such pod at a time: it binds a GPU pod to a node
only once no other pod there is *waiting* — bound with a `tessera.io/assignment`, not yet marked
`tessera.io/allocated` by the agent, not finished and not being deleted. A waiting pod stops blocking its node
when the agent marks it, when it ends or goes, or after `stale_s` (a kubelet that never admits it must not
hold the node forever; the agent then refuses an Allocate it cannot attribute rather than guess).

The state is rebuilt from the watched pods alone, so a restarted or newly elected extender keeps handing off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera.api import contract

log = logging.getLogger(__name__)
JsonObj = dict[str, Any]
_FINISHED = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Waiting:
    """A pod bound to a node whose Allocate has not happened yet."""

    uid: str
    key: str  # namespace/name
    since: float  # clock() when this extender bound it or first saw it waiting


def waiting_node(pod: JsonObj) -> str | None:
    """The node `pod` waits on for its Allocate, or None when it does not wait (see the module docstring)."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    annotations = meta.get("annotations") or {}
    if not node or contract.ANN_ASSIGNMENT not in annotations or contract.ANN_ALLOCATED in annotations:
        return None
    if (pod.get("status") or {}).get("extendedResourceClaimStatus"):
        return None  # served by the claim kube-scheduler made for it (DRA lanes): no Allocate to wait for
    if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in _FINISHED:
        return None
    return str(node)


def _before_bind(pod: JsonObj) -> bool:
    """A pod seen unbound and alive: not yet bound in this view, which cannot end a wait."""
    meta = pod.get("metadata") or {}
    return (
        not (pod.get("spec") or {}).get("nodeName")
        and not meta.get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") not in _FINISHED
        and contract.ANN_ALLOCATED not in (meta.get("annotations") or {})
    )


@dataclass
class Handoffs:
    """Waiting pods per node, and the binds that wait for a node to be handed on."""

    stale_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    # How long a node prioritize ranked first for a pod stays promised to it while kube-scheduler's binding
    # cycle gets to /bind (kube-scheduler's httpTimeout for the extender, 5 s in the chart).
    promise_s: float = 5.0
    _promised: dict[str, tuple[str, float]] = field(default_factory=dict)  # node → (uid, since)
    _promise_of: dict[str, str] = field(default_factory=dict)  # uid → node
    _waiting: dict[str, dict[str, Waiting]] = field(default_factory=dict)  # node → uid → waiting pod
    _where: dict[str, str] = field(default_factory=dict)  # uid → node
    _cleared: dict[str, asyncio.Event] = field(default_factory=dict)  # node → set when a pod stops waiting
    _stale_logged: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.stale_s > 0:
            raise ValueError(f"the handoff's stale time must be positive, got {self.stale_s}")

    def bound(self, node: str, uid: str, key: str, seen: JsonObj | None = None) -> None:
        """This extender bound `uid` to `node`: it waits there until the watch says otherwise. `seen` is the
        pod as the watch has it now, which may already show it served (a fast agent) or ended."""
        meta = (seen or {}).get("metadata") or {}
        if (
            meta.get("uid") == uid
            and (seen or {}).get("spec", {}).get("nodeName")
            and waiting_node(seen or {}) is None
        ):
            return
        self._add(node, Waiting(uid, key, self.clock()))

    def observe(self, pod: JsonObj) -> str | None:
        """Apply a watched (or listed) pod; the node it stopped waiting on, if it did."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return None
        node = waiting_node(pod)
        if node is None:
            if _before_bind(pod):
                # A view older than this extender's own Binding (the watch may deliver the assignment patch
                # after the bind was recorded): it says nothing about whether the pod still waits.
                return None
            return self.forget(uid)
        if self._where.get(uid) != node:
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
            self._add(node, Waiting(uid, key, self.clock()))
        return None

    def forget(self, uid: str) -> str | None:
        """`uid` waits no more (allocated, finished, deleted); the node it waited on, if any."""
        node = self._where.pop(uid, None)
        if node is None:
            return None
        self._waiting.get(node, {}).pop(uid, None)
        if not self._waiting.get(node):
            self._waiting.pop(node, None)
        self._stale_logged.discard(uid)
        event = self._cleared.pop(node, None)
        if event is not None:
            event.set()
        return node

    def replace(self, pods: list[JsonObj]) -> None:
        """A relist: keep the waiting pods (and their times) that still wait, add the new ones."""
        live = {str((p.get("metadata") or {}).get("uid") or "") for p in pods}
        for uid in [u for u in self._where if u not in live]:
            self.forget(uid)
        for pod in pods:
            self.observe(pod)

    def blocker(self, node: str, exclude: str = "") -> Waiting | None:
        """The oldest pod still waiting on `node` and not yet stale (`exclude`: the pod being bound)."""
        now = self.clock()
        live = []
        for w in self._waiting.get(node, {}).values():
            if w.uid == exclude:
                continue
            if now - w.since < self.stale_s:
                live.append(w)
            elif w.uid not in self._stale_logged:
                self._stale_logged.add(w.uid)
                log.warning(
                    "pod %s bound to %s %.0fs ago is still not allocated by the node agent; the node is handed "
                    "on (is the kubelet admitting pods?)",
                    w.key,
                    node,
                    now - w.since,
                )
        return min(live, key=lambda w: w.since) if live else None

    async def wait_clear(self, node: str, timeout_s: float, exclude: str = "") -> Waiting | None:
        """Wait up to `timeout_s` for `node` to have no live waiting pod; the blocker still there, or None."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            blocker = self.blocker(node, exclude)
            left = deadline - loop.time()
            if blocker is None or left <= 0:
                return blocker
            event = self._cleared.setdefault(node, asyncio.Event())
            # wake at the latest when the blocker turns stale
            until_stale = blocker.since + self.stale_s - self.clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(0.0, min(left, until_stale)) + 0.001)

    def promise(self, node: str, uid: str) -> None:
        """Prioritize ranked `node` first for `uid`: other pods are steered elsewhere until its bind ends."""
        self.settle(uid)
        held = self._promised.get(node)
        if held is not None:  # an older promise of this node (its pod never bound): forget it whole
            self._promise_of.pop(held[0], None)
        self._promised[node] = (uid, self.clock())
        self._promise_of[uid] = node

    def settle(self, uid: str) -> None:
        """`uid`'s bind ended (bound: it now waits there; refused: the node is free again)."""
        node = self._promise_of.pop(uid, None)
        if node is not None and self._promised.get(node, ("", 0.0))[0] == uid:
            del self._promised[node]

    def busy(self, node: str, uid: str) -> bool:
        """Whether a GPU pod other than `uid` holds `node` now: waiting for its Allocate, or on its way to a
        bind there (promised by prioritize within `promise_s`). Binding `uid` there would wait for it."""
        held = self._promised.get(node)
        if held is not None and held[0] != uid:
            if self.clock() - held[1] < self.promise_s:
                return True
            self.settle(held[0])
        return self.blocker(node, exclude=uid) is not None

    def busy_nodes(self, uid: str) -> set[str]:
        """Every node `busy` for `uid` (looked up among the few promised or waited on, not every node)."""
        return {n for n in set(self._promised) | set(self._waiting) if self.busy(n, uid)}

    def waiting_on(self, node: str) -> list[Waiting]:
        return list(self._waiting.get(node, {}).values())

    def _add(self, node: str, w: Waiting) -> None:
        old = self._where.get(w.uid)
        if old == node:
            return
        if old is not None:
            self.forget(w.uid)
        self._waiting.setdefault(node, {})[w.uid] = w
        self._where[w.uid] = node
