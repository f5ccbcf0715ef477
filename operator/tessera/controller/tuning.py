"""Reconcile TrialGroups: pool, Fluid plan, trial pods, status, events and metrics.

Runs inside kopf handlers of the TrialGroup (create/resume/update and a short timer), so every write to
the group itself goes through kopf's `patch` and only the active peer acts. One pass: parse, make sure
the group owns its GPU pool, fold trial pods' progress in, re-plan with Fluid when a trial ended (or the
pool changed), make the pods match the plan (gang per trial), then write status only when it changed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from tessera.api import contract
from tessera.cluster import Cluster
from tessera.controller.conditions import Readiness, condition
from tessera.controller.context import Context
from tessera.controller.kube import PODS
from tessera.controller.pods import PodPlan
from tessera.controller.queue_status import NO_FREE_GPUS, QUEUE_ROOM
from tessera.controller.queues import owner_id
from tessera.controller.readiness import trialgroup_readiness
from tessera.controller.reconciler import KindReconciler
from tessera.controller.trialgroups import (
    ENDED,
    TrialGroupRecord,
    choose_pool,
    pool_annotation,
    pool_size_wanted,
    record_from_body,
    recover_placement,
)
from tessera.controller.view import healthy_gpus
from tessera.policy.queues.reclaim import Reclaim

log = logging.getLogger(__name__)

Reserved = Callable[[], set[str]]


def _stamp() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class TrialGroups(KindReconciler[TrialGroupRecord]):
    """Every TrialGroup's record, and the GPUs their pools reserve (kept out of Themis' free set)."""

    kind = contract.KIND_TRIALGROUP

    def __init__(self, ctx: Context, held_elsewhere: Reserved) -> None:
        super().__init__(ctx, held_elsewhere)
        self.replans = 0
        # Under team queues: GPUs a TrialGroup of a namespace may take (its queue's share less what the
        # queue holds); None without queues. Set by the Controller.
        self.queue_room: Callable[[str, int], float | None] = lambda namespace, want: None
        # Called when what a group waits for within its queue's share changes (the arbiter re-divides).
        self.waiting_changed: Callable[[], None] = lambda: None
        # Called when what the group holds or waits for changed: its Queue's status is refreshed.
        self.queue_changed: Callable[[], None] = lambda: None
        # What the arbiter's last round asks a group to give back to another queue (by owner id), and
        # the Controller's hook once it has (set by the Controller).
        self.reclaim_request: Callable[[str], Reclaim | None] = lambda owner: None
        self.gave_back: Callable[[str, Reclaim, int], None] = lambda owner, request, gpus: None

    def reserved(self) -> set[str]:
        return {g for r in self.records.values() if not r.done for g in r.pool}

    def free_gpus(self, cluster: Cluster) -> list[str]:
        taken = self.reserved() | self.held_elsewhere() | self.view.used_by_pods()
        return [g for g in healthy_gpus(cluster) if g not in taken]

    def readiness(self, rec: TrialGroupRecord) -> Readiness:
        missing = self.missing_pods(rec, contract.LABEL_TRIALGROUP, rec.pod_plans())
        return trialgroup_readiness(rec, missing)

    async def forget(self, key: tuple[str, str]) -> None:
        async with self.lock:
            self.records.pop(key, None)
            self.metrics.remove_series(namespace=key[0], trialgroup=key[1])

    async def _reconcile(self, body: dict[str, Any], patch: kopf.Patch) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        fresh = self._parse(body, patch, record_from_body)
        if fresh is None:
            return
        rec = self.records.get(key)
        replan = False
        if rec is None or rec.uid != fresh.uid:
            rec = self.records[key] = fresh
            rec.since = self.config.clock()  # a recovered pool's minimum runtime counts from now
        elif rec.spec != fresh.spec:
            fresh.pool, fresh.placement, fresh.waiting_since = rec.pool, rec.placement, rec.waiting_since
            for name, st in rec.trials.items():
                if name in fresh.trials:
                    fresh.trials[name] = st
            rec = self.records[key] = fresh
            replan = True
        rec.body = body
        cluster = self.view.cluster()
        if not len(cluster):
            return  # the node watch has not listed yet
        if not rec.pool and not await self._acquire(rec, cluster, patch):
            return
        healthy = set(healthy_gpus(cluster))
        if not set(rec.pool) <= healthy:
            lost = sorted(set(rec.pool) - healthy)
            rec.pool = [g for g in rec.pool if g in healthy]
            patch.metadata.setdefault("annotations", {})[contract.ANN_GPU_POOL] = pool_annotation(rec.pool)
            self._event(rec, "Warning", "PoolShrunk", f"GPUs gone or unhealthy: {', '.join(lost)}")
            replan = True
        if rec.placement is None:
            recover_placement(rec, cluster)
        pods = self.view.pods_with(contract.LABEL_TRIALGROUP, rec.name, rec.namespace)
        for trial, phase in rec.observe(pods):
            reason = "TrialCompleted" if phase == "Completed" else "TrialStopped"
            self._event(rec, "Normal", reason, f"trial {trial}: {phase.lower()}; re-planning")
            replan = True
        grace = None
        request = self.reclaim_request(owner_id(self.kind, rec.namespace, rec.name)) if rec.pool else None
        # A pool holds no lease: under `atLeaseEnd` it gives GPUs back at the group's next re-plan (a trial
        # ended), under `immediate` at once, its trials' pods stopped with the lending queue's grace.
        if request is not None and (request.mode == "immediate" or replan):
            self._give_back(rec, request, patch)
            grace = math.ceil(request.grace_s) if request.mode == "immediate" else None
            replan = True
        if (replan or rec.placement is None) and not rec.done and rec.pool:
            try:
                placement = rec.plan(cluster)
            except ValueError as err:
                self._event(rec, "Warning", "PlanFailed", str(err))
                patch.status["conditions"] = [condition("Planned", False, "PlanFailed", str(err))]
                return
            self.replans += 1
            widths = ", ".join(
                f"{t}={float(w):g}" for t, w in sorted(placement.widths.items()) if t not in placement.queued
            )
            queued = f"; queued: {', '.join(placement.queued)}" if placement.queued else ""
            self._event(rec, "Normal", "Planned", f"Fluid {rec.last_rule}: widths {widths}{queued}")
            rec.last_time = _stamp()
        await self._sync(rec, grace)
        status = rec.status(rec.last_time or _stamp())
        status["conditions"] = [condition("Valid", True, "Planned", "Fluid plans this group")]
        # conditions and observedGeneration are the pass's epilogue's (_report_ready): compared here, the
        # stored observedGeneration, absent from `status`, made every pass rewrite an unchanged status.
        epilogue = ("conditions", "observedGeneration")
        old = {k: v for k, v in (body.get("status") or {}).items() if k not in epilogue}
        if {k: v for k, v in status.items() if k not in epilogue} != old:
            patch.status.update(status)
        self._metrics(rec)

    async def _acquire(self, rec: TrialGroupRecord, cluster: Cluster, patch: kopf.Patch) -> bool:
        waited, rec.waiting_gpus = rec.waiting_gpus, 0
        was = (rec.wants, rec.wait_reason)
        free = self.free_gpus(cluster)
        asked = n = pool_size_wanted(rec.spec, len(free))
        room = self.queue_room(rec.namespace, n)
        if room is not None and rec.spec.gpus is None:
            n = min(n, int(room + 1e-9))  # Fluid packs the trials into the queue's share
        why = NO_FREE_GPUS
        if room is not None and n > room + 1e-9:
            msg = f"waiting for room in its queue: {n} GPUs wanted, {room:g} within the queue's share"
            why = QUEUE_ROOM
        elif n < 1 or len(free) < n:
            msg = f"waiting for {max(n, 1)} free GPUs ({len(free)} free)"
            if room is not None and n >= 1:  # within its queue's share: other queues owe it these GPUs
                rec.waiting_gpus = n
            elif room is not None and asked >= 1:  # GPUs are free, but its queue's share has no room
                msg, why = (
                    f"waiting for room in its queue: {asked} GPU(s) free, none within its share",
                    QUEUE_ROOM,
                )
        else:
            msg = ""
        if rec.waiting_gpus != waited:
            self.waiting_changed()
        rec.wants = max(asked, n, 1) if msg else 0
        rec.wait_reason, rec.wait_message = (why, msg) if msg else ("", "")
        if not msg:
            rec.waiting_since = None
        elif rec.waiting_since is None:
            rec.waiting_since = self.config.clock()
        if (rec.wants, rec.wait_reason) != was:
            self.queue_changed()
        if msg:
            conds = (rec.body.get("status") or {}).get("conditions") or []
            if not any(c.get("reason") == "WaitingForGPUs" for c in conds):
                patch.status["phase"] = "Pending"
                patch.status["conditions"] = [condition("GPUsAvailable", False, "WaitingForGPUs", msg)]
                self._event(rec, "Normal", "WaitingForGPUs", msg)
            return False
        rec.pool, rec.since = choose_pool(cluster, free, n), self.config.clock()
        patch.metadata.setdefault("annotations", {})[contract.ANN_GPU_POOL] = pool_annotation(rec.pool)
        self._event(rec, "Normal", "PoolAcquired", f"{n} GPUs: {', '.join(rec.pool)}")
        return True

    def _give_back(self, rec: TrialGroupRecord, request: Reclaim, patch: kopf.Patch) -> None:
        """The last GPUs of the pool go back to the queue owed them; Fluid re-plans on the rest (with
        none left, the group waits for a pool again)."""
        n = min(len(rec.pool), math.ceil(request.gpus - 1e-9))
        given, rec.pool = rec.pool[len(rec.pool) - n :], rec.pool[: len(rec.pool) - n]
        if not rec.pool:
            rec.placement = None
        patch.metadata.setdefault("annotations", {})[contract.ANN_GPU_POOL] = pool_annotation(rec.pool)
        msg = f"{n} GPU(s) of the pool ({', '.join(given)}) given back to queue {request.for_queue}: {request.reason}"
        self._event(rec, "Warning", "Reclaimed", msg)
        self.gave_back(owner_id(self.kind, rec.namespace, rec.name), request, n)
        self.queue_changed()

    async def _sync(self, rec: TrialGroupRecord, grace: int | None = None) -> None:
        ended = {name for name, st in rec.trials.items() if st.phase in ENDED}
        completed = {name for name, st in rec.trials.items() if st.phase == "Completed"}
        # Exited pods of ended trials stay (logs, results), and so do a Completed trial's pods that still
        # run (they reported the whole budget and are exiting); everything else must match the plan.
        existing = [
            p
            for p in self.view.pods_with(contract.LABEL_TRIALGROUP, rec.name, rec.namespace)
            if not (p.finished and p.labels.get(contract.LABEL_TRIAL) in ended)
            and p.labels.get(contract.LABEL_TRIAL) not in completed
        ]
        template = dict((rec.body.get("spec") or {}).get("template") or {})

        def gang(p: PodPlan) -> str:
            return p.labels[contract.LABEL_TRIAL]

        sync = self.ctx.sync_pods
        if grace is not None and grace != sync.grace_seconds:
            sync = dataclasses.replace(sync, grace_seconds=grace)
        result = await sync(
            self.owner(rec),
            rec.pod_plans(),
            existing,
            gang_of=gang,
            template_of=lambda _p: template,
            workload_class=contract.CLASS_BEST_EFFORT,
            recent=self.recent,
        )
        self._report_sync(
            rec,
            result,
            created="TrialPodsCreated",
            deleted="TrialPodsDeleted",
            failed="trial {gang}: no pods created: {why}",
        )

    async def delete(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        await self.forget((namespace, name))
        pods = self.view.pods_with(contract.LABEL_TRIALGROUP, name, namespace)
        for pod in pods:
            await self.api.delete(PODS, namespace, pod.name, grace_seconds=self.config.preemption_grace_s)
        self.post_event(body, "Normal", "Cleanup", f"deleted {len(pods)} pod(s); GPU pool returned")

    def _metrics(self, rec: TrialGroupRecord) -> None:
        base = {"namespace": rec.namespace, "trialgroup": rec.name}
        counts = {s: 0 for s in ("pending", "running", "completed", "stopped", "failed")}
        for t in rec.spec.trials:
            st = rec.trials[t.name]
            state = {"Completed": "completed", "Stopped": "stopped", "Running": "running"}.get(
                st.phase, "pending"
            )
            state = "failed" if st.failed else state
            counts[state] += 1
            labels = {**base, "trial": t.name}
            width = float(st.width) if st.width is not None and st.phase not in ENDED else 0.0
            self.metrics.gauge("tessera_trial_width").labels(**labels).set(width)
            self.metrics.gauge("tessera_trial_progress_ratio").labels(**labels).set(
                min(1.0, st.iterations_done / t.budget_iterations)
            )
        for state, n in counts.items():
            self.metrics.gauge("tessera_trialgroup_trials").labels(**base, state=state).set(n)
        best = best_objective(rec)
        if best is not None:
            self.metrics.gauge("tessera_trialgroup_best_objective").labels(**base).set(best)


def best_objective(rec: TrialGroupRecord) -> float | None:
    """The best trials[].result so far. Trials report `loss` with their progress (tessera.sdk), so lower
    is better unless spec.target says the metric is to be maximised."""
    results = [st.result for st in rec.trials.values() if st.result is not None]
    if not results:
        return None
    maximize = rec.spec.target is not None and rec.spec.target.goal == "maximize"
    return max(results) if maximize else min(results)
