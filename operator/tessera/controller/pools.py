"""Serving pools: ModelDeployments naming the same ``spec.placement.pool`` placed jointly by AlpaServe.

A thin adapter from ModelDeployment specs to the planner of ``tessera.policy.serving.alpaserve``
(AlpaServe §4.2: Algorithm 2 over the fast heuristic, scored by the shortest-queue FCFS simulator of §5):

* **Pool GPUs**: each member brings ``replicas × gpusPerReplica`` GPUs, so a pool uses exactly the GPUs its
  members would have used on dedicated replicas. Groups stay on one node: group sizes are powers of two up
  to the largest number of healthy GPUs one node has (at most 8). Intra-op ``op = 1``: workers run
  pipeline stages only (see ``plan_pool``).
* **Memory budget** per GPU: the smallest ``gpu.gpuMemoryMiB − reservedMiB`` (or lane size) among members;
  a model's weights are ``memory.staticMiB`` (0 when not given).
* **Profiles**: measured stage profiles are not in the spec yet, so each model's per-config profile is the
  α-model of AlpaServe §3.3 from its batch-1 latency ℓ(1) (``synthetic_profile``) and is marked synthetic.
* **Workload**: per member a Gamma(rate, cv = ``traffic.cv``) stream, seeded, the rate being the load the
  pool gateway observed for it (``observedLoadRps``) when known, else ``traffic.expectedRps``,
  over ``max(60 s, 3000 / Σ rate)`` capped at 600 s (the shape of ``gen_train_workload`` in the authors'
  code, shorter).
* **Hysteresis** (re-planning is not per reconcile): a pool is re-planned when its members, SLOs,
  profiles, CVs or GPUs change, or when a member's rate moved more than ``RATE_HYSTERESIS`` (relative)
  from the rate the plan was made for.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from tessera.api import contract
from tessera.controller.pods import Owner, PodPlan
from tessera.controller.serving import (
    CONFIG_PATH,
    GATEWAY_PORT,
    SERVICE_PORT,
    WORKER_PORT,
    ServingRecord,
    ServingSpecError,
    batch_profile,
    gateway_manifests,
    resolve_slo_ms,
)
from tessera.controller.view import split_gpu_id
from tessera.gateway.config import GatewayConfig
from tessera.policy.serving.alpaserve import (
    SearchOptions,
    Workload,
    all_configs,
    evaluate,
    place,
    synthetic_profile,
)

POOL_LABEL = "tessera.io/pool"
POOL_SUFFIX = "-pool"  # <pool>-pool: the pool gateway's Deployment, Service and ConfigMap
RATE_HYSTERESIS = 0.25  # re-plan when a rate moved this much from what the plan assumed
MAX_GROUP = 8
MIB = float(1 << 20)


@dataclass(frozen=True)
class PoolMember:
    """What the planner needs of one ModelDeployment in a pool: AlpaServe's per-model inputs (§4.2: SLO,
    arrivals, single-device latency, weights) and the GPUs it brings."""

    deployment: str
    model: str
    rate: float
    cv: float
    slo_s: float
    latency_s: float  # single-device, batch 1
    weight_bytes: float
    gpus: int  # what it brings to the pool
    budget_bytes: float  # per-GPU weight budget of its GPUs

    def shape(self) -> tuple[object, ...]:
        """Everything but the rate: a change here always re-plans."""
        return (
            self.deployment,
            self.model,
            self.cv,
            self.slo_s,
            self.latency_s,
            self.weight_bytes,
            self.gpus,
        )


def member_of(rec: ServingRecord, observed_rps: float | None = None) -> PoolMember:
    """The planner's view of a pool member; ServingSpecError when its spec lacks what planning needs.
    Its rate is ``observed_rps`` (the load the pool gateway saw) when known, else ``traffic.expectedRps``."""
    spec = rec.spec
    profile = batch_profile(spec)
    if not profile or profile[0][0] != 1:
        raise ServingSpecError(
            "a pool member needs its batch-1 latency: latencyProfiles or latencyModel perBatchSize with batch 1"
        )
    slo_ms = resolve_slo_ms(spec, profile, {})
    gpu = spec.gpu
    budget_mib = gpu.lane.memory_mib if gpu.lane is not None else gpu.gpu_memory_mib - gpu.reserved_mib
    weights = spec.memory.static_mib if spec.memory is not None else 0
    return PoolMember(
        deployment=rec.name,
        model=spec.model.name,
        rate=observed_rps if observed_rps is not None else spec.traffic.expected_rps,
        cv=spec.traffic.cv,
        slo_s=slo_ms / 1000.0,
        latency_s=profile[0][1] / 1000.0,
        weight_bytes=weights * MIB,
        gpus=spec.replicas * spec.gpus_per_replica,
        budget_bytes=budget_mib * MIB,
    )


@dataclass(frozen=True)
class GroupPlan:
    id: str
    pp: int
    op: int
    models: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return self.pp * self.op


@dataclass(frozen=True)
class PoolPlan:
    """The planner's answer: the paper's placement (groups, config per group, models per group) with the
    simulated attainment per model (AlpaServe §4.2)."""

    pool: str
    groups: tuple[GroupPlan, ...]
    predicted: dict[str, float]  # model → simulated attainment in [0, 1]
    attainment: float
    synthetic: bool
    members: tuple[PoolMember, ...]
    devices_per_node: int
    search_seconds: float
    stage_latency_s: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # group → model → stages

    def groups_of(self, model: str) -> list[GroupPlan]:
        return [g for g in self.groups if model in g.models]

    def digest(self) -> str:
        doc = [(g.id, g.pp, g.op, g.models) for g in self.groups]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:12]


def group_sizes(devices_per_node: int) -> tuple[int, ...]:
    top = max(1, min(MAX_GROUP, devices_per_node))
    return tuple(1 << i for i in range(top.bit_length()) if (1 << i) <= top)


def workload(members: Sequence[PoolMember], seed: int = 0) -> Workload:
    """Gamma arrivals per member (gaps of shape 1/cv², scale cv²/rate: mean 1/rate, CV cv), one generator
    per model."""
    total = sum(m.rate for m in members)
    duration = min(600.0, max(60.0, 3000.0 / total)) if total > 0 else 60.0
    streams: dict[str, np.ndarray] = {}
    for i, m in enumerate(members):
        if m.rate <= 0:
            streams[m.model] = np.zeros(0)
            continue
        rng = np.random.default_rng(seed + i)
        shape, scale = 1.0 / m.cv**2, m.cv**2 / m.rate
        n = int(m.rate * duration * 1.5) + 16
        t = np.cumsum(rng.gamma(shape, scale, n))
        streams[m.model] = t[t < duration]
    return Workload.from_streams(streams, {m.model: m.slo_s for m in members})


def plan_pool(
    pool: str, members: Sequence[PoolMember], devices_per_node: int, seed: int = 0, max_op: int = 1
) -> PoolPlan:
    """AlpaServe's placement for the pool's members on the GPUs they bring. ``max_op`` is 1 by default:
    the workers run inter-op stages (``PipelinedModel``) but no intra-op sharding, so the plan must not
    count on a speed-up the data plane cannot give."""
    if not members:
        raise ServingSpecError(f"pool {pool} has no members")
    models = [m.model for m in members]
    dup = sorted({m for m in models if models.count(m) > 1})
    if dup:
        raise ServingSpecError(f"pool {pool}: model names must be unique in a pool, repeated: {dup}")
    sizes = group_sizes(devices_per_node)
    opts = SearchOptions(
        max_pp=max(sizes), max_op=min(max_op, max(sizes)), devices_per_node=max(sizes), group_sizes=sizes
    )
    configs = all_configs(opts.max_pp, opts.max_op)
    profiles = [synthetic_profile(m.model, m.latency_s, m.weight_bytes, configs) for m in members]
    devices = sum(m.gpus for m in members)
    budget = min(m.budget_bytes for m in members)
    w = workload(members, seed)
    start = time.perf_counter()
    result = place(profiles, devices, w, budget, opts)
    seconds = time.perf_counter() - start
    by_name = {p.name: p for p in profiles}
    stats = evaluate(result.placement, by_name, w).stats
    req, good = stats.per_model_requests(), stats.per_model_good()
    predicted = {name: (float(good[i] / req[i]) if req[i] else 1.0) for i, name in enumerate(w.model_names)}
    groups = tuple(
        GroupPlan(f"{pool}-g{i}", g.config.pp, g.config.op, tuple(sorted(g.models)))
        for i, g in enumerate(result.placement.groups)
    )
    stages = {
        gp.id: {m: list(by_name[m].stages(g.config).stage_latency_s) for m in gp.models}
        for gp, g in zip(groups, result.placement.groups, strict=True)
    }
    return PoolPlan(
        pool, groups, predicted, result.attainment, any(p.synthetic for p in profiles),
        tuple(members), devices_per_node, seconds, stages,
    )  # fmt: skip


def replan_reason(plan: PoolPlan | None, members: Sequence[PoolMember], devices_per_node: int) -> str | None:
    """Why the pool needs a new plan, or None to keep the current one (the hysteresis)."""
    if plan is None:
        return "no plan yet"
    if devices_per_node != plan.devices_per_node:
        return f"GPUs per node {plan.devices_per_node} → {devices_per_node}"
    old = {m.deployment: m for m in plan.members}
    new = {m.deployment: m for m in members}
    if set(old) != set(new):
        return f"members {sorted(old)} → {sorted(new)}"
    for name, m in new.items():
        o = old[name]
        if m.shape() != o.shape():
            return f"{name}: SLO, profile, CV or GPUs changed"
        if abs(m.rate - o.rate) > RATE_HYSTERESIS * max(o.rate, 1e-9) and not (m.rate == o.rate == 0):
            return f"{name}: rate {o.rate:g} → {m.rate:g} rps (> {RATE_HYSTERESIS:.0%})"
    return None


ENV_STAGES = "TESSERA_PIPELINE_STAGES"  # a pool worker runs each model in this many pipeline stages
ENV_GROUP = "TESSERA_POOL_GROUP"


def allocate(groups: Sequence[GroupPlan], free_by_node: dict[str, list[str]]) -> dict[str, list[str]]:
    """GPUs for each group, all on one node: widest groups first, each on the node with the fewest free
    GPUs that still fit it (best fit keeps whole nodes for wide groups). Groups that do not fit are
    left out (they wait for GPUs)."""
    free = {n: list(gs) for n, gs in free_by_node.items()}
    out: dict[str, list[str]] = {}
    for g in sorted(groups, key=lambda g: (-g.gpus, g.id)):
        nodes = sorted((n for n, gs in free.items() if len(gs) >= g.gpus), key=lambda n: (len(free[n]), n))
        if not nodes:
            continue
        out[g.id] = free[nodes[0]][: g.gpus]
        free[nodes[0]] = free[nodes[0]][g.gpus :]
    return out


# Life of a group across re-placements: new groups come up, routing switches to them, then the old ones
# drain, so a re-plan cuts off no request in flight.
STARTING = "Starting"  # in the new plan, worker being brought up; not routed yet
ACTIVE = "Active"  # routed
RETIRING = "Retiring"  # left out of the new plan, still routed until the new groups run
DRAINING = "Draining"  # out of routing; its worker goes once the gateway has nothing in flight there
DRAIN_TIMEOUT_S = 60.0  # when the gateway cannot say, a draining group's worker goes after this long


@dataclass
class GroupEntry:
    plan: GroupPlan
    stages: dict[str, list[float]]
    state: str
    gpus: list[str] | None = None
    since: float = 0.0  # when it entered its state


@dataclass
class PoolState:
    """A pool's current plan and its groups: those of the plan and those of earlier plans on their way out."""

    namespace: str
    plan: PoolPlan
    groups: dict[str, GroupEntry]
    owner: str  # the member whose Owner creates the pool's pods (every member is among their owners)
    revision: int = 0
    reason: str = ""

    @classmethod
    def first(cls, namespace: str, plan: PoolPlan, owner: str, reason: str) -> PoolState:
        st = cls(namespace, plan, {}, owner, 0, reason)
        st._adopt(plan, 0.0)
        return st

    @property
    def name(self) -> str:
        return self.plan.pool

    @property
    def workers_service(self) -> str:
        return self.name + POOL_SUFFIX + "-workers"

    @property
    def placed(self) -> dict[str, list[str]]:
        return {i: e.gpus for i, e in self.groups.items() if e.gpus}

    def held(self) -> set[str]:
        return {g for e in self.groups.values() for g in e.gpus or ()}

    def _adopt(self, plan: PoolPlan, now: float) -> None:
        """Take ``plan`` as the target: a group equal to a live one (same pp, op, models) keeps it (its id,
        GPUs and worker); the rest start under ids of this revision; live groups left out retire."""
        live = [e for e in self.groups.values() if e.state in (STARTING, ACTIVE)]
        kept: list[GroupPlan] = []
        stages: dict[str, dict[str, list[float]]] = {}
        for i, g in enumerate(plan.groups):
            twin = next(
                (e for e in live if (e.plan.pp, e.plan.op, e.plan.models) == (g.pp, g.op, g.models)), None
            )
            if twin is not None:
                live.remove(twin)
                kept.append(twin.plan)
                stages[twin.plan.id] = twin.stages = plan.stage_latency_s[g.id]
                continue
            gid = f"{plan.pool}-g{i}" if self.revision == 0 else f"{plan.pool}-r{self.revision}-g{i}"
            kept.append(GroupPlan(gid, g.pp, g.op, g.models))
            stages[gid] = plan.stage_latency_s[g.id]
            self.groups[gid] = GroupEntry(kept[-1], stages[gid], STARTING, None, now)
        for e in live:  # left out of the new plan
            if e.state == STARTING:  # never routed: nothing to drain
                del self.groups[e.plan.id]
            else:
                e.state, e.since = RETIRING, now
        self.plan = PoolPlan(
            plan.pool, tuple(kept), plan.predicted, plan.attainment, plan.synthetic, plan.members,
            plan.devices_per_node, plan.search_seconds, stages,
        )  # fmt: skip

    def replace(self, plan: PoolPlan, now: float, reason: str) -> None:
        self.revision += 1
        self.reason = reason
        self._adopt(plan, now)

    def step(
        self, free_by_node: dict[str, list[str]], running: set[str], drained: set[str], now: float
    ) -> None:
        """One pass of the switch: place starting groups on free GPUs; once every starting group is placed
        and its worker runs, route to them and drain the retiring ones (at once while no routed group's
        worker runs: nothing is served yet);
        retiring groups drain early when a starting group finds no GPUs (their GPUs are needed);
        draining groups go once ``drained`` (the gateway: out of routing, nothing in flight) says so or
        after ``DRAIN_TIMEOUT_S``."""
        waiting = [e.plan for e in self.groups.values() if e.state == STARTING and not e.gpus]
        for gid, gpus in allocate(waiting, free_by_node).items():
            self.groups[gid].gpus = gpus
        starting = [e for e in self.groups.values() if e.state == STARTING]
        retiring = [e for e in self.groups.values() if e.state == RETIRING]
        # Nothing serves yet (first plan, or no routed group's worker runs): no traffic to protect.
        first = not any(e.state in (ACTIVE, RETIRING) and e.plan.id in running for e in self.groups.values())
        if (
            starting
            and all(e.gpus for e in starting)
            and (first or all(e.plan.id in running for e in starting))
        ):
            for e in starting:
                e.state, e.since = ACTIVE, now
            for e in retiring:
                e.state, e.since = DRAINING, now
        elif any(not e.gpus for e in starting):
            for e in retiring:
                e.state, e.since = DRAINING, now
        for gid, e in list(self.groups.items()):
            if e.state == DRAINING and (gid in drained or now - e.since >= DRAIN_TIMEOUT_S):
                del self.groups[gid]

    def routed(self) -> list[GroupEntry]:
        return [e for e in self.groups.values() if e.state in (ACTIVE, RETIRING) and e.gpus]

    def pod_plans(self, labels: dict[str, str], workload: str) -> list[PodPlan]:
        """One worker per placed group: a gang of its GPUs on one node, loading every model of the group."""
        out = []
        for e in sorted(self.groups.values(), key=lambda e: e.plan.id):
            if not e.gpus:
                continue
            g = e.plan
            out.append(
                PodPlan(
                    node=split_gpu_id(e.gpus[0])[0],
                    gpu_indices=tuple(split_gpu_id(x)[1] for x in e.gpus),
                    labels={**labels, POOL_LABEL: self.name},
                    env={
                        contract.ENV_MODEL: ",".join(g.models),
                        contract.ENV_REPLICA: g.id,
                        ENV_GROUP: g.id,
                        ENV_STAGES: str(g.pp),
                    },
                    workload=workload,
                    base=g.id,
                )
            )
        return out

    def worker_url(self, pod_name: str) -> str:
        return f"http://{pod_name}.{self.workers_service}.{self.namespace}.svc:{WORKER_PORT}"

    def gateway_config(self, labels: dict[str, str], workload: str) -> dict[str, object]:
        """The pool gateway's config: the routed groups with their worker, models and profiled stage
        latencies, which the router's shortest-queue choice and admission check use (AlpaServe §4.3). The
        gateway re-reads it (``reload_from``) and switches routing in place."""
        urls = {p.env[ENV_GROUP]: self.worker_url(p.name) for p in self.pod_plans(labels, workload)}
        members = {m.model: m for m in self.plan.members}
        pool = {
            "name": self.name,
            "namespace": self.namespace,
            "reload_from": CONFIG_PATH,
            "models": [
                {"name": m.model, "slo_s": m.slo_s, "deployment": m.deployment}
                for m in sorted(members.values(), key=lambda m: m.model)
            ],
            # A retiring group may still hold a model whose member has left the pool: not routed to.
            "groups": [
                {"id": e.plan.id, "worker": urls[e.plan.id], "pp": e.plan.pp, "op": e.plan.op,
                 "models": {m: e.stages[m] for m in e.plan.models if m in members}}
                for e in sorted(self.routed(), key=lambda e: e.plan.id)
                if any(m in members for m in e.plan.models)
            ],
        }  # fmt: skip
        config: dict[str, object] = {"host": "0.0.0.0", "port": GATEWAY_PORT, "models": [], "pool": pool}
        GatewayConfig.model_validate(config)
        return config

    def gateway_objects(
        self, owners: Sequence[dict[str, object]], image: str, labels: dict[str, str], workload: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """(kind, manifest): the pool gateway's ConfigMap, Deployment and Service, and the workers'
        headless Service, owned by every member (``owner_references``). No config digest on the pod
        template: a new plan is taken in place, not by a rollout that would cut off what is in flight."""
        sel = {POOL_LABEL: self.name, contract.LABEL_ROLE: "gateway"}
        meta = {
            "namespace": self.namespace,
            "labels": {**sel, contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE},
            "ownerReferences": list(owners),
        }
        config = json.dumps(self.gateway_config(labels, workload), sort_keys=True)
        workers = {POOL_LABEL: self.name, contract.LABEL_ROLE: "worker"}
        return gateway_manifests(
            self.name + POOL_SUFFIX, meta, sel, config, image, (self.workers_service, workers)
        )

    def status_plan(self) -> list[dict[str, object]]:
        return [
            {"id": e.plan.id, "gpus": e.plan.gpus, "pp": e.plan.pp, "op": e.plan.op, "models": list(e.plan.models),
             "placed": ",".join(e.gpus) if e.gpus else None, "state": e.state}
            for e in sorted(self.groups.values(), key=lambda e: e.plan.id)
        ]  # fmt: skip


def owner_references(members: Sequence[Owner]) -> list[dict[str, object]]:
    """ownerReferences naming every member of a pool. Kubernetes' garbage collector deletes a dependent
    only once all its owners are gone, so the pool's gateway and workers live while any member does;
    the first member by name is the controller (at most one may be)."""
    return [
        {**o.reference(), "controller": i == 0} for i, o in enumerate(sorted(members, key=lambda o: o.name))
    ]


@dataclass(frozen=True, slots=True)
class PoolConfigOwner(Owner):
    """The pool gateway's ConfigMap as the workers' owner: it is owned by every member, so the workers
    outlive any one member and go (cascading) with the last. A ConfigMap needs no finalizer grant for
    blockOwnerDeletion, which is left off."""

    def reference(self) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }


async def drained_groups(gateway_url: str, draining: set[str]) -> set[str]:
    """Those of ``draining`` the pool gateway at ``gateway_url`` no longer routes to and has nothing in
    flight on (its ``/stats`` ``pool_groups``; a group it no longer lists is drained); empty when it
    cannot be read (the drain timeout then decides)."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{gateway_url}/stats", timeout=aiohttp.ClientTimeout(total=1.0)) as r,
        ):
            doc = await r.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return set()
    groups = doc.get("pool_groups") if isinstance(doc, dict) else None
    if not isinstance(groups, dict):
        return set()
    return {
        gid
        for gid in draining
        if gid not in groups or (not groups[gid].get("routing") and not groups[gid].get("inflight"))
    }


def pool_gateway_url(namespace: str, pool: str) -> str:
    return f"http://{pool}{POOL_SUFFIX}.{namespace}.svc:{SERVICE_PORT}"
