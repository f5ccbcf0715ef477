"""Reconcile ModelDeployments: replica count, worker pods on lanes, the gateway, status and events.

Runs in kopf handlers of the ModelDeployment (create/resume/update and a timer, paused on a passive
peer). A pass: parse; decide replicas (tessera.controller.serving.desired_replicas, Symphony's rule);
keep the GPUs of replicas that stay, take free GPUs for new ones, release the last ones on scale-down;
make worker pods match (one gang per replica), apply the gateway objects; write status when it changed.
Once the gateway is applied, its counters are read (controller/serving_stats.py, rate-limited) and the
window's goodput, attainment and idleness go to status, where the next pass's replica decision reads them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import kopf

from tessera.api import contract
from tessera.cluster import Cluster
from tessera.controller.conditions import Cond, Readiness, carry, condition, find, invalid_status
from tessera.controller.context import Context
from tessera.controller.kube import CONFIGMAPS, DEPLOYMENTS, PODS, SERVICES, Kind
from tessera.controller.pods import Owner, PodPlan
from tessera.controller.pools import (
    DRAINING,
    ENV_GROUP,
    POOL_LABEL,
    POOL_SUFFIX,
    PoolConfigOwner,
    PoolPlan,
    PoolState,
    drained_groups,
    member_of,
    owner_references,
    plan_pool,
    pool_gateway_url,
    replan_reason,
)
from tessera.controller.queue_status import NO_FREE_GPUS, NO_GPU_OF_TYPE, QUEUE_ROOM
from tessera.controller.queues import owner_id
from tessera.controller.readiness import deployment_readiness
from tessera.controller.reconciler import KindReconciler
from tessera.controller.serving import (
    GATEWAY_SUFFIX,
    WORKERS_SUFFIX,
    ScaleDecision,
    ServingRecord,
    ServingSpecError,
    desired_replicas,
    gateway_service_url,
    observed_load,
    record_from_body,
    spec_status,
)
from tessera.controller.serving_stats import StatsReader
from tessera.controller.sync import SyncResult
from tessera.controller.view import PodInfo
from tessera.policy.queues.reclaim import Reclaim

log = logging.getLogger(__name__)

KINDS: dict[str, Kind] = {"configmaps": CONFIGMAPS, "deployments": DEPLOYMENTS, "services": SERVICES}
STATS_FIELDS = ("goodputRps", "sloAttainmentPercent", "gpuIdlePercent", "statsWindowSeconds", "statsRequests")
GATEWAY_STATS = "GatewayStats"  # condition: whether the gateway's counters could be read


class ModelDeployments(KindReconciler[ServingRecord]):
    kind = contract.KIND_MODELDEPLOYMENT

    def __init__(self, ctx: Context, held_elsewhere: Callable[[], set[str]]) -> None:
        super().__init__(ctx, held_elsewhere)
        # Under team queues: GPUs a deployment of a namespace may add (its queue's share less what the
        # queue holds); None without queues. Set by the Controller.
        self.queue_room: Callable[[str, int], float | None] = lambda namespace, want: None
        # Called when what a deployment waits for within its queue's share changes (the arbiter re-divides).
        self.waiting_changed: Callable[[], None] = lambda: None
        # Called when what a deployment holds or waits for changed: its Queue's status is refreshed.
        self.queue_changed: Callable[[], None] = lambda: None
        # What the arbiter's last round asks a deployment to give back to another queue (by owner id),
        # and the Controller's hook once it has (set by the Controller).
        self.reclaim_request: Callable[[str], Reclaim | None] = lambda owner: None
        self.gave_back: Callable[[str, Reclaim, int], None] = lambda owner, request, gpus: None
        config = ctx.config
        self._applied: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._wanted: dict[tuple[str, str], int] = {}  # replicas the last pass decided on
        self.stats = StatsReader(config.serving_stats_interval_s, self._gateway_url)
        self._stats_cond: dict[tuple[str, str], Cond] = {}  # the GatewayStats condition last decided
        self.pools: dict[tuple[str, str], PoolState] = {}  # (namespace, pool) → plan and placed groups
        self._pool_applied: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._pool_config_uid: dict[tuple[str, str], str] = {}  # pool → its ConfigMap's uid (owns workers)

    def _gateway_url(self, namespace: str, name: str) -> str:
        """Where ModelDeployment `name`'s gateway counters are read: a pool member's at its pool's gateway
        (one for the pool, under the member's model name), any other's at its own."""
        rec = self.records.get((namespace, name))
        if rec is not None and (pool := rec.spec.placement.pool):
            return self._pool_gateway_url(namespace, pool)
        return (self.config.gateway_url or gateway_service_url)(namespace, name)

    def _pool_gateway_url(self, namespace: str, pool: str) -> str:
        if self.config.gateway_url:
            return self.config.gateway_url(namespace, pool + POOL_SUFFIX)
        return pool_gateway_url(namespace, pool)

    def reserved(self) -> set[str]:
        own = {g for r in self.records.values() if not r.spec.placement.pool for g in r.held()}
        return own | {g for p in self.pools.values() for g in p.held()}

    def readiness(self, rec: ServingRecord) -> Readiness | None:
        wanted = self._wanted.get(rec.key)
        if wanted is None or (rec.gpus and rec.key not in self._applied):
            return None  # the pass stopped before deciding replicas or applying the gateway
        missing = self.missing_pods(rec, contract.LABEL_MODELDEPLOYMENT, rec.pod_plans())
        return deployment_readiness(rec, wanted, missing)

    async def _reconcile(self, body: dict[str, Any], patch: kopf.Patch) -> None:
        """A pass: the record; a pool member's pass, or the deployment's own: replicas decided from the
        load and placed, worker pods and the gateway made to match, status and replica gauges written."""
        rec = self._record(body, patch)
        if rec is None:
            return
        cluster = self.view.cluster()
        if not len(cluster):
            return
        status_in = body.get("status") or {}
        if rec.spec.placement.pool:
            await self._reconcile_pool_member(rec, cluster, body, patch, status_in)
            return
        measured = await self._read_stats(rec, status_in)
        decision = desired_replicas(rec.spec, {**status_in, **measured}, len(rec.gpus))
        self._wanted[rec.key] = decision.replicas
        self._scale(rec, cluster, decision)
        owner = self.owner(rec)
        await self._sync_workers(rec, owner)
        # The gateway routes to workers: it is configured once a replica is placed. Without one the
        # deployment waits for GPUs; its config (which wants a worker) is not a spec error.
        if rec.gpus and not await self._apply_gateway(rec, owner, body, patch):
            return
        scaled = condition(
            "Scaled",
            len(rec.gpus) == decision.replicas,
            "LoadProportional",
            f"{decision.replicas} replicas for {decision.load_rps:g} rps: {decision.reason}",
        )
        self._write_status(rec, patch, status_in, _deployment_status(rec, decision, measured), [scaled])
        self._export_replicas(rec, decision.replicas)

    def _record(self, body: dict[str, Any], patch: kopf.Patch) -> ServingRecord | None:
        """The object's record with this body's spec (None: invalid, and reported). A name reused by a
        new object starts from nothing, its gateway's counters included."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        fresh = self._parse(body, patch, record_from_body)
        if fresh is None:
            return None
        rec = self.records.get(key)
        if rec is None or rec.uid != fresh.uid:
            if rec is not None:  # the name was reused by a new object: its gateway starts from nothing
                self.stats.forget(key)
                self._stats_cond.pop(key, None)
            rec = self.records[key] = fresh
            rec.since = self.config.clock()  # recovered replicas' minimum runtime counts from now
        else:
            rec.spec, rec.body = fresh.spec, body
        return rec

    def _scale(self, rec: ServingRecord, cluster: Cluster, decision: ScaleDecision) -> None:
        """Replicas to the decided count: the first ones keep their GPUs, the last go on scale-down, new
        ones take free GPUs; an event when the count moved (saying why fewer were placed)."""
        was = (len(rec.gpus), rec.wants, rec.wait_reason)
        self._give_back(rec)
        before, waited = len(rec.gpus), rec.waiting_gpus
        rec.waiting_gpus, rec.wants, rec.wait_reason, rec.wait_message = 0, 0, "", ""
        if decision.replicas < before:
            rec.gpus = rec.gpus[: decision.replicas]
        elif decision.replicas > before:
            self._place_replicas(rec, cluster, decision.replicas)
        if rec.waiting_gpus != waited:
            self.waiting_changed()
        if not rec.wants:
            rec.waiting_since = None
        elif rec.waiting_since is None:
            rec.waiting_since = self.config.clock()
        if (len(rec.gpus), rec.wants, rec.wait_reason) != was:
            self.queue_changed()
        if len(rec.gpus) == before:
            return
        short = (
            ""
            if len(rec.gpus) == decision.replicas
            else f" (only {len(rec.gpus)} placed: no free GPUs"
            + (f" of {', '.join(rec.spec.placement.gpu_types)})" if rec.spec.placement.gpu_types else ")")
        )
        self._event(rec, "Normal", "Scaled", f"{before} → {len(rec.gpus)} replicas: {decision.reason}{short}")

    def _give_back(self, rec: ServingRecord) -> None:
        """Replicas whose GPUs another queue is owed go, the last placed first. Replicas hold no lease and
        no state to checkpoint: either reclaim mode takes them at the deployment's next pass."""
        request = self.reclaim_request(owner_id(self.kind, rec.namespace, rec.name))
        if request is None or not rec.gpus:
            return
        per = rec.spec.gpus_per_replica
        n = min(len(rec.gpus), math.ceil(request.gpus / per - 1e-9))
        rec.gpus, given = rec.gpus[: len(rec.gpus) - n], rec.gpus[len(rec.gpus) - n :]
        gpus = [g for r in given for g in r]
        msg = f"{n} replica(s) ({', '.join(gpus)}) given back to queue {request.for_queue}: {request.reason}"
        self._event(rec, "Warning", "Reclaimed", msg)
        self.gave_back(owner_id(self.kind, rec.namespace, rec.name), request, len(gpus))

    def _place_replicas(self, rec: ServingRecord, cluster: Cluster, replicas: int) -> None:
        """New replicas on healthy GPUs nobody holds (of placement.gpuTypes if given), all of a replica's
        GPUs on one node, while the free GPUs last."""
        taken = self.reserved() | self.held_elsewhere() | self.view.used_by_pods()
        per = rec.spec.gpus_per_replica
        room = self.queue_room(rec.namespace, (replicas - len(rec.gpus)) * per)
        wanted = replicas
        if room is not None:  # team queues: new replicas only within the queue's share
            replicas = min(replicas, len(rec.gpus) + int(room + 1e-9) // per)
        models = set(rec.spec.placement.gpu_types)  # empty: any GPU model
        by_node: dict[str, list[str]] = {}
        for g in cluster.gpus:
            if g.healthy and g.id not in taken and (not models or g.model in models):
                by_node.setdefault(g.id.rpartition("/")[0], []).append(g.id)
        # Spread replicas over nodes (one failure domain per replica where possible): the node with the
        # fewest of this deployment's replicas, then by name. Counted once, not per node and replica
        # (that was a quarter of the operator's time with 5,000 nodes).
        on_node: dict[str, int] = {}
        for r in rec.gpus:
            if r:
                node = r[0].rpartition("/")[0]
                on_node[node] = on_node.get(node, 0) + 1
        while len(rec.gpus) < replicas:
            best = min(
                (n for n, gs in by_node.items() if len(gs) >= per),
                key=lambda n: (on_node.get(n, 0), n),
                default=None,
            )
            if best is None:
                break
            rec.gpus.append(by_node[best][:per])
            by_node[best] = by_node[best][per:]
            on_node[best] = on_node.get(best, 0) + 1
            rec.since = self.config.clock()
        if room is not None and not models:
            # Replicas within the queue's share that found no free GPU: other queues owe them. (With
            # gpuTypes, GPUs given back might be of another model and would sit idle: not counted.)
            rec.waiting_gpus = (replicas - len(rec.gpus)) * per
        rec.wants = (wanted - len(rec.gpus)) * per
        if len(rec.gpus) < replicas:  # some within the queue's share found no free GPU
            rec.wait_reason, rec.wait_message = (
                (NO_GPU_OF_TYPE, f"no free GPU of {', '.join(sorted(models))}")
                if models
                else (NO_FREE_GPUS, "no free GPUs")
            )
        elif rec.wants:
            rec.wait_reason = QUEUE_ROOM
            rec.wait_message = (
                f"{rec.wants} GPU(s) wanted for more replicas, {room or 0:g} within its queue's share"
            )

    async def _apply_gateway(
        self, rec: ServingRecord, owner: Owner, body: dict[str, Any], patch: kopf.Patch
    ) -> bool:
        """The gateway's objects applied when they changed; False after reporting a spec the gateway's
        config cannot be made from."""
        try:
            objects = rec.gateway_objects(owner, self.config.gateway_image)
        except ValueError as err:
            self._invalid(body, patch, invalid_status([("spec", f"gateway config: {err}")]))
            return False
        if self._applied.get(rec.key) != [o for _, o in objects]:
            for plural, obj in objects:
                await self._apply(KINDS[plural], rec.namespace, obj)
            self._applied[rec.key] = [o for _, o in objects]
        return True

    def _write_status(
        self,
        rec: ServingRecord,
        patch: kopf.Patch,
        status_in: dict[str, Any],
        status: dict[str, Any],
        own: list[Cond],
    ) -> None:
        """Patch `status` and the pass's conditions (`own`, then GatewayStats) when any of them says
        something other than what is stored (a repeated pass writes nothing)."""
        stored = list(status_in.get("conditions") or [])
        conditions = carry([*own, *([c] if (c := self._stats_cond.get(rec.key)) else [])], stored)
        if any(status_in.get(k) != v for k, v in status.items()) or any(
            _differs(c, find(stored, c["type"])) for c in conditions
        ):
            patch.status.update(status)
            patch.status["conditions"] = conditions

    def _export_replicas(self, rec: ServingRecord, desired: int) -> None:
        """tessera_serving_replicas: those decided, and those whose worker pod runs."""
        gauge = self.metrics.gauge("tessera_serving_replicas")
        gauge.labels(namespace=rec.namespace, modeldeployment=rec.name, state="desired").set(desired)
        ready = sum(
            1
            for p in self.view.pods_with(contract.LABEL_MODELDEPLOYMENT, rec.name, rec.namespace)
            if p.phase == "Running" and p.labels.get(contract.LABEL_ROLE) == "worker"
        )
        gauge.labels(namespace=rec.namespace, modeldeployment=rec.name, state="ready").set(ready)

    async def _reconcile_pool_member(
        self,
        rec: ServingRecord,
        cluster: Cluster,
        body: dict[str, Any],
        patch: kopf.Patch,
        status_in: dict[str, Any],
    ) -> None:
        """A pool member's pass: (re-)plan the pool when its inputs moved past the hysteresis, place its
        groups, keep one worker per group and the pool gateway, and write this member's share of the
        plan to status. The pool's objects are owned by every member."""
        pool = rec.spec.placement.pool
        assert pool is not None
        members = self._pool_members(rec.namespace, pool)
        state = self.pools.get((rec.namespace, pool))
        # The observed load feeds the plan: each member's last window at the pool gateway (this one's read
        # now), through the same hysteresis as a change of expectedRps.
        measured = await self._read_stats(rec, status_in)
        if "gpuIdlePercent" in measured:  # the pool gateway does not count worker busy time
            measured["gpuIdlePercent"] = None
        observed = {
            r.name: observed_load({**status_in, **measured} if r is rec else (r.body.get("status") or {}))
            for r in members
        }
        try:
            new = await _new_pool_plan(state, pool, members, observed, devices_per_node(cluster))
        except ServingSpecError as err:
            self._invalid(body, patch, invalid_status([("spec", f"pool {pool}: {err}")]))
            return
        now = time.monotonic()
        if new is not None:
            state = self._adopt_pool_plan(rec, state, members, *new, now)
        assert state is not None
        await self._switch_groups(rec, state, cluster, now)
        # The member whose name labels the workers and whose template they run: the same while it lives.
        owner_rec = self.records.get((rec.namespace, state.owner)) or members[0]
        state.owner = owner_rec.name
        labels = {contract.LABEL_MODELDEPLOYMENT: owner_rec.name, contract.LABEL_ROLE: "worker"}
        plans = state.pod_plans(labels, contract.WORKLOAD_SERVING)
        if plans:
            await self._apply_pool_gateway(rec, state, members, labels)
        await self._sync_pool_workers(rec, state, owner_rec, plans)
        status = self._member_status(rec, state, measured, observed[rec.name])
        self._write_status(rec, patch, status_in, status, [])

    def _pool_members(self, namespace: str, pool: str) -> list[ServingRecord]:
        """The deployments naming `pool`, by name (the first is the pool's first owner)."""
        return sorted(
            (r for r in self.records.values() if r.namespace == namespace and r.spec.placement.pool == pool),
            key=lambda r: r.name,
        )

    def _adopt_pool_plan(
        self,
        rec: ServingRecord,
        state: PoolState | None,
        members: list[ServingRecord],
        why: str,
        plan: PoolPlan,
        now: float,
    ) -> PoolState:
        """The pool's state with `plan` as its target (a first plan makes the state), and an event."""
        if state is None:
            state = self.pools[(rec.namespace, plan.pool)] = PoolState.first(
                rec.namespace, plan, members[0].name, why
            )
        else:
            state.replace(plan, now, why)
        self._event(
            rec, "Normal", "PoolPlanned",
            f"pool {plan.pool} ({why}): {len(plan.groups)} groups, predicted attainment "
            f"{100 * plan.attainment:.1f}%, search {plan.search_seconds:.2f}s",
        )  # fmt: skip
        return state

    async def _switch_groups(
        self, rec: ServingRecord, state: PoolState, cluster: Cluster, now: float
    ) -> None:
        """One step of the switch between plans (bring up new groups on free GPUs, switch routing, drain
        old ones), one step per pass; an event naming each group whose state moved."""
        taken = self.reserved() | self.held_elsewhere() | self.view.used_by_pods(exclude_label=POOL_LABEL)
        by_node: dict[str, list[str]] = {}
        for g in cluster.gpus:
            if g.healthy and g.id not in taken:
                by_node.setdefault(g.node, []).append(g.id)
        draining = any(e.state == DRAINING for e in state.groups.values())
        drained = await self._drained_groups(state) if draining else set()
        before = {gid: e.state for gid, e in state.groups.items()}
        state.step(by_node, self._running_groups(state, rec.namespace), drained, now)
        after = {gid: e.state for gid, e in state.groups.items()}
        if before != after:
            moved = sorted(g for g in {*before, *after} if before.get(g) != after.get(g))
            changes = ", ".join(f"{g} {before.get(g, 'new')} → {after.get(g, 'gone')}" for g in moved)
            self._event(rec, "Normal", "PoolSwitch", f"pool {state.name}: {changes}")

    async def _apply_pool_gateway(
        self, rec: ServingRecord, state: PoolState, members: list[ServingRecord], labels: dict[str, str]
    ) -> None:
        """The pool gateway's objects applied when they changed, or while its ConfigMap's uid (the
        workers' owner) is not known."""
        key = (state.namespace, state.name)
        # Every member owns the pool's gateway objects, and its ConfigMap owns the workers: deleting one
        # member (even the first) leaves them running; the garbage collector takes them with the last.
        refs = owner_references([self.owner(r) for r in members])
        objects = state.gateway_objects(refs, self.config.gateway_image, labels, contract.WORKLOAD_SERVING)
        if self._pool_applied.get(key) != [o for _, o in objects] or key not in self._pool_config_uid:
            for plural, obj in objects:
                got = await self._apply(KINDS[plural], rec.namespace, obj)
                if plural == "configmaps" and (uid := (got.get("metadata") or {}).get("uid")):
                    self._pool_config_uid[key] = str(uid)
            self._pool_applied[key] = [o for _, o in objects]
        self._applied[rec.key] = []

    async def _sync_pool_workers(
        self, rec: ServingRecord, state: PoolState, owner_rec: ServingRecord, plans: list[PodPlan]
    ) -> None:
        """One worker per placed group, from the owner member's template, owned by the pool's ConfigMap
        (by the owner member while there is no group to start and the ConfigMap is not known)."""
        cm_uid = self._pool_config_uid.get((state.namespace, state.name))
        if plans and cm_uid is None:  # the owner of new workers is not known yet: the next pass
            log.warning("pool %s/%s: its ConfigMap has no uid yet; workers wait", rec.namespace, state.name)
            return
        pod_owner = (
            PoolConfigOwner("ConfigMap", state.name + POOL_SUFFIX, rec.namespace, cm_uid)
            if cm_uid
            else self.owner(owner_rec)
        )
        template = dict((owner_rec.body.get("spec") or {}).get("template") or {})
        existing = self._pool_workers(state)
        result = await self._sync_worker_pods(pod_owner, plans, existing, template, state.workers_service)
        if result.created:
            self._event(rec, "Normal", "WorkersCreated", ", ".join(result.created))

    def _member_status(
        self, rec: ServingRecord, state: PoolState, measured: dict[str, Any], load: float | None
    ) -> dict[str, Any]:
        """This member's share of the plan taken (its placed groups as its replicas, the groups it is
        planned on as wanted, its predicted attainment as a gauge) and its status."""
        pool, model = state.name, rec.spec.model.name
        mine = [g for g in state.plan.groups_of(model) if g.id in state.placed]
        rec.gpus = [state.placed[g.id] for g in mine]
        self._wanted[rec.key] = len(state.plan.groups_of(model))
        pred = state.plan.predicted.get(model)
        if pred is not None:
            self.metrics.gauge("tessera_serving_predicted_slo_attainment_ratio").labels(
                namespace=rec.namespace, modeldeployment=rec.name, pool=pool
            ).set(pred)
        status: dict[str, Any] = {
            "phase": "Serving" if mine else "Placing",
            "replicas": len(mine),
            "gpusAssigned": sum(len(g) for g in rec.gpus),
            "groups": [",".join(g) for g in rec.gpus],
            "pool": pool,
            "poolGroups": [g.id for g in state.plan.groups_of(model)],
            "predictedSLOAttainmentPercent": round(100 * pred, 3) if pred is not None else None,
            "profileSynthetic": state.plan.synthetic,
            "observedLoadRps": round(load, 3) if load is not None else None,
            "poolPlan": state.status_plan(),
        }
        status.update(spec_status(rec.spec))
        status.update(measured)
        return status

    def _pool_workers(self, state: PoolState) -> list[PodInfo]:
        """The pool's worker pods, found by the pool's label (not by a member's: any member may go)."""
        return [
            p
            for p in self.view.pods_with(POOL_LABEL, state.name, state.namespace)
            if p.labels.get(contract.LABEL_ROLE) == "worker"
        ]

    def _running_groups(self, state: PoolState, namespace: str) -> set[str]:
        """Groups whose worker pod runs (its phase as the kubelet reports it)."""
        plans = {p.name: p.env[ENV_GROUP] for p in state.pod_plans({}, contract.WORKLOAD_SERVING)}
        return {plans[p.name] for p in self._pool_workers(state) if p.phase == "Running" and p.name in plans}

    async def _drained_groups(self, state: PoolState) -> set[str]:
        """Draining groups the pool gateway no longer routes to and has nothing in flight on (its /stats);
        empty when it cannot be read (the drain timeout then decides)."""
        url = self._pool_gateway_url(state.namespace, state.name)
        return await drained_groups(url, {gid for gid, e in state.groups.items() if e.state == DRAINING})

    async def _read_stats(self, rec: ServingRecord, status_in: dict[str, Any]) -> dict[str, Any]:
        """Status fields from the gateway's counters when a read is due (else {}): the window's figures;
        None for each (removed) when the gateway cannot be read, so replicas fall back to
        spec.traffic.expectedRps. The GatewayStats condition and, on a change to unreadable, an event."""
        if not rec.gpus or rec.key not in self._applied or not self.config.serving_stats_interval_s:
            return {}  # no gateway yet, or reading it is off
        poll = await self.stats.poll(rec.key, rec.spec.model.name)
        if poll is None:
            return {}
        before = self._stats_cond.get(rec.key) or find(status_in.get("conditions"), GATEWAY_STATS)
        if poll.error is not None:
            self._stats_cond[rec.key] = condition(GATEWAY_STATS, False, "Unreachable", poll.error)
            if before is None or before.get("status") != "False":
                self._event(rec, "Warning", "GatewayStatsUnavailable", poll.error)
            return dict.fromkeys(STATS_FIELDS)
        w = poll.stats
        if w is None:  # a first read of this gateway: the baseline the next window starts from
            if before is None or before.get("status") != "True":
                self._stats_cond[rec.key] = condition(
                    GATEWAY_STATS, False, "Baseline", "first read of the gateway's counters; rates follow"
                )
            return {}
        att = f"{w.attainment_percent:.1f}% within SLO" if w.attainment_percent is not None else "no requests"
        self._stats_cond[rec.key] = condition(
            GATEWAY_STATS, True, "Measured", f"{w.requests} requests in {w.seconds:.1f}s: {att}"
        )
        return w.status()

    async def _apply(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create, or merge-patch what is there (a repeated reconcile is a no-op patch); the object stored."""
        created = await self.api.create(kind, namespace, obj)
        if (
            created is obj
        ):  # 409: it exists; bring it to the manifest (and its owners: a pool's members change)
            body = {k: obj[k] for k in obj if k in ("spec", "data")}
            if "ownerReferences" in obj["metadata"]:
                body["metadata"] = {"ownerReferences": obj["metadata"]["ownerReferences"]}
            return await self.api.patch(kind, namespace, obj["metadata"]["name"], body)
        return created

    async def _sync_workers(self, rec: ServingRecord, owner: Owner) -> None:
        existing = [
            p
            for p in self.view.pods_with(contract.LABEL_MODELDEPLOYMENT, rec.name, rec.namespace)
            if p.labels.get(contract.LABEL_ROLE) == "worker"
        ]
        template = dict((rec.body.get("spec") or {}).get("template") or {})
        result = await self._sync_worker_pods(owner, rec.pod_plans(), existing, template, rec.workers_service)
        self._report_sync(
            rec,
            result,
            created="WorkersCreated",
            deleted="WorkersDeleted",
            failed="replica {gang}: no pod created: {why}",
        )

    async def _sync_worker_pods(
        self,
        owner: Owner,
        plans: list[PodPlan],
        existing: list[PodInfo],
        template: dict[str, Any],
        subdomain: str,
    ) -> SyncResult:
        """Worker pods to match `plans`, a gang per replica (or pool group), each pod named in cluster DNS
        by its hostname under the headless Service `subdomain`."""

        def with_dns(p: PodPlan) -> dict[str, Any]:
            t = dict(template)
            t["spec"] = {**dict(t.get("spec") or {}), "hostname": p.name, "subdomain": subdomain}
            return t

        return await self.ctx.sync_pods(
            owner,
            plans,
            existing,
            gang_of=lambda p: p.env[contract.ENV_REPLICA],
            template_of=with_dns,
            workload_class=contract.CLASS_LATENCY_CRITICAL,
            recent=self.recent,
        )

    async def delete(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        async with self.lock:
            self.records.pop((namespace, name), None)
            self._applied.pop((namespace, name), None)
            self._wanted.pop((namespace, name), None)
            self._stats_cond.pop((namespace, name), None)
            self.stats.forget((namespace, name))
            self.metrics.remove_series(namespace=namespace, modeldeployment=name)
            live_pools = {r.spec.placement.pool for r in self.records.values() if r.namespace == namespace}
            gone: list[PoolState] = []
            for key in list(self.pools):
                if key[0] == namespace and key[1] not in live_pools:
                    gone.append(self.pools.pop(key))  # no member left: the pool goes
                    self._pool_applied.pop(key, None)
                    self._pool_config_uid.pop(key, None)
        # A pool's workers stay while any member lives (every member owns them); the last member takes them.
        pods = [
            p
            for p in self.view.pods_with(contract.LABEL_MODELDEPLOYMENT, name, namespace)
            if p.labels.get(POOL_LABEL) is None
        ]
        for state in gone:
            pods += [p for p in self._pool_workers(state) if p.name not in {q.name for q in pods}]
            pool_gw = state.name + POOL_SUFFIX
            for kind, obj in (
                (DEPLOYMENTS, pool_gw),
                (SERVICES, pool_gw),
                (CONFIGMAPS, pool_gw),
                (SERVICES, state.workers_service),
            ):
                await self.api.delete(kind, namespace, obj)
        for pod in pods:
            await self.api.delete(PODS, namespace, pod.name, grace_seconds=self.config.preemption_grace_s)
        gw = name + GATEWAY_SUFFIX
        for kind, obj in (
            (DEPLOYMENTS, gw),
            (SERVICES, gw),
            (CONFIGMAPS, gw),
            (SERVICES, name + WORKERS_SUFFIX),
        ):
            await self.api.delete(kind, namespace, obj)
        self.post_event(body, "Normal", "Cleanup", f"deleted {len(pods)} worker pod(s) and the gateway")


def devices_per_node(cluster: Cluster) -> int:
    """The most healthy GPUs one node has (1 with none): a pool's widest group."""
    per_node: dict[str, int] = {}
    for g in cluster.gpus:
        if g.healthy:
            per_node[g.node] = per_node.get(g.node, 0) + 1
    return max(per_node.values(), default=1)


async def _new_pool_plan(
    state: PoolState | None,
    pool: str,
    members: list[ServingRecord],
    observed: dict[str, float | None],
    dpn: int,
) -> tuple[str, PoolPlan] | None:
    """Why the pool needs a new plan and that plan (searched off the event loop), or None while its
    inputs stay within the hysteresis; ServingSpecError when a member's spec cannot be planned."""
    inputs = [member_of(r, observed[r.name]) for r in members]
    why = replan_reason(state.plan if state else None, inputs, dpn)
    if why is None:
        return None
    return why, await asyncio.to_thread(plan_pool, pool, inputs, dpn)


def _deployment_status(
    rec: ServingRecord, decision: ScaleDecision, measured: dict[str, Any]
) -> dict[str, Any]:
    """A deployment's status after a pass: its replicas and their GPUs, what the spec resolves to, the
    gateway's last window, and the load the replica count followed when the gateway measured it."""
    status: dict[str, Any] = {
        "phase": "Serving" if rec.gpus else "Placing",
        "replicas": len(rec.gpus),
        "gpusAssigned": sum(len(g) for g in rec.gpus),
        "groups": [",".join(g) for g in rec.gpus],
    }
    status.update(spec_status(rec.spec))
    status.update(measured)
    status["observedLoadRps"] = round(decision.load_rps, 3) if decision.observed else None
    return status


def _differs(new: Cond, old: Any) -> bool:
    """Whether a condition says something other than the one stored (its time aside)."""
    return old is None or any(new.get(k) != old.get(k) for k in ("status", "reason", "message"))
