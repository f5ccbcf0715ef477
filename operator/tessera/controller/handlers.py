"""kopf handlers: thin adapters from Kubernetes events to the controller's reconcilers.

`make_registry` builds a fresh kopf registry bound to one `Controller` (its cluster view, arbiter and API
client), so tests can run two operators in one process and `tessera operator` runs one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf

from tessera.api import contract
from tessera.api.resources import ManifestError, parse_queue
from tessera.controller.apps import AppRecord, record_from_body, template_of
from tessera.controller.arbiter import Arbiter
from tessera.controller.claims import Claim, app_claim, deployment_claim, trialgroup_claim, unloaded
from tessera.controller.conditions import (
    Readiness,
    condition,
    find,
    generation_of,
    invalid_status,
    with_ready,
)
from tessera.controller.config import OperatorConfig
from tessera.controller.context import Context
from tessera.controller.deployments import ModelDeployments
from tessera.controller.essence import LeanDiffBaseStorage, LeanProgressStorage
from tessera.controller.gate import Group, QueuedPods, QueueGate, group_workloads
from tessera.controller.kube import PODS, KubeApi
from tessera.controller.metrics import operator_metrics
from tessera.controller.pods import template_errors
from tessera.controller.queue_status import Workload
from tessera.controller.queues import QueueBook, owner_id
from tessera.controller.quotas import Requests, app_requests, quota_block
from tessera.controller.reconciler import KindReconciler
from tessera.controller.tuning import TrialGroups
from tessera.controller.usage import UsageMetrics
from tessera.controller.view import ClusterView, healthy_gpus
from tessera.metrics import ComponentMetrics
from tessera.policy.queues.division import headroom
from tessera.policy.queues.reclaim import Holding, Reclaim
from tessera.policy.queues.training import entitled, with_default
from tessera.policy.themis import admit

log = logging.getLogger(__name__)

G, V = contract.GROUP, contract.VERSION
T = TypeVar("T")
CLAIM_INDICES = {
    contract.KIND_APP: "app_claims",
    contract.KIND_TRIALGROUP: "trialgroup_claims",
    contract.KIND_MODELDEPLOYMENT: "deployment_claims",
}


@dataclass
class Controller:
    config: OperatorConfig
    metrics: ComponentMetrics = field(default_factory=operator_metrics)
    view: ClusterView = field(default_factory=ClusterView)
    api: KubeApi | None = None
    arbiter: Arbiter | None = None
    trialgroups: TrialGroups | None = None
    deployments: ModelDeployments | None = None
    connection: kopf.ConnectionInfo | None = None
    # kind → kopf index of the GPUs each object claims in the API server (controller/claims.py)
    claims: dict[str, Mapping[tuple[str, str], Iterable[Claim]]] = field(default_factory=dict)
    watched: float | None = None  # when the node or pod watch last delivered an event (config.clock)
    _tasks: set[asyncio.Future[None]] = field(default_factory=set)
    _stopping: bool = False
    usage: UsageMetrics = field(init=False)
    queues: QueueBook = field(default_factory=QueueBook)  # Queues and namespace labels, watched
    # PriorityClass name → value, watched with the queues (an App's priority inside its queue); None: not
    # watched (queues off), and priorities are not used.
    priority_classes: dict[str, int] | None = None
    # Pods of other kinds waiting in (or admitted by) their namespace's queue (controller/gate.py).
    queued: QueuedPods = field(default_factory=QueuedPods)
    _pods_waiting_since: dict[tuple[str, str], float] = field(default_factory=dict)  # group → since (clock)
    gate: QueueGate = field(init=False)
    _admit_due: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self.usage = UsageMetrics(self.metrics)
        self.gate = QueueGate(
            self.queued, self.queues.queue_of, self.max_gpus, self.pod_room, self.post_event, self.pod_quota
        )

    def pod_quota(self, group: Group) -> tuple[str, str] | None:
        """(reason, message) when the gated group's CPU or memory requests would take its queue's pods (its
        Apps' and those admitted through its gate) past the queue's maxCPU or maxMemory; None when they fit."""
        q = self.queues.queue_of(group.namespace)
        spec = self.queues.specs.get(q)
        if spec is None or (spec.max_cpu is None and spec.max_memory is None):
            return None
        used = self.queued.admitted_requests(self.queues.queue_of).get(q, Requests())
        for rec in self.arbiter.records.values() if self.arbiter is not None else ():
            if not rec.done and self.queues.queue_of(rec.namespace) == q:
                used = used + app_requests(rec)
        kind, _, name = group.key.partition("/")
        return quota_block(q, spec, used, group.waiting_requests, f"{kind} {name}")

    def pod_room(self, namespace: str, want: int, group: Group) -> float | None:
        """GPUs a gated group may take now: its queue's room, and no more than the GPUs free now (an
        admitted pod counts as its queue's holding; admitted onto GPUs another queue still holds, it would
        wait in the scheduler while nothing reclaims for it). None: no queues."""
        room = self.queue_room(namespace, want, group)
        if room is None:
            return None
        taken = self.app_gpus() | self.reserved_by_others() | self.view.used_by_pods(contract.LABEL_APP)
        free = sum(1 for g in healthy_gpus(self.view.cluster()) if g not in taken)
        return min(room, float(free - self.queued.admitted_unbound()))

    def max_gpus(self, queue: str) -> float | None:
        spec = self.queues.specs.get(queue)
        return None if spec is None else spec.max_gpus

    def admit_soon(self, delay_s: float = 0.05) -> None:
        """An admission pass over the gated pods shortly, once for every event until then."""
        if self.api is None or self._stopping or self._admit_due is not None:
            return
        if not any(p.gated and not p.done for p in self.queued.pods.values()):
            return

        def fire() -> None:
            self._admit_due = None
            if not self._stopping:
                self._tasks.add(task := asyncio.ensure_future(self.admit()))
                task.add_done_callback(self._tasks.discard)

        self._admit_due = asyncio.get_running_loop().call_later(delay_s, fire)

    async def admit(self) -> None:
        """One admission pass over the gated pods (normally run by `admit_soon`). Not while objects hold
        GPUs their handlers have not loaded yet (just started, or taken over): the queues' room would
        leave their holdings out, so the pass waits for them."""
        if self.unloaded_gpus():
            self.admit_soon(delay_s=1.0)
            return
        try:
            admitted = await self.gate.run(self.api)
        except Exception:  # a pass that failed is retried at the next event; it must not stop the operator
            log.exception("queue admission pass failed")
            return
        if admitted:
            self.redivide()
        if self.arbiter is not None:  # the groups' waits and reasons, in the Queues' status
            self.queue_news()
            await self.arbiter.refresh_queues()

    def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        if self.config.post_events and self.api is not None and not self._stopping:
            self._tasks.add(task := asyncio.ensure_future(self.api.post_event(body, type_, reason, message)))
            task.add_done_callback(self._tasks.discard)

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def stop(self, drain_s: float = 5.0, work_drain_s: float = 15.0) -> None:
        """Let a round, status refresh or pass in flight finish its writes (for up to `work_drain_s`: the
        pod's default 30 s grace leaves room for the rest), and the events still being posted (up to
        `drain_s`), cancel the rest, then close the API client. kopf runs this cleanup while timers may be
        mid-write: a write on the closed session failed with a traceback on every stop, and an event task
        left running past the close failed the same way (kopf re-raises the failure of any task the
        operator leaves behind). Timers that fire once the stop began start nothing (`stopping`)."""
        self._stopping = True
        if self._admit_due is not None:
            self._admit_due.cancel()
        deadline = asyncio.get_running_loop().time() + work_drain_s
        owners: tuple[Arbiter | TrialGroups | ModelDeployments | QueueGate | None, ...] = (
            self.arbiter,
            self.trialgroups,
            self.deployments,
            self.gate,
        )
        for owner in owners:
            if owner is None:
                continue
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            try:  # held from now on: nothing else writes through the client about to close
                await asyncio.wait_for(owner.lock.acquire(), timeout=left)
            except TimeoutError:
                log.warning("operator stopping with a %s pass still writing", type(owner).__name__)
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=drain_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        if self.api is not None:
            await self.api.close()

    def start(self, conn: kopf.ConnectionInfo) -> None:
        self.api = KubeApi(conn)
        ctx = Context(self.config, self.view, self.api, self.metrics, self.post_event)
        self.arbiter = Arbiter(ctx)
        self.trialgroups = TrialGroups(ctx, self.serving_and_app_gpus)
        self.deployments = ModelDeployments(ctx, self.app_and_pool_gpus)
        self.arbiter.reserved = self.reserved_by_others
        self.arbiter.queues = self.queues
        self.arbiter.priority_classes = self.priority_classes
        self.arbiter.outside = self.division_outside
        self.arbiter.outside_waiting = self.division_waiting
        self.arbiter.outside_holdings = self.queue_outside_holdings
        self.arbiter.outside_workloads = self.queue_outside_workloads
        self.arbiter.pod_requests = lambda: self.queued.admitted_requests(self.queues.queue_of)
        self.trialgroups.reclaim_request = self.deployments.reclaim_request = self.reclaim_request
        self.trialgroups.gave_back = self.deployments.gave_back = self.gave_back
        self.trialgroups.queue_room = self.queue_room
        self.deployments.queue_room = self.queue_room
        self.trialgroups.queue_condition = self.deployments.queue_condition = self.queues.membership
        self.trialgroups.waiting_changed = self.deployments.waiting_changed = self.redivide
        self.trialgroups.queue_changed = self.deployments.queue_changed = self.queue_news
        self.arbiter.after_round = self.admit_soon

    def app_gpus(self) -> set[str]:
        """GPUs that App leases hold (TrialGroup pools and serving are drawn from the rest)."""
        if self.arbiter is None:
            return set()
        return {g for r in self.arbiter.records.values() if not r.done for g in r.held()}

    def unloaded_gpus(self) -> set[str]:
        """GPUs held by objects whose handlers have not run yet in this operator (just started or taken
        over): their leases, pools and replicas as the API server holds them."""
        loaded: dict[str, dict[tuple[str, str], str]] = {
            contract.KIND_APP: {k: r.uid for k, r in self.arbiter.records.items()} if self.arbiter else {},
            contract.KIND_TRIALGROUP: (
                {k: r.uid for k, r in self.trialgroups.records.items()} if self.trialgroups else {}
            ),
            contract.KIND_MODELDEPLOYMENT: (
                {k: r.uid for k, r in self.deployments.records.items()} if self.deployments else {}
            ),
        }
        now = self.config.clock()
        claims = dict(self.claims)
        ledger = self.arbiter.ledger if self.arbiter is not None else None
        if ledger is not None and ledger.apps and contract.KIND_APP in claims:
            # Leases a round renewed after the App's status was written: held until the ledger says.
            apps = claims[contract.KIND_APP]
            claims[contract.KIND_APP] = {k: [ledger.claim(k, c) for c in v] for k, v in apps.items()}
        return {g for kind, index in claims.items() for g in unloaded(index, loaded[kind], now)}

    def division_outside(self) -> dict[str, float]:
        """`queue_outside` as the rounds' division sees it: admitted pods hold GPUs once bound; until then
        they are waiting work (`division_waiting`), so the GPUs they are about to take stay free for them
        rather than go to an App in the round between their admission and their binding."""
        out = self.queue_outside()
        for q, n in self.queued.held(self.queues.queue_of).items():
            out[q] -= n
        for q, n in self.queued.held(self.queues.queue_of, bound_only=True).items():
            out[q] += n
        return {q: n for q, n in out.items() if n > 1e-9}

    def division_waiting(self) -> dict[str, float]:
        out = self.queue_outside_waiting()
        bound = self.queued.held(self.queues.queue_of, bound_only=True)
        for q, n in self.queued.held(self.queues.queue_of).items():
            if n - bound.get(q, 0.0) > 1e-9:
                out[q] = out.get(q, 0.0) + n - bound.get(q, 0.0)
        return out

    def queue_outside(self) -> dict[str, float]:
        """GPUs each team queue holds in TrialGroup pools, serving replicas and admitted pods of other kinds
        (its Apps get the rest of its share)."""
        out = self.queued.held(self.queues.queue_of)
        for rec in self.trialgroups.records.values() if self.trialgroups is not None else ():
            if not rec.done and rec.pool:
                q = self.queues.queue_of(rec.namespace)
                out[q] = out.get(q, 0.0) + len(rec.pool)
        for srv in self.deployments.records.values() if self.deployments is not None else ():
            if not srv.spec.placement.pool and srv.held():  # a shared serving pool serves several queues
                q = self.queues.queue_of(srv.namespace)
                out[q] = out.get(q, 0.0) + len(srv.held())
        return out

    def queue_outside_waiting(self, skip: Group | None = None) -> dict[str, float]:
        """GPUs each team queue's TrialGroups and ModelDeployments wait for within the queue's share, and its
        gated pods (all but `skip`): work waiting, which the division counts and reclaims for as it does for
        its Apps."""
        out = self.queued.waiting(self.queues.queue_of, self.max_gpus, skip)
        waiting = [
            (r.namespace, r.waiting_gpus)
            for r in (self.trialgroups.records.values() if self.trialgroups is not None else ())
            if not r.done and not r.pool
        ]
        waiting += [
            (r.namespace, r.waiting_gpus)
            for r in (self.deployments.records.values() if self.deployments is not None else ())
        ]
        for namespace, n in waiting:
            if n > 0:
                q = self.queues.queue_of(namespace)
                out[q] = out.get(q, 0.0) + n
        return out

    def queue_outside_holdings(self) -> list[Holding]:
        """Each TrialGroup pool and each ModelDeployment's replicas as a holding of its queue, which
        reclaim may take from (owner id "Kind/namespace/name"; since: when it last took GPUs), and the
        admitted pods of other kinds, which it never takes."""
        out = self.queued.holdings(self.queues.queue_of)
        for rec in self.trialgroups.records.values() if self.trialgroups is not None else ():
            if not rec.done and rec.pool:
                owner = owner_id(contract.KIND_TRIALGROUP, rec.namespace, rec.name)
                q = self.queues.queue_of(rec.namespace)
                out.append(Holding(q, owner, float(len(rec.pool)), rec.since, math.inf))
        for srv in self.deployments.records.values() if self.deployments is not None else ():
            if not srv.spec.placement.pool and srv.held():
                owner = owner_id(contract.KIND_MODELDEPLOYMENT, srv.namespace, srv.name)
                q = self.queues.queue_of(srv.namespace)
                out.append(Holding(q, owner, float(len(srv.held())), srv.since, math.inf))
        return out

    def queue_outside_workloads(self) -> list[tuple[str, Workload]]:
        """Each TrialGroup not done, each ModelDeployment outside a shared serving pool and each queued pod
        group (a Job's pods, or a plain pod), with its queue, as the Queue's status counts them: GPUs of its
        pool, replicas or admitted pods, and what it waits for and why."""
        out = group_workloads(
            self.queued,
            self.queues.queue_of,
            self.max_gpus,
            self._pods_waiting_since,
            self.config.clock(),
            self.gate.over_quota,
        )
        for rec in self.trialgroups.records.values() if self.trialgroups is not None else ():
            if not rec.done:
                wants = 0 if rec.pool else rec.wants
                since = rec.waiting_since if rec.waiting_since is not None else self.config.clock()
                w = Workload(
                    contract.KIND_TRIALGROUP,
                    rec.namespace,
                    rec.name,
                    float(len(rec.pool)),
                    float(wants),
                    since,
                    rec.wait_reason,
                    rec.wait_message,
                )
                out.append((self.queues.queue_of(rec.namespace), w))
        for srv in self.deployments.records.values() if self.deployments is not None else ():
            if not srv.spec.placement.pool:
                since = srv.waiting_since if srv.waiting_since is not None else self.config.clock()
                w = Workload(
                    contract.KIND_MODELDEPLOYMENT,
                    srv.namespace,
                    srv.name,
                    float(len(srv.held())),
                    float(srv.wants),
                    since,
                    srv.wait_reason,
                    srv.wait_message,
                )
                out.append((self.queues.queue_of(srv.namespace), w))
        return out

    def reclaim_request(self, owner: str) -> Reclaim | None:
        """What the last round asked this TrialGroup or ModelDeployment to give back (None: nothing)."""
        return None if self.arbiter is None else self.arbiter.outside_reclaims.get(owner)

    def gave_back(self, owner: str, request: Reclaim, gpus: int) -> None:
        """An object gave GPUs back: the request is done, the Queue that gains hears of it, and the next
        round hands the GPUs on."""
        if self.arbiter is None:
            return
        self.arbiter.outside_reclaims.pop(owner, None)
        uid = self.queues.uids.get(request.for_queue)
        if uid:
            body = {
                "apiVersion": contract.API_VERSION,
                "kind": contract.KIND_QUEUE,
                "metadata": {"name": request.for_queue, "namespace": "", "uid": uid},
            }
            self.post_event(
                body, "Normal", "Reclaimed", f"{gpus} GPU(s) of {owner} reclaimed: {request.reason}"
            )
        self.arbiter.dirty = True

    def redivide(self) -> None:
        """What other objects wait for changed: the next round divides (and reclaims) with it."""
        if self.arbiter is not None and self.queues.active:
            self.arbiter.dirty = True

    async def round_after_delete(self) -> None:
        """A round now for an object deleted under team queues: the objects' timers drive rounds, and with
        a queue's last object gone none would be left to refresh its status (held, waiting, maxRho)."""
        if self.arbiter is not None and self.queues.active and not self.stopping:
            await self.arbiter.maybe_run()

    def queue_news(self) -> None:
        """What a TrialGroup, ModelDeployment or queued pod holds or waits for changed: the Queues' status
        is refreshed at the next tick, without waiting for a round."""
        if self.arbiter is not None and self.queues.active:
            self.arbiter.queues_stale = True

    def queue_room(self, namespace: str, want: int, skip: Group | None = None) -> float | None:
        """GPUs an object of `namespace` wanting `want` may take now: its queue's entitlement in a division
        counting every queue's Apps, pools, replicas, admitted pods and what other objects wait for (the
        asking object's own wait is cleared before it asks, or is `skip`: `want` stands for it), less what
        the queue holds. None: no queues."""
        if not self.queues.active or self.arbiter is None:
            return None
        outside = self.queue_outside()
        demand, held = dict(outside), dict(outside)
        for q, n in self.queue_outside_waiting(skip).items():
            demand[q] = demand.get(q, 0.0) + n
        for rec in self.arbiter.records.values():
            if not rec.done:
                q = self.queues.queue_of(rec.namespace)
                demand[q] = demand.get(q, 0.0) + rec.demand()
                held[q] = held.get(q, 0.0) + len(rec.held())
        q = self.queues.queue_of(namespace)
        demand[q] = demand.get(q, 0.0) + want
        capacity = len(healthy_gpus(self.view.cluster()))
        nodes = with_default(self.queues.nodes())
        share = entitled(capacity, nodes, demand)
        # Within the ancestors' maxima too: a sibling may hold above its share until its lease ends.
        room = headroom(nodes, held).get(q, math.inf)
        return max(0.0, min(share.get(q, 0.0) - held.get(q, 0.0), room))

    def reserved_by_others(self) -> set[str]:
        """GPUs Themis must not auction: TrialGroup pools, serving replicas, and what objects not loaded
        yet hold (Apps' leases among them)."""
        out = self.trialgroups.reserved() if self.trialgroups is not None else set()
        out |= self.deployments.reserved() if self.deployments is not None else set()
        return out | self.unloaded_gpus()

    def serving_and_app_gpus(self) -> set[str]:
        out = self.app_gpus() | (self.deployments.reserved() if self.deployments is not None else set())
        return out | self.unloaded_gpus()

    def app_and_pool_gpus(self) -> set[str]:
        out = self.app_gpus() | (self.trialgroups.reserved() if self.trialgroups is not None else set())
        return out | self.unloaded_gpus()

    @staticmethod
    def need(part: T | None) -> T:
        """A part made at login (arbiter, reconcilers); a handler that runs before it retries."""
        if part is None:
            raise kopf.TemporaryError("operator not logged in yet", delay=1)
        return part

    def liveness(self) -> dict[str, Any]:
        """The liveness probe's report: each controller's passes (`PassClock.report`, which raises past
        the deadline) and seconds since the node or pod watch last delivered an event."""
        deadline = self.config.pass_deadline
        out: dict[str, Any] = {
            name: part.passes.report(deadline)
            for name, part in (
                ("arbiter", self.arbiter),
                ("trialgroups", self.trialgroups),
                ("deployments", self.deployments),
            )
            if part is not None
        }
        since = None if self.watched is None else max(0.0, self.config.clock() - self.watched)
        out["secondsSinceWatchEvent"] = since
        return out


def login_in_cluster(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's service-account login, addressed as client-go's in-cluster config addresses the API server:
    `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, which the kubelet sets in every container.

    kopf's own login uses the name `kubernetes.default.svc`, which only resolves through the cluster's DNS:
    where that is down or absent the operator could not start (seen on the real test node, which runs no
    DNS). None outside a cluster (no service-account token)."""
    conn = kopf.login_with_service_account(**kwargs)
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if conn is None or not host or not port:
        return conn
    if ":" in host:  # an IPv6 Service address
        host = f"[{host}]"
    return dataclasses.replace(conn, server=f"https://{host}:{port}")


def _login(controller: Controller, **kwargs: Any) -> kopf.ConnectionInfo:
    conn = controller.connection
    if conn is None:
        conn = login_in_cluster(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if conn is None:
        raise kopf.LoginError("no credentials: not in a cluster and no kubeconfig")
    controller.start(conn)
    return conn


def make_registry(
    config: OperatorConfig, connection: kopf.ConnectionInfo | None = None
) -> tuple[kopf.OperatorRegistry, Controller]:
    registry = kopf.OperatorRegistry()
    ctl = Controller(config, connection=connection)
    _operator_handlers(registry, ctl)
    _claim_indices(registry)
    _view_handlers(registry, ctl)
    _app_handlers(registry, ctl)
    _kind_handlers(registry, ctl, contract.PLURAL_TRIALGROUP, "trialgroup", lambda: ctl.trialgroups, "spec")
    _kind_handlers(registry, ctl, contract.PLURAL_MODELDEPLOYMENT, "deployment", lambda: ctl.deployments)
    if config.queues:
        _queue_handlers(registry, ctl)
    return registry, ctl


def _operator_handlers(registry: kopf.OperatorRegistry, ctl: Controller) -> None:
    """Login, kopf's settings, the API client's close, and the liveness probes."""
    config = ctl.config

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        return _login(ctl, **kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        ctl.claims = {kind: kwargs[index] for kind, index in CLAIM_INDICES.items()}
        settings.peering.standalone = config.standalone
        settings.peering.name = config.peering_name
        settings.peering.priority = config.priority
        settings.peering.clusterwide = config.clusterwide
        settings.peering.lifetime = config.peering_lifetime_s
        settings.posting.enabled = False  # decisions are posted as events explicitly (Controller.post_event)
        settings.persistence.finalizer = contract.FINALIZER
        # The same annotation and essence as kopf's default, built without deep-copying status (each
        # of a round's status writes comes back as a watch event).
        settings.persistence.diffbase_storage = LeanDiffBaseStorage()
        settings.persistence.progress_storage = LeanProgressStorage()  # and clears progress without copying
        settings.watching.server_timeout = 60
        # A deletion that finds a tick mid-pass re-checks this often (kopf's 60 s held finalizers a minute).
        settings.background.cancellation_polling = config.deletion_recheck_s

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        await ctl.stop()

    # Served on --liveness (/healthz): a probe that raises answers 500, and the kubelet restarts the pod.
    @kopf.on.probe(id="passes", errors=kopf.ErrorsMode.PERMANENT, registry=registry)
    async def passes(**_: Any) -> dict[str, Any]:
        return ctl.liveness()


def _claim_indices(registry: kopf.OperatorRegistry) -> None:
    """What each object claims, known before any handler runs: kopf fills indices from its first listing
    and only then runs handlers, so a handler that runs a round sees the leases, pools and replicas of
    objects whose own handlers have not run yet."""
    claims: dict[str, tuple[str, Callable[[Mapping[str, Any]], Claim]]] = {
        contract.KIND_APP: (contract.PLURAL_APP, app_claim),
        contract.KIND_TRIALGROUP: (contract.PLURAL_TRIALGROUP, trialgroup_claim),
        contract.KIND_MODELDEPLOYMENT: (contract.PLURAL_MODELDEPLOYMENT, deployment_claim),
    }
    for kind, (plural, claim_of) in claims.items():
        kopf.index(G, V, plural, id=CLAIM_INDICES[kind], registry=registry)(_claim_index(claim_of))


def _claim_index(
    claim_of: Callable[[Mapping[str, Any]], Claim],
) -> Callable[..., Awaitable[dict[tuple[str, str], Claim]]]:
    # async: kopf runs a plain `def` handler in a worker thread, a thread hand-off on every watch event of
    # every App (each of a round's status writes comes back as one).
    async def index(
        body: kopf.Body, namespace: str | None, name: str, **_: Any
    ) -> dict[tuple[str, str], Claim]:
        return {(namespace or "", name): claim_of(body)}

    return index


def _view_handlers(registry: kopf.OperatorRegistry, ctl: Controller) -> None:
    """The cluster view from the node and pod watches. async: kopf runs a plain `def` handler in a worker
    thread, where it mutated the view while a round or another event's handler iterated it on the loop
    ("dictionary changed size during iteration")."""

    @kopf.on.event("", "v1", "nodes", id="node_event", registry=registry)
    async def node_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        ctl.watched = ctl.config.clock()
        # Only a change to the node's GPUs (inventory, health, rack) is a Themis resource event: at
        # thousands of nodes their status heartbeats alone would start a round every tick.
        if ctl.view.on_node(dict(body), deleted=type == "DELETED") and ctl.arbiter is not None:
            ctl.arbiter.dirty = True

    @kopf.on.event("", "v1", "pods", id="pod_event", registry=registry)
    async def pod_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        ctl.watched = ctl.config.clock()
        key = (body.metadata.namespace or "", body.metadata.name or "")
        before = ctl.view.pods.get(key)
        ctl.view.on_pod(dict(body), deleted=type == "DELETED")
        after = ctl.view.pods.get(key)
        freed = before is not None and before.holds_gpus and (after is None or not after.holds_gpus)
        if before != after:
            ctl.usage.update_soon(ctl.view.pods.values)  # tessera_namespace_gpus, tessera_pending_pods
        if freed and ctl.arbiter is not None:
            ctl.arbiter.dirty = True  # GPUs became available: a Themis resource-available event
        if ctl.queued.on_pod(dict(body), deleted=type == "DELETED"):
            ctl.redivide()  # what its queue holds or waits for changed
            ctl.queue_news()
            freed = True
        if freed:
            ctl.admit_soon()


def _app_handlers(registry: kopf.OperatorRegistry, ctl: Controller) -> None:
    """Apps: admission and membership in the one shared arbiter; its rounds do the rest.

    Handlers of the objects have explicit ids: kopf keeps a handler's progress (retries) in an annotation
    named after it, and the id of a function defined in another (its qualified name) may not be a valid
    annotation name."""

    @kopf.on.resume(G, V, contract.PLURAL_APP, id="app_reconcile", registry=registry)
    @kopf.on.create(G, V, contract.PLURAL_APP, id="app_reconcile", registry=registry)
    @kopf.on.update(G, V, contract.PLURAL_APP, id="app_reconcile", field="spec", registry=registry)
    async def app_reconcile(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await reconcile_app(ctl, dict(body), patch)

    @kopf.timer(G, V, contract.PLURAL_APP, id="app_tick", interval=ctl.config.tick, registry=registry)
    async def app_tick(**_: Any) -> None:
        # Every App's timer drives the one shared arbiter; a round runs only when due, so N timers make
        # one round per lease period. kopf stops timers on a paused (lower-priority) peer. Between rounds
        # the stale statuses are refreshed a tick's share at a time.
        if ctl.arbiter is not None and not ctl.stopping:
            await ctl.arbiter.maybe_run()
            await ctl.arbiter.refresh_stale()

    @kopf.on.delete(G, V, contract.PLURAL_APP, id="app_delete", registry=registry)
    async def app_delete(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> None:
        namespace = namespaced(namespace)
        await ctl.need(ctl.arbiter).remove((namespace, name))
        await ctl.round_after_delete()
        assert ctl.api is not None
        pods = ctl.view.pods_with(contract.LABEL_APP, name, namespace)
        for pod in pods:
            await ctl.api.delete(PODS, namespace, pod.name, grace_seconds=ctl.config.preemption_grace_s)
        ctl.post_event(dict(body), "Normal", "Cleanup", f"deleted {len(pods)} pod(s); leases returned")
        ctl.admit_soon()


def _queue_handlers(registry: kopf.OperatorRegistry, ctl: Controller) -> None:
    """Queues and the namespace label `tessera.io/queue`: kept in the controller's QueueBook, which the
    arbiter's next round divides by. Watch events only: a Queue needs no finalizer, since deleting one just
    moves its namespaces' objects to `default` at the next round.

    The book is kept by index handlers: kopf runs no handler of any kind until every index holds its first
    listing, so the first round after a start (or a takeover) already knows every Queue and namespace
    label. Kept by event handlers alone, a round could run before they had all run: it divided without the
    queues, and wrote the objects of labelled namespaces without their QueueResolved condition (False
    again, with a second Warning event, once the labels came in). The event handlers take deletions, which
    kopf's indices only discard, and start a round."""

    def dirty() -> None:
        if ctl.arbiter is not None:
            ctl.arbiter.dirty = True
        ctl.admit_soon()  # a queue's room may have changed

    specs: dict[str, Any] = {}  # each Queue's spec as its last event had it
    # PriorityClasses: an App's priority inside its queue is its class's value. Kept the same way (an index
    # for the first listing, events for deletions), so the first round knows every class.
    classes: dict[str, int] = {}
    ctl.priority_classes = classes

    @kopf.index("scheduling.k8s.io", "v1", "priorityclasses", id="priority_book", registry=registry)
    async def priority_book(body: kopf.Body, name: str, **_: Any) -> None:
        value = body.get("value")
        if isinstance(value, int):
            classes[name] = value

    @kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses", id="priority_event", registry=registry)
    async def priority_event(type: str | None, name: str, **_: Any) -> None:
        if type == "DELETED":
            classes.pop(name, None)
        dirty()

    @kopf.index(G, V, contract.PLURAL_QUEUE, id="queue_book", registry=registry)
    async def queue_book(body: kopf.Body, name: str, **_: Any) -> None:
        try:
            spec = parse_queue(dict(body)).spec
        except ManifestError as err:  # the CRD's schema normally refuses these first
            log.warning("Queue %s ignored: %s", name, err)
            return
        ctl.queues.set_queue(name, spec, body.metadata.uid or "")

    @kopf.on.event(G, V, contract.PLURAL_QUEUE, id="queue_event", registry=registry)
    async def queue_event(type: str | None, name: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            moved = ctl.queues.remove_queue(name, ctl.metrics)
            if moved:
                log.info("Queue %s deleted: namespaces %s now belong to default", name, ", ".join(moved))
        spec = None if type == "DELETED" else dict(body.get("spec") or {})
        new = specs.get(name) != spec
        if spec is None:
            specs.pop(name, None)
        else:
            specs[name] = spec
        dirty()
        # A Queue created, changed or deleted: a round now. Rounds write the Queues' status (Valid among
        # it) and the objects' timers drive them, so with no App, TrialGroup or ModelDeployment a new or
        # broken Queue got no status. Not for the status writes' own events: those would drive rounds.
        if new and ctl.arbiter is not None and ctl.queues.active:
            await ctl.arbiter.maybe_run()

    if not ctl.config.watch_namespaces:
        return

    @kopf.index("", "v1", "namespaces", id="namespace_book", registry=registry)
    async def namespace_book(body: kopf.Body, name: str, **_: Any) -> None:
        ctl.queues.set_namespace(name, dict(body.metadata.labels or {}))

    @kopf.on.event("", "v1", "namespaces", id="namespace_event", registry=registry)
    async def namespace_event(type: str | None, name: str, **_: Any) -> None:
        if type == "DELETED":
            ctl.queues.remove_namespace(name)
        dirty()


async def reconcile_app(ctl: Controller, raw: dict[str, Any], patch: kopf.Patch) -> None:
    """Parse the App, admit it once, and hand it to the arbiter (which writes its status from then on)."""
    arbiter = ctl.need(ctl.arbiter)
    now = ctl.config.clock()
    rec = _parse_app(ctl, raw, patch, now)
    _admit(ctl, arbiter, rec, raw, patch)
    await arbiter.load_ledger()  # before the first App is tracked: its leases may run later than status
    # An admitted App's conditions (Admitted, Ready) and observedGeneration are written by the arbiter
    # with its status, so one writer owns the list.
    async with arbiter.lock:
        new = arbiter.upsert(rec)
        if not new:  # a spec change: the status says which generation it reflects without a round
            rec_now = arbiter.records[rec.key]
            await arbiter.write_status(rec_now, max(now, arbiter.last_round), heartbeat=False)
    if new:
        lease = f"{ctl.config.lease_s:g}s"
        ctl.post_event(raw, "Normal", "Admitted", f"demand {rec.demand()} GPUs; leases of {lease}")
    await arbiter.maybe_run(now)


def _parse_app(ctl: Controller, raw: dict[str, Any], patch: kopf.Patch, now: float) -> AppRecord:
    """The App's record; an invalid spec is reported (Valid and Ready False, an event) and ends the
    handler for good: only a new spec can fix it, and that runs the update handler."""
    gen = generation_of(raw)
    stored = (raw.get("status") or {}).get("conditions") or []
    try:
        rec = record_from_body(raw, now)
    except ManifestError as err:
        bad: ManifestError | list[tuple[str, str]] = err
    else:
        bad = template_errors(raw["spec"].get("template"), "spec.template")
        for j in rec.spec.jobs:
            if not template_of(rec, j.name):
                bad.append((f"spec.jobs[{j.name}].template", "a pod template is required"))
        if not bad:
            return rec
    status, msg = invalid_status(bad, generation=gen, previous=stored)
    patch.status.update(status)
    ctl.post_event(raw, "Warning", "InvalidSpec", msg)
    raise kopf.PermanentError(msg)


def _admit(ctl: Controller, arbiter: Arbiter, rec: AppRecord, raw: dict[str, Any], patch: kopf.Patch) -> None:
    """Admission (Themis footnote 2) is decided once: an App admitted before (by this operator before a
    restart, or by the peer it took over from) keeps bidding, whatever the order in which Apps load now.
    A refused App is retried a lease period later (Apps may have finished by then)."""
    stored = (raw.get("status") or {}).get("conditions") or []
    admitted = find(stored, "Admitted")
    if rec.key in arbiter.records or (admitted is not None and admitted.get("status") == "True"):
        return
    total = len(ctl.view.cluster())
    threshold = ctl.config.admission_threshold
    if not total or admit(rec.demand(), arbiter.outstanding(), total, threshold):
        return
    gen = generation_of(raw)
    msg = f"{rec.demand()} GPUs would take outstanding demand past the admission threshold"
    refused = condition("Admitted", False, "OverThreshold", msg, generation=gen)
    patch.status["conditions"] = with_ready([refused], Readiness(False, "NotAdmitted", msg), gen, stored)
    if gen is not None:
        patch.status["observedGeneration"] = gen
    ctl.post_event(raw, "Warning", "NotAdmitted", msg)
    raise kopf.TemporaryError(msg, delay=max(1.0, ctl.config.lease_s))


def _kind_handlers(
    registry: kopf.OperatorRegistry,
    ctl: Controller,
    plural: str,
    prefix: str,
    reconciler: Callable[[], KindReconciler[Any] | None],
    update_field: str | None = None,
) -> None:
    """TrialGroups and ModelDeployments: a pass on create, resume, update (of `update_field`, else any)
    and on a timer (kopf pauses it on a passive peer); delete cleans up and frees GPUs for Apps."""

    @kopf.on.resume(G, V, plural, id=f"{prefix}_reconcile", registry=registry)
    @kopf.on.create(G, V, plural, id=f"{prefix}_reconcile", registry=registry)
    @kopf.on.update(G, V, plural, id=f"{prefix}_reconcile", field=update_field, registry=registry)
    async def reconcile(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        refused = await ctl.need(reconciler()).reconcile(dict(body), patch)
        if refused is not None:  # reported in status and an event; only a new spec can fix it
            raise kopf.PermanentError(refused)

    @kopf.timer(G, V, plural, id=f"{prefix}_tick", interval=ctl.config.tick, registry=registry)
    async def tick(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        # Pods end, GPUs free up, gateways report: the timer folds that in (a refused object stays refused).
        rec = reconciler()
        if ctl.stopping:
            return
        if rec is not None and not body.metadata.get("deletionTimestamp"):
            await rec.reconcile(dict(body), patch)
        # Under team queues what these objects hold and wait for takes part in the division, so their
        # timers drive the arbiter's rounds too (with no App, nothing else would), and the Queues' status.
        if ctl.arbiter is not None and ctl.queues.active:
            await ctl.arbiter.maybe_run()
            await ctl.arbiter.refresh_queues()

    @kopf.on.delete(G, V, plural, id=f"{prefix}_delete", registry=registry)
    async def delete(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> None:
        rec = ctl.need(reconciler())
        await rec.delete(namespaced(namespace), name, dict(body))
        rec.discard(str(body.metadata.uid))
        if ctl.arbiter is not None:
            ctl.arbiter.dirty = True  # the object's GPUs are free for Apps again
        await ctl.round_after_delete()
        ctl.admit_soon()


def namespaced(namespace: str | None) -> str:
    """kopf types `namespace` optional for every kind; Tessera's three kinds are namespaced."""
    if namespace is None:
        raise kopf.PermanentError("a Tessera object without a namespace")
    return namespace
