"""The Themis ARBITER loop on Kubernetes: one round per lease period (or when an App arrives/finishes).

A round (Themis §3.3.2, §4.2.2): fold progress from pods into each App, release leases of
finished jobs and expired leases, compute the free GPUs from the cluster view, call
`tessera.policy.themis.Themis.allocate`, turn grants into leases, then for each App whose leases changed:
delete pods whose GPUs went away (preemption with a grace period for checkpointing), create pods where the
new leases say, write status and post events. Only the elected peer runs rounds: they are driven by kopf
timers and handlers, which kopf pauses on a lower-priority peer.

An App whose leases a round only renewed (the same GPUs for the same jobs, a later expiry) has no status
written in the round: the round writes one ledger object first (controller/ledger.py) with every such App,
and their statuses follow between rounds with the age-only refreshes. A round's writes are then the Apps
whose leases changed, plus one. A starting operator (or a standby taking over) reads the ledger before its
first round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tessera.api import contract
from tessera.cluster import Cluster
from tessera.controller.apps import AppRecord, template_of
from tessera.controller.concurrency import drain_limited
from tessera.controller.conditions import find
from tessera.controller.context import Context
from tessera.controller.kube import CONFIGMAPS, Kind, KubeError
from tessera.controller.ledger import Entry, Ledger, fit
from tessera.controller.liveness import PassClock
from tessera.controller.pods import Owner, PodPlan
from tessera.controller.queue_status import QUEUE_CPU_QUOTA, RoundFacts, Workload, model_quota_block
from tessera.controller.queues import QUEUE_RESOLVED, QueueBook, membership_news
from tessera.controller.quotas import Requests, app_pod, app_requests, pods_that_fit
from tessera.controller.readiness import app_conditions, missing_pods
from tessera.controller.status_writes import Written, status_due, written
from tessera.controller.sync import RecentCreates
from tessera.controller.view import healthy_gpus
from tessera.policy.queues.reclaim import Holding, Reclaim
from tessera.policy.queues.training import QueuedPolicy
from tessera.policy.themis import Themis, ThemisConfig
from tessera.policy.themis.bids import make_bid
from tessera.policy.themis.estimate import NAvg
from tessera.policy.training import AppState, RoundDecision, TrainingPolicy, check_decision

log = logging.getLogger(__name__)

APPS = Kind(contract.GROUP, contract.VERSION, contract.PLURAL_APP)
QUEUES = Kind(contract.GROUP, contract.VERSION, contract.PLURAL_QUEUE)


@dataclass
class RoundReport:
    now: float
    free: int = 0
    granted: dict[str, int] = field(default_factory=dict)
    expired: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


class Arbiter:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        config = self.config = ctx.config
        self.view = ctx.view
        self.api = ctx.api
        self.metrics = ctx.metrics
        self.themis = Themis(
            ThemisConfig(
                fairness_knob=config.fairness_knob,
                lease_s=config.lease_s,
                starving_rank=config.starving_rank,
                renew_in_place=config.renew_in_place,
                leftover_order=config.leftover_order,
            )
        )
        self.rng = random.Random(config.seed)
        self.records: dict[tuple[str, str], AppRecord] = {}
        self.last_round = -math.inf
        self.dirty = False
        self.lock = asyncio.Lock()
        self.recent = RecentCreates()  # pods created that the watch may not list yet
        self._written: dict[tuple[str, str], Written] = {}
        self.rounds = 0
        self.passes = PassClock(config.clock)  # for the liveness probe
        self.status_writes = 0
        self.heartbeats = 0
        # The renewal ledger (controller/ledger.py): what this operator read at start (None: not yet) or
        # last wrote; whether its ConfigMap exists; Apps whose leases run later than their written status.
        self.ledger: Ledger | None = None
        self._ledger_exists = False
        self.lagging: set[tuple[str, str]] = set()
        self.ledger_writes = 0
        self._last_heartbeat = -math.inf
        # The earliest lease expiry, or None to recompute. Every App's timer asks whether a lease has
        # expired (N timers a tick); leases change only in rounds and when an App is tracked, so the
        # answer is kept between those instead of scanning every lease on every tick (O(N^2) a tick).
        self._earliest_expiry: float | None = None
        # A round's events, held to be posted as one per App and type when it ends (None: post at once).
        self._held: dict[tuple[str, str], tuple[AppRecord, list[tuple[str, str, str]]]] | None = None
        # GPUs that TrialGroup pools and serving workers reserve: never offered in an auction.
        self.reserved: Callable[[], set[str]] = set
        # Team queues (Queue objects, namespace labels): Themis runs inside each queue's share.
        self.queues = QueueBook()
        self.queue_share: dict[str, float] = {}
        self.revoked: set[tuple[str, str]] = set()  # Apps a queue reclaimed GPUs from in the last round
        self.reclaim_grace: dict[tuple[str, str], int] = {}  # their pods' grace: the lending queue's
        # GPUs each queue holds in TrialGroup pools and serving replicas (set by the Controller).
        self.outside: Callable[[], dict[str, float]] = dict
        # GPUs each queue's TrialGroups and ModelDeployments wait for within its share (set by the Controller).
        self.outside_waiting: Callable[[], dict[str, float]] = dict
        # The same objects' holdings one by one, and what the last round asked each of them to give back
        # (by owner id "Kind/namespace/name"; the owner acts on it and takes it out).
        self.outside_holdings: Callable[[], list[Holding]] = list
        self.outside_reclaims: dict[str, Reclaim] = {}
        # TrialGroups and ModelDeployments with their queues, for the Queues' status (set by the Controller).
        self.outside_workloads: Callable[[], list[tuple[str, Workload]]] = list
        # The last round's whole reclaim plan, and queues whose reclaim waits for a lender's minimum runtime
        # (queue → when it ends): why objects wait, in the Queues' status.
        self.round_reclaims: list[Reclaim] = []
        self.reclaim_blocked: dict[str, float] = {}
        self.waiting_since: dict[tuple[str, str], float] = {}  # Apps waiting for GPUs → since when
        self._queue_written: dict[str, tuple[str, dict[str, Any]]] = {}  # Queue → (uid, status written)
        # A TrialGroup or ModelDeployment changed what it holds or waits for since the Queues' status was
        # worked out (`refresh_queues`), and when that was (time.monotonic).
        self.queues_stale = False
        self._queues_at = -math.inf
        # PriorityClass name → value, kept by the controller's watch (None: not watched, priorities unused).
        self.priority_classes: dict[str, int] | None = None
        self._priority_warned: dict[tuple[str, str], str] = {}  # App → the unknown class it was told of
        # When a holding that its queue's minimum runtime protects may be taken, while work waits: a round
        # is due then (nothing else would run one before the next lease ends).
        self._wake_at = math.inf
        # CPU and memory each queue's pods admitted through its gate request (set by the Controller), and
        # the Apps the last round offered fewer GPUs for their queue's maxCPU or maxMemory: (reason, why).
        self.pod_requests: Callable[[], dict[str, Requests]] = dict
        self.quota_waits: dict[tuple[str, str], tuple[str, str]] = {}
        # Told after each round (the Controller's admission pass for gated pods: shares and leases moved).
        self.after_round: Callable[[], None] = _nothing

    # --- membership -------------------------------------------------------------------------------

    def upsert(self, rec: AppRecord) -> bool:
        """Track an App. A record already held keeps its in-memory leases (fresher than status); its spec
        is refreshed. Returns True for an App not seen before."""
        old = self.records.get(rec.key)
        if old is not None and old.uid == rec.uid:
            ranked = (old.spec.priority_class_name, old.spec.preemptible)
            if ranked != (rec.spec.priority_class_name, rec.spec.preemptible):
                self.dirty = True  # its rank in its queue changed: a round now, not at the next lease end
            old.spec, old.body = rec.spec, rec.body
            return False
        # Leases recovered from status run until the ledger says, where a round renewed them since.
        if self.ledger is not None and self.ledger.apply(rec):
            self.lagging.add(rec.key)
        self.records[rec.key] = rec
        self.dirty = True
        self._earliest_expiry = None
        return True

    def outstanding(self) -> int:
        return sum(r.demand() for r in self.records.values() if not r.done)

    async def remove(self, key: tuple[str, str]) -> None:
        async with self.lock:
            self.records.pop(key, None)
            self._written.pop(key, None)
            self.lagging.discard(key)
            self.waiting_since.pop(key, None)
            self._priority_warned.pop(key, None)
            self.dirty = True
            self._earliest_expiry = None
            self.metrics.remove_series(namespace=key[0], app=key[1])

    # --- rounds -----------------------------------------------------------------------------------

    async def maybe_run(self, now: float | None = None) -> RoundReport | None:
        """Run a round if one is due (lease period passed) or something changed since the last one."""
        now = self.config.clock() if now is None else now
        if not self._due(now):
            return None
        await self.load_ledger()
        async with self.lock:
            # A caller that read the clock before waiting for the lock may find a later round already
            # run: rounds never go back in time (N_avg and GPU-seconds integrate forward).
            now = max(now, self.last_round)
            if not self._due(now):
                return None
            return await self.run_round(now)

    def _due(self, now: float) -> bool:
        return (
            self.dirty
            or now - self.last_round >= self.config.lease_s
            or self._lease_expired(now)
            or now >= self._wake_at
        )

    async def load_ledger(self) -> None:
        """Read the renewal ledger once, before the first round and the first App is tracked (lazily: a
        standby reads it when it takes over, not while another peer acts). A missing ledger is empty; any
        other failure raises, and the handler that asked retries."""
        if self.ledger is not None:
            return
        ns, name = self.config.ledger_ns, contract.LEDGER_CONFIGMAP
        try:
            obj = await self.api.get(CONFIGMAPS, ns, name)
        except KubeError as err:
            if err.status != 404:
                raise
            self.ledger = Ledger()
            return
        self._ledger_exists = True
        self.ledger = Ledger.from_configmap(obj, contract.LEDGER_KEY)
        log.info(
            "arbiter ledger %s/%s read: round %d, %d App(s)",
            ns,
            name,
            self.ledger.round,
            len(self.ledger.apps),
        )
        for key, rec in self.records.items():  # tracked before the read (not through reconcile_app)
            if self.ledger.apply(rec):
                self.lagging.add(key)
        self._earliest_expiry = None

    def _lease_expired(self, now: float) -> bool:
        if self._earliest_expiry is None:
            self._earliest_expiry = min(
                (lease.expires for r in self.records.values() for lease in r.leases), default=math.inf
            )
        return self._earliest_expiry <= now

    async def run_round(self, now: float) -> RoundReport:
        self._held = {}
        try:
            with self.passes.timing(), cyclic_gc_deferred():
                return await self._run_round(now)
        finally:
            self._earliest_expiry = None  # the round expired and granted leases
            self._post_held()

    async def _run_round(self, now: float) -> RoundReport:
        t0 = time.perf_counter()
        # (job, GPU) pairs each App held coming in: a grant of exactly those is a renewal, not news.
        before = {k: r.lease_pairs() for k, r in self.records.items()}
        self.dirty = False
        self.last_round = now
        report = RoundReport(now)
        cluster = self.view.cluster()
        changed = self._advance(now, report)
        active = [r for r in self.records.values() if not r.done]
        free = self._free_gpus(cluster, active)
        report.free = len(free)
        gained: set[tuple[str, str]] = set()  # Apps granted GPUs in this round
        self.outside_reclaims = {}
        # With team queues a round may take GPUs back (immediate reclaim, or from TrialGroups and
        # ModelDeployments for other queues' waiting objects) though none is free and no App runs.
        if (active and free) or self.queues.active:
            gained = self._auction(now, cluster, active, free, before, report)
            changed |= gained | self.revoked
        # Renewed: granted again exactly the (job, GPU) pairs held coming in. Their new expiries go to the
        # ledger, not to status.
        renewed = {
            k for k in gained if k not in self.revoked and self.records[k].lease_pairs() == before.get(k)
        }
        for rec in self.records.values():
            rec.note_holding(now)
            rec.previous = {}  # this round saw them: handed back, or to others
        self._wake_at = self._protected_until(now, cluster, active)
        self._export(now, cluster)
        await self._write_round(now, changed - renewed, gained, renewed)
        await self.write_queues(now, cluster)
        report.seconds = time.perf_counter() - t0
        self.metrics.histogram("tessera_auction_duration_seconds").observe(report.seconds)
        self.rounds += 1
        log.debug("arbiter round: %s", report)
        self.after_round()
        return report

    def _advance(self, now: float, report: RoundReport) -> set[tuple[str, str]]:
        """Bring every App to `now`: GPU-seconds, progress from its pods, leases of finished jobs and
        expired leases returned, N_avg, completion. Returns the Apps whose status this changed."""
        changed: set[tuple[str, str]] = set()
        n_active = sum(1 for r in self.records.values() if not r.done)
        # Under team queues N_avg counts the Apps of the App's own queue (ρ against the queue's share).
        per_queue: dict[str, int] = {}
        for r in self.records.values():
            if not r.done:
                q = self.queues.queue_of(r.namespace)
                per_queue[q] = per_queue.get(q, 0) + 1
        for rec in self.records.values():
            if self.queues.active:
                n_active = per_queue.get(self.queues.queue_of(rec.namespace), 0)
            rec.account(now)
            pods = self.view.pods_with(contract.LABEL_APP, rec.name, rec.namespace)
            for job in rec.observe(pods):
                self._event(rec, "Normal", "JobCompleted", f"job {job} reached its target iterations")
                changed.add(rec.key)
            # Leases on GPUs the view does not know (yet: right after a restart) are kept until they
            # expire, so a half-loaded view never drops a lease.
            gone = rec.release_finished() + rec.expire(now)
            if gone:
                changed.add(rec.key)
                n = sum(len(lease.gpus) for lease in gone)
                report.expired[f"{rec.namespace}/{rec.name}"] = n
                self._count_lease(rec, "expired", n)
            if rec.navg is None:
                # N_avg from the App's start, but never from after this round: a startTime written by a
                # clock ahead of ours, or an App upserted after this round read the clock, would make
                # time run backwards.
                rec.navg = NAvg(min(rec.start, now), n_active)
            else:
                rec.navg.update(now, n_active)
            if rec.done and rec.finished_at is None:
                rec.finished_at = now
                self._event(rec, "Normal", "Succeeded", "all jobs completed; GPUs returned")
                changed.add(rec.key)
        return changed

    def _free_gpus(self, cluster: Cluster, active: list[AppRecord]) -> list[str]:
        """Healthy GPUs no App leases, no other pod holds, and no TrialGroup pool or serving reserves."""
        held = {g for r in active for g in r.held()}
        others = self.view.used_by_pods(exclude_label=contract.LABEL_APP)
        reserved = self.reserved()
        return [g for g in healthy_gpus(cluster) if g not in held and g not in others and g not in reserved]

    def _auction(
        self,
        now: float,
        cluster: Cluster,
        active: list[AppRecord],
        free: list[str],
        before: dict[tuple[str, str], set[tuple[str, str]]],
        report: RoundReport,
    ) -> set[tuple[str, str]]:
        """Themis' allocation of `free` among the active Apps, turned into leases. Returns the Apps that
        were granted GPUs."""
        # The policy reasons about GPUs the cluster has: a lease on a node that left (or is not listed
        # yet) is kept to its expiry but is not part of the App's holding in a bid.
        known = set(cluster.gpu_ids)
        states = self._within_pod_quotas([self.queued_state(r, now, known) for r in active], active)
        decision = self.policy(states).allocate(now, states, cluster, free, self.rng)
        check_decision(decision, states, free)
        by_id = {f"{r.namespace}/{r.name}": r for r in active}
        gained: set[tuple[str, str]] = set()
        self._reclaimed(decision, by_id, states)
        self.queue_share = {
            q: float(v["share"]) for q, v in decision.record.get("queues", {}).items() if isinstance(v, dict)
        }
        self.outside_reclaims = {r.owner: r for r in decision.record.get("outside_reclaims", [])}
        self.round_reclaims = list(decision.record.get("reclaims", []))
        self.reclaim_blocked = dict(decision.record.get("reclaim_blocked", {}))
        for grant in decision.grants:
            rec = by_id[grant.app_id]
            leases = rec.grant(grant.gpus, grant.expiry, grant.source, cluster)
            if not leases:
                continue
            gained.add(rec.key)
            n = sum(len(lease.gpus) for lease in leases)
            report.granted[grant.app_id] = report.granted.get(grant.app_id, 0) + n
            self._count_lease(rec, "granted", n)
            # An event says what moved; a lease renewed on the same GPUs for the same jobs (most of them,
            # each lease period) shows in status only (new expiresAt).
            pairs = {(lease.job, g) for lease in leases for g in lease.gpus}
            if not pairs <= before.get(rec.key, set()):
                where = ", ".join(f"{lease.job}@{','.join(lease.gpus)}" for lease in leases)
                self._event(
                    rec, "Normal", "LeaseGranted", f"{grant.source}: {where} until {grant.expiry:.0f}"
                )
        self.metrics.counter("tessera_auction_rounds_total").inc()
        return gained

    def _within_pod_quotas(self, states: list[AppState], active: list[AppRecord]) -> list[AppState]:
        """Each App of a queue with maxCPU or maxMemory offered no more GPUs than pods of it still fit: every
        GPU granted may bring one more pod (a job on a new node), so an App is offered at most as many GPUs
        as pods of its largest request fit in what its queue's pods leave, its queue's Apps served in
        priority order, then oldest first. An App held back keeps what it holds and waits (`quota_waits`)."""
        self.quota_waits = {}
        limited = {
            q for q, s in self.queues.specs.items() if s.max_cpu is not None or s.max_memory is not None
        }
        if not limited:
            return states
        by_id = {f"{r.namespace}/{r.name}": r for r in active}
        used = {q: r for q, r in self.pod_requests().items() if q in limited}
        for r in active:
            q = self.queues.queue_of(r.namespace)
            if q in limited:
                used[q] = used.get(q, Requests()) + app_requests(r)
        out = []
        for s in sorted(states, key=lambda s: (-s.priority, by_id[s.app_id].start, s.app_id)):
            if s.queue not in limited or s.unmet <= 0:
                out.append(s)
                continue
            rec = by_id[s.app_id]
            pod = app_pod(rec)
            n, reason = pods_that_fit(self.queues.specs[s.queue], used[s.queue], pod)
            if n < s.unmet:
                spec = self.queues.specs[s.queue]
                limit = spec.max_cpu if reason == QUEUE_CPU_QUOTA else spec.max_memory
                self.quota_waits[rec.key] = (
                    reason,
                    f"queue {s.queue}'s pods request {used[s.queue].text(reason)} of its "
                    f"{'maxCPU' if reason == QUEUE_CPU_QUOTA else 'maxMemory'} {limit}; a pod of App "
                    f"{rec.name} requests {pod.text(reason)}: offered {n} more GPU(s) of the {s.unmet} it "
                    "waits for",
                )
                s = dataclasses.replace(s, demand_max=len(s.held) + n)
            used[s.queue] = used[s.queue] + Requests(pod.cpu * s.unmet, pod.memory * s.unmet)
            out.append(s)
        order = {s.app_id: i for i, s in enumerate(states)}
        return sorted(out, key=lambda s: order[s.app_id])

    def _protected_until(self, now: float, cluster: Cluster, active: list[AppRecord]) -> float:
        """When a holding its queue's minimum runtime protects may be taken while work waits (a round is
        due then); math.inf if none."""
        policy = self.policy()
        if not isinstance(policy, QueuedPolicy):
            return math.inf
        known = set(cluster.gpu_ids)
        rows = []
        for r in active:
            if r.done:
                continue
            s = self.queued_state(r, now, known)
            rows.append((s.queue, len(s.held), s.unmet, s.since, s.preemptible))
        return policy.protected_until(now, rows)

    def policy(self, states: Iterable[AppState] = ()) -> TrainingPolicy:
        """Themis on the whole cluster, or inside each team queue's share once Queues exist (or an App has
        a priority or is non-preemptible: all of them then share the `default` queue)."""
        ranked = any(s.priority != 0 or not s.preemptible for s in states)
        if not self.queues.active and not ranked:
            return self.themis
        return QueuedPolicy(
            self.themis,
            self.queues.nodes(),
            self.queues.rules(),
            name="themis",
            outside=self.outside(),
            outside_waiting=self.outside_waiting(),
            outside_holdings=self.outside_holdings(),
            explain=True,
            model_caps=self.queues.model_caps(),
        )

    def queued_state(self, rec: AppRecord, now: float, known: set[str] | None = None) -> AppState:
        # The minimum runtime counts from the start of the App's current holding.
        return dataclasses.replace(
            rec.state(now, known),
            queue=self.queues.queue_of(rec.namespace),
            since=rec.held_since if rec.held_since is not None else now,
            priority=self.priority_of(rec),
            preemptible=rec.spec.preemptible,
        )

    def priority_of(self, rec: AppRecord) -> int:
        """The value of the App's PriorityClass; 0 without one, or while it names a class that does not
        exist (a Warning event says so, once per App and class name)."""
        name = rec.spec.priority_class_name
        if name is None or self.priority_classes is None:
            return 0
        value = self.priority_classes.get(name)
        if value is not None:
            if self._priority_warned.pop(rec.key, None) is not None:
                self._post(
                    rec, "Normal", "PriorityClassFound", f"PriorityClass {name} found: priority {value}"
                )
            return value
        if self._priority_warned.get(rec.key) != name:
            self._priority_warned[rec.key] = name
            self._post(
                rec,
                "Warning",
                "PriorityClassNotFound",
                f"no PriorityClass {name} exists: the App has priority 0 in its queue until the class is created",
            )
        return 0

    def _reclaimed(
        self, decision: RoundDecision, by_id: dict[str, AppRecord], states: list[AppState]
    ) -> None:
        """GPUs a team queue took back at once (`immediate`): out of the App's leases (its pods go with
        the preemption grace), with an event on the App that lost them and on the Queue that gained."""
        queue_of = {s.app_id: s.queue for s in states}
        # Queues whose Apps won GPUs, or whose TrialGroups and ModelDeployments wait for some.
        gainers = sorted({queue_of[g.app_id] for g in decision.grants} | set(self.outside_waiting()))
        within = set(decision.record.get("within_queue", ()))
        plan: list[Reclaim] = list(decision.record.get("reclaims", []))
        self.revoked = set()
        for app_id, gpus in decision.revoke.items():
            rec = by_id[app_id]
            n = rec.revoke(gpus)
            if not n:
                continue
            self.revoked.add(rec.key)
            spec = self.queues.specs.get(queue_of[app_id])
            if spec is not None:
                self.reclaim_grace[rec.key] = math.ceil(spec.reclaim.checkpoint_grace_seconds)
            self._count_lease(rec, "revoked", n)
            if app_id in within:
                self._event(
                    rec,
                    "Warning",
                    "Preempted",
                    f"{n} GPU(s) taken for higher-priority Apps of queue {queue_of[app_id]} "
                    "(its preemption.withinQueue is LowerPriority)",
                )
                continue
            # The plan says for whom and why (below a guarantee, or borrowing within the cohort).
            planned = [r for r in plan if r.owner == app_id and r.mode == "immediate"]
            targets = sorted({r.for_queue for r in planned}) or [q for q in gainers if q != queue_of[app_id]]
            to = ", ".join(targets) or "another queue"
            why = "; ".join(dict.fromkeys(r.reason for r in planned)) or (
                f"queue {queue_of[app_id]} is above its share and {to} below its guarantee with work waiting"
            )
            self._event(rec, "Warning", "Reclaimed", f"{n} GPU(s) taken back for {to}: {why}")
            for q in targets:
                if q in self.queues.uids:
                    body = {
                        "apiVersion": contract.API_VERSION,
                        "kind": contract.KIND_QUEUE,
                        "metadata": {"name": q, "namespace": "", "uid": self.queues.uids[q]},
                    }
                    self.ctx.post_event(
                        body, "Normal", "Reclaimed", f"{n} GPU(s) of {app_id} reclaimed: {why}"
                    )

    async def write_queues(self, now: float, cluster: Cluster) -> None:
        """Each Queue's status (share; allocated, borrowed, lent and waiting over Apps, TrialGroups and
        ModelDeployments; the pending list; max ρ) and its gauges. One pass over the objects for all queues;
        a status is patched only when it differs from the one last written."""
        if not self.queues.active:
            return
        self.queues_stale, self._queues_at = False, time.monotonic()
        by_queue, max_rho = self._queue_workloads(now, cluster)
        facts = self._round_facts(now, cluster)
        statuses = self.queues.statuses(by_queue, self.queue_share, facts, max_rho)
        for name, status in statuses.items():
            self.queues.export(self.metrics, name, status)
            wire, uid = status.to_wire(), self.queues.uids.get(name, "")
            if self._queue_written.get(name) == (uid, wire):
                continue
            # A merge patch keeps the fields it leaves out: those unset now are cleared by name (a queue's
            # last App gone takes its maxRho with it; a parent's last child, its `own`).
            cleared = {f: None for f in ("maxRho", "own") if f not in wire}
            try:
                await self.api.patch(QUEUES, "", name, {"status": {**wire, **cleared}}, sub="status")
                self._queue_written[name] = (uid, wire)
            except KubeError as err:
                if err.status != 404:  # a Queue deleted since: its delete handler cleans up
                    log.warning("status of Queue %s not written: %s", name, err)
        for name in set(self._queue_written) - set(self.queues.specs):
            del self._queue_written[name]

    async def refresh_queues(self, now: float | None = None) -> None:
        """The Queues' status between rounds, once a TrialGroup or ModelDeployment changed what it holds or
        waits for (a round works it out anyway): at most once a tick, with the last round's division and
        reclaim plan. Without it a group waiting beyond its queue's share (which starts no round) showed in
        no pending list until the next lease period's round."""
        # At most once a tick of real time: it costs CPU, whatever the operator's clock says.
        if (
            not self.queues_stale
            or self.lock.locked()
            or time.monotonic() - self._queues_at < self.config.tick
        ):
            return
        now = self.config.clock() if now is None else now
        async with self.lock:
            await self.write_queues(max(now, self.last_round), self.view.cluster())

    def _queue_workloads(
        self, now: float, cluster: Cluster
    ) -> tuple[dict[str, list[Workload]], dict[str, float]]:
        """Every queue's objects (Apps from the records, the others from the Controller), and the largest
        finite ρ among each queue's Apps. An App waits while it holds fewer GPUs the cluster knows than its
        demand: since its start if it never held any, else since the first round that saw it short."""
        by_queue: dict[str, list[Workload]] = {}
        max_rho: dict[str, float] = {}
        since: dict[tuple[str, str], float] = {}
        for rec in self.records.values():
            if rec.done:
                continue
            q = self.queues.queue_of(rec.namespace)
            held = sum(1 for g in rec.held() if g in cluster)
            wants = float(max(0, rec.demand() - held))
            if wants:
                fresh = rec.start if rec.active_gpu_seconds <= 0 and not rec.leases else now
                since[rec.key] = self.waiting_since.get(rec.key, fresh)
            reason, message = self.quota_waits.get(rec.key, ("", "")) if wants else ("", "")
            w = Workload(
                contract.KIND_APP,
                rec.namespace,
                rec.name,
                float(held),
                wants,
                since.get(rec.key, now),
                reason,
                message,
            )
            by_queue.setdefault(q, []).append(w)
            if rec.rho is not None and math.isfinite(rec.rho):
                max_rho[q] = max(max_rho.get(q, rec.rho), rec.rho)
        self.waiting_since = since
        for q, w in self.outside_workloads():
            by_queue.setdefault(q, []).append(w)
        return by_queue, max_rho

    def _round_facts(self, now: float, cluster: Cluster) -> RoundFacts:
        """The free GPUs left after the round, the next lease end and round, and the round's reclaim plan
        with each App's lease-end reclaim dated by that App's lease."""
        active = [r for r in self.records.values() if not r.done]
        ends = {
            f"{r.namespace}/{r.name}": min((lease.expires for lease in r.leases), default=math.inf)
            for r in active
        }
        reclaims = [
            dataclasses.replace(r, at=max(now, ends[r.owner]))
            if not math.isfinite(r.at) and r.owner in ends
            else r
            for r in self.round_reclaims
        ]
        free = self._free_gpus(cluster, active)
        return RoundFacts(
            now=now,
            free=len(free),
            next_lease_end=min(ends.values(), default=math.inf),
            next_round=self.last_round + self.config.lease_s,
            reclaims=reclaims,
            blocked=self.reclaim_blocked,
            model_blocked=self._model_blocked(cluster, active, free),
        )

    def _model_blocked(self, cluster: Cluster, active: list[AppRecord], free: list[str]) -> dict[str, str]:
        """Queues whose Apps may take none of the free GPUs for their per-model caps, and why in words."""
        caps = self.queues.model_caps()
        if not caps or not free:
            return {}
        free_models = Counter(cluster.gpu(g).model for g in free)
        held: dict[str, Counter[str]] = {}
        for r in active:
            q = self.queues.queue_of(r.namespace)
            if q in caps:
                held.setdefault(q, Counter()).update(cluster.gpu(g).model for g in r.held() if g in cluster)
        return {
            q: msg
            for q, c in caps.items()
            if (msg := model_quota_block(q, c, held.get(q, Counter()), free_models))
        }

    def _export(self, now: float, cluster: Cluster) -> None:
        """ρ and its parts for every App that holds only GPUs the cluster knows, as status and gauges."""
        for rec in self.records.values():
            if len(cluster) and not rec.done and all(g in cluster for g in rec.held()):
                self._estimate(rec, now, cluster)
            labels = {"namespace": rec.namespace, "app": rec.name}
            if rec.rho is not None and math.isfinite(rec.rho):
                self.metrics.gauge("tessera_app_rho").labels(**labels).set(rec.rho)
            if rec.t_shared is not None and math.isfinite(rec.t_shared):
                self.metrics.gauge("tessera_app_t_shared_seconds").labels(**labels).set(rec.t_shared)
            if rec.t_independent is not None:
                self.metrics.gauge("tessera_app_t_independent_seconds").labels(**labels).set(
                    rec.t_independent
                )
            self.metrics.gauge("tessera_app_gpus").labels(**labels).set(len(rec.held()))

    async def _write_round(
        self,
        now: float,
        changed: set[tuple[str, str]],
        gained: set[tuple[str, str]],
        renewed: set[tuple[str, str]],
    ) -> None:
        """The ledger (if the round renewed leases), every App's pods, then the statuses the round changed.
        Each App's writes are independent of the others': sent together, bounded. Statuses of Apps that
        gained GPUs go last, so a reader never sees a GPU leased to the winner while the loser's status
        still lists it (sequential writes in name order did not promise even that). Statuses due only to
        age, and renewed leases' new expiries, are left to `refresh_stale`."""
        keys = sorted(self.records)
        if renewed:
            changed = changed | await self._write_ledger(now, renewed)
        await self._each(self.sync(self.records[k]) for k in keys)
        for batch in ([k for k in keys if k not in gained], [k for k in keys if k in gained]):
            await self._each(self._due_writes(batch, now, changed))

    def _due_writes(
        self, keys: list[tuple[str, str]], now: float, changed: set[tuple[str, str]]
    ) -> Iterator[Awaitable[None]]:
        """The status patches of these Apps that are due (a few hundred of N in a round), each worked out
        when an API slot is free for it, so the rest cost no request and no task."""
        for k in keys:
            rec = self.records[k]
            status = self.due_status(rec, now, force=k in changed, heartbeat=False, lagging=k in self.lagging)
            if status is not None:
                yield self._patch_status(rec, status, now)

    async def _write_ledger(self, now: float, renewed: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Write the ledger: every App whose leases run later than its written status says (this round's
        renewals and those of earlier rounds not yet followed), before any pod of the round moves. Returns
        the renewed Apps whose status must be written in the round instead: past the ledger's size limit,
        or all of them if the ledger could not be written."""
        lagging = self.lagging | renewed
        entries, over = fit((k, Entry.of(self.records[k])) for k in sorted(lagging) if k in self.records)
        ledger = Ledger(self.rounds + 1, now, entries)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": contract.LEDGER_CONFIGMAP,
                "namespace": self.config.ledger_ns,
                "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE},
            },
            "data": {contract.LEDGER_KEY: ledger.to_json()},
        }
        ns = self.config.ledger_ns
        try:
            if self._ledger_exists:
                try:
                    await self.api.patch(CONFIGMAPS, ns, contract.LEDGER_CONFIGMAP, {"data": body["data"]})
                except KubeError as err:
                    if err.status != 404:
                        raise
                    self._ledger_exists = False
            if not self._ledger_exists:
                try:
                    await self.api.create(CONFIGMAPS, ns, body, exists_ok=False)
                except KubeError as err:
                    if err.status != 409:
                        raise
                    await self.api.patch(CONFIGMAPS, ns, contract.LEDGER_CONFIGMAP, {"data": body["data"]})
                self._ledger_exists = True
        except KubeError as err:
            log.warning("arbiter ledger not written (%s): renewed leases go to status this round", err)
            self.metrics.counter("tessera_arbiter_ledger_writes_total").labels(result="failed").inc()
            return set(renewed)
        self.ledger_writes += 1
        self.metrics.counter("tessera_arbiter_ledger_writes_total").labels(result="written").inc()
        self.metrics.gauge("tessera_arbiter_ledger_apps").set(len(entries))
        self.ledger = ledger
        self.lagging = set(entries)
        if over:
            log.warning(
                "arbiter ledger full: %d renewed App(s) get their status written this round", len(over)
            )
        return set(over)

    def _estimate(self, rec: AppRecord, now: float, cluster: Cluster) -> None:
        """ρ = T_sh / T_id from the bid's empty row (what `Themis.current_rho` evaluates, §2.3 Eq. 1):
        T_sh = elapsed + remaining time on the GPUs held at their locality, T_id from `t_id`. T_sh is
        infinite for an App holding nothing; ρ is then capped and T_sh not exported."""
        c = self.themis.config
        view = self._share_view(rec, cluster)
        bid = make_bid(rec.state(now), now, view, 0, rho_cap=c.rho_cap, tid_mode=c.tid_mode)
        rec.rho = bid.rho_old
        locality = bid.held.locality()
        remaining = bid.app.estimator.remaining_time(bid.held.count, bid.app.sensitivity.slowdown(locality))
        rec.t_shared = bid.elapsed + remaining
        rec.t_independent = bid.tid

    def _share_view(self, rec: AppRecord, cluster: Cluster) -> Cluster:
        """The GPUs ρ is measured against: the cluster, or under team queues as many as the App's queue is
        entitled to (its own GPUs among them), so T_independent is its time on a fair share of its queue."""
        if not self.queues.active:
            return cluster
        share = max(1, round(self.queue_share.get(self.queues.queue_of(rec.namespace), 0.0)))
        held = {g for g in rec.held() if g in cluster}
        others = list(
            itertools.islice((g for g in cluster.iter_gpu_ids() if g not in held), max(0, share - len(held)))
        )
        return cluster.subset(held | set(others))

    # --- writing ----------------------------------------------------------------------------------

    async def _each(self, calls: Iterable[Awaitable[None]]) -> None:
        for res in await drain_limited(calls, self.config.api_concurrency):
            if isinstance(res, BaseException):
                raise res

    async def apply(self, rec: AppRecord, now: float, *, force: bool = False) -> None:
        """Pods to match the leases, then status when `status_due` says so (or `force`: leases changed)."""
        await self.sync(rec)
        await self.write_status(rec, now, force=force)

    async def sync(self, rec: AppRecord) -> None:
        """Create and delete the App's pods so they match its leases (none once it is done)."""
        existing = self.view.pods_with(contract.LABEL_APP, rec.name, rec.namespace)
        plans = [] if rec.done else rec.pod_plans()

        def gang(p: PodPlan) -> str:
            return p.labels[contract.LABEL_JOB]

        # Pods whose GPUs a queue took back at once get that lending queue's checkpoint grace.
        grace = self.reclaim_grace.pop(rec.key, self.config.preemption_grace_s)
        sync = self.ctx.sync_pods
        if grace != sync.grace_seconds:
            sync = dataclasses.replace(sync, grace_seconds=grace)
        result = await sync(
            app_owner(rec),
            plans,
            existing,
            gang_of=gang,
            template_of=lambda p: template_of(rec, gang(p)),
            workload_class=contract.CLASS_BEST_EFFORT,
            recent=self.recent,
            concurrency=self.config.api_concurrency,
        )
        if result.deleted:
            self._event(
                rec,
                "Normal",
                "Preempted",
                f"deleted {len(result.deleted)} pod(s) with {grace}s grace: " + ", ".join(result.deleted),
            )
        if result.created:
            self._event(rec, "Normal", "PodsCreated", ", ".join(result.created))
        for gang_name, why in result.failed_gangs.items():
            self._event(rec, "Warning", "GangFailed", f"job {gang_name}: no pods created: {why}")

    async def refresh_stale(self, now: float | None = None) -> int:
        """Rewrite statuses due only to age (`status_max_staleness_s`: elapsed time, GPU-seconds), oldest
        first, at most a tick's share of them per tick, so that every App is refreshed within the bound
        without any one round carrying all N writes (Apps created together all go stale together).
        Runs between rounds under the arbiter's lock; returns how many it wrote."""
        now = self.config.clock() if now is None else now
        if now - self._last_heartbeat < self.config.tick or self.lock.locked():
            return 0
        self._last_heartbeat = now
        staleness = self.config.status_staleness
        # Half the staleness window to catch up with a backlog, at one call per tick.
        budget = max(1, math.ceil(len(self.records) * self.config.tick / (staleness / 2)))
        # Apps whose renewed leases only the ledger holds first, then the oldest.
        due = sorted(
            (k not in self.lagging, w.at, k) for k, w in self._written.items() if now - w.at >= staleness
        )
        async with self.lock:
            now = max(now, self.last_round)
            keys = [k for _, _, k in due[:budget] if k in self.records]
            before = self.status_writes
            await self._each(self.write_status(self.records[k], now) for k in keys)
            wrote = self.status_writes - before
        self.heartbeats += wrote
        return wrote

    async def write_status(
        self, rec: AppRecord, now: float, *, force: bool = False, heartbeat: bool = True
    ) -> None:
        """Patch the App's status when `status_due` says so, or always with `force` (leases changed).
        Without `heartbeat` a status due only to age is left to `refresh_stale`."""
        status = self.due_status(rec, now, force=force, heartbeat=heartbeat, lagging=rec.key in self.lagging)
        if status is not None:
            await self._patch_status(rec, status, now)

    def due_status(
        self,
        rec: AppRecord,
        now: float,
        *,
        force: bool = False,
        heartbeat: bool = True,
        lagging: bool = False,
    ) -> dict[str, Any] | None:
        """The App's status (wire form) if it is to be written now (see `write_status`), else None."""
        status = rec.status(now).to_wire()
        # Every App the arbiter holds is admitted; Ready says whether its leases' pods are there.
        pods = self.view.pods_with(contract.LABEL_APP, rec.name, rec.namespace)
        missing = missing_pods([] if rec.done else rec.pod_plans(), pods, self.recent, rec.namespace)
        last = self._written.get(rec.key)
        queue = self.queues.membership(rec.namespace)
        status.update(app_conditions(rec, missing, last.fields.get("conditions") if last else None, queue))
        due = status_due(
            last,
            status,
            now,
            rho_tolerance=self.config.status_rho_tolerance,
            max_staleness_s=self.config.status_staleness if heartbeat else math.inf,
            lagging=lagging,
        )
        return status if force or due else None

    async def _patch_status(self, rec: AppRecord, status: dict[str, Any], now: float) -> None:
        last = self._written.get(rec.key)
        before = last.fields.get("conditions") if last else (rec.body.get("status") or {}).get("conditions")
        try:
            await self.api.patch(APPS, rec.namespace, rec.name, {"status": status}, sub="status")
            self.status_writes += 1
            self._written[rec.key] = written(status, now)
            self.lagging.discard(rec.key)  # the status holds the leases as they are now
        except KubeError as err:
            if err.status == 404:
                return  # deleted meanwhile; the delete handler cleans up
            log.warning("status of App %s/%s not written: %s", rec.namespace, rec.name, err)
            return
        # A change of QueueResolved is news once, when written (not held for the round's folded events:
        # its reason stays its own).
        news = membership_news(find(status.get("conditions"), QUEUE_RESOLVED), before)
        if news is not None:
            self._post(rec, *news)

    def _count_lease(self, rec: AppRecord, change: str, n: int) -> None:
        self.metrics.counter("tessera_lease_changes_total").labels(
            namespace=rec.namespace, app=rec.name, change=change
        ).inc(n)

    def _event(self, rec: AppRecord, type_: str, reason: str, message: str) -> None:
        if self._held is not None:
            self._held.setdefault(rec.key, (rec, []))[1].append((type_, reason, message))
            return
        self._post(rec, type_, reason, message)

    def _post_held(self) -> None:
        """One event per App and type for a round (an App that won a lease got LeaseGranted and
        PodsCreated, one that moved Preempted too): the first reason names it and the message carries the
        others', as the Kubernetes event recorder folds similar events. Halves a round's event writes."""
        held, self._held = self._held or {}, None
        for rec, notes in held.values():
            for type_ in ("Warning", "Normal"):
                mine = [(reason, message) for t, reason, message in notes if t == type_]
                if not mine:
                    continue
                reason, message = mine[0]
                rest = "; ".join(f"{r}: {m}" for r, m in mine[1:])
                self._post(rec, type_, reason, f"{message}; {rest}" if rest else message)

    def _post(self, rec: AppRecord, type_: str, reason: str, message: str) -> None:
        self.ctx.event(app_owner(rec), type_, reason, message)


def _nothing() -> None:
    return None


@contextlib.contextmanager
def cyclic_gc_deferred() -> Iterator[None]:
    """Python's cyclic garbage collector off while a round runs, back as it was once the round is done.

    The operator holds a few hundred thousand long-lived objects (records, the cluster view, kopf's
    per-object state), and a 1000-App round allocated enough to trigger two or three full collections,
    each walking all of them: 0.9-1.7 s of a round's 4.8-7.8 s of operator CPU. Reference counting still
    frees what the round drops; what forms cycles waits for the first automatic collection after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def app_owner(rec: AppRecord) -> Owner:
    return Owner(contract.KIND_APP, rec.name, rec.namespace, rec.uid)
