"""`Queue`: a team's share of the cluster's GPUs (cluster-scoped).

A Queue guarantees GPUs to the namespaces labelled `tessera.io/queue: <name>`, caps what they may take, and
shares what is left over by weight; queues nest through `parent`. `lendingLimitGPUs` keeps part of the
guarantee out of other queues' reach while the queue does not use it. Every round the GPUs are divided among
queues first (tessera.policy.queues.division), then Themis, Fluid and the serving planner share each queue's
GPUs among its Apps, TrialGroups and ModelDeployments. Objects in namespaces no queue serves belong to the
`default` queue. Rules over several Queues (a parent that exists, no cycle, children's guarantees within
the parent's) are checked by `hierarchy_errors`, which the operator reports on the Queue's Valid condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Literal

from kubernetes.utils.quantity import parse_quantity
from pydantic import Field, field_validator

from tessera.api.base import MAX_GPUS, MAX_SECONDS, Condition, CrossFieldRule, WireModel

DEFAULT_QUEUE = "default"
QUEUE_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PENDING_LIMIT = 50  # pending workloads listed in a Queue's status (the longest waiting); `waiting` counts all
WorkloadKind = Literal["App", "TrialGroup", "ModelDeployment", "Job", "Pod"]
# A Kubernetes quantity ("64", "500m", "256Gi", "1.5e3"): the API server's own grammar, as a string.
QUANTITY = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"


def quantity(value: str) -> Decimal:
    """A quantity field's value as a number (cores for CPU, bytes for memory)."""
    return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]  # the client ships no annotations


class ReclaimSpec(WireModel):
    """How GPUs this queue borrowed are given back when a queue below its guarantee needs them."""

    mode: Literal["atLeaseEnd", "immediate"] = Field(
        default="atLeaseEnd",
        description="atLeaseEnd: borrowed GPUs are not renewed when their lease ends; immediate: they are "
        "taken once the checkpoint grace has passed.",
    )
    min_runtime_seconds: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SECONDS,
        description="Nothing this queue holds is reclaimed before it has run this long.",
    )
    checkpoint_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        le=MAX_SECONDS,
        description="With immediate: seconds a reclaimed workload gets to checkpoint before its GPUs go.",
    )


class BorrowWithinCohortSpec(WireModel):
    """Whether a queue above its guarantee may take GPUs at once from lower-priority holdings of other queues
    that are borrowing too (Kueue's ClusterQueue preemption.borrowWithinCohort)."""

    policy: Literal["Never", "LowerPriority"] = Field(
        default="Never",
        description="Never: above its guarantee the queue gets the rest of its share as leases end. "
        "LowerPriority: it takes it at once from holdings of queues above their share whose reclaim.mode is "
        "immediate, of lower priority than its highest-priority waiting App (after their "
        "reclaim.minRuntimeSeconds, with their reclaim.checkpointGraceSeconds).",
    )
    max_priority_threshold: int | None = Field(
        default=None,
        ge=-(2**31),
        le=2**31 - 1,
        description="With LowerPriority: only holdings of at most this priority are taken; unset: any lower "
        "priority.",
    )


class PreemptionSpec(WireModel):
    """What this queue's waiting work may take before a lease ends (Kueue's ClusterQueue preemption)."""

    reclaim_within_cohort: Literal["Any", "LowerPriority", "Never"] = Field(
        default="Any",
        description="While below its guarantee: what it may take at once from queues lending under "
        "reclaim.mode immediate: Any holding, only those of LowerPriority than its highest-priority waiting "
        "App, or Never (it waits for their leases to end).",
    )
    within_queue: Literal["Never", "LowerPriority"] = Field(
        default="Never",
        description="LowerPriority: a higher-priority App of this queue takes GPUs from its lower-priority Apps "
        "at once (after reclaim.minRuntimeSeconds and with reclaim.checkpointGraceSeconds); Never: as their "
        "leases end.",
    )
    borrow_within_cohort: BorrowWithinCohortSpec = Field(default_factory=BorrowWithinCohortSpec)


class QueueSpec(WireModel):
    """A team's guaranteed GPUs, its maximum, its weight for what is left over, and its parent."""

    guaranteed_gpus: float = Field(
        default=0.0,
        ge=0,
        le=MAX_GPUS,
        description="GPUs the queue gets whenever its work can use them (fractions count lanes).",
    )
    max_gpus: float | None = Field(
        default=None,
        ge=0,
        le=MAX_GPUS,
        description="Most GPUs the queue may hold, borrowed ones included; unset: no limit.",
    )
    lending_limit_gpus: float | None = Field(
        default=None,
        ge=0,
        le=MAX_GPUS,
        description="Most of its guaranteed GPUs other queues may borrow while it does not use them; the "
        "rest of the guarantee stays reserved for it, idle if need be (Kueue's lendingLimit). On a parent: "
        "the most its whole subtree lends outside it. Unset: it may lend all of its unused guarantee.",
    )
    weight: float = Field(
        default=1.0, gt=0, le=1e6, description="Share of the GPUs left over after guarantees, by weight."
    )
    parent: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=QUEUE_NAME,
        description="Parent queue; this queue's guarantee comes out of the parent's.",
    )
    max_gpus_by_model: dict[str, Annotated[int, Field(ge=0, le=MAX_GPUS)]] | None = Field(
        default=None,
        max_length=64,
        description="Most GPUs of each model (as the node inventory names it, e.g. A100) the queue's Apps may "
        "hold at once; a model not named has no cap beyond maxGPUs. Unset: no per-model cap.",
    )
    max_cpu: str | None = Field(
        default=None,
        alias="maxCPU",
        pattern=QUANTITY,
        max_length=64,
        description='Most CPU (a Kubernetes quantity, e.g. "64" or "500m") the queue\'s pods may request '
        "at once: its Apps' pods and the pods admitted through its gate. Unset: no limit.",
    )
    max_memory: str | None = Field(
        default=None,
        pattern=QUANTITY,
        max_length=64,
        description='Most memory (a Kubernetes quantity, e.g. "256Gi") the queue\'s pods may request at once, '
        "counted as maxCPU is. Unset: no limit.",
    )
    reclaim: ReclaimSpec = Field(default_factory=ReclaimSpec)
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)

    @field_validator("max_cpu", "max_memory")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None:
            quantity(v)  # the pattern admits only what parses; this keeps the two in step
        return v

    cross_field_rules = (
        CrossFieldRule(
            cel="!has(self.maxGPUs) || double(self.maxGPUs) >= double(self.guaranteedGPUs)",
            message="maxGPUs must be >= guaranteedGPUs",
            check=lambda s: s.max_gpus is None or s.max_gpus >= s.guaranteed_gpus,
            field_path=".maxGPUs",
        ),
        CrossFieldRule(
            cel="!has(self.lendingLimitGPUs) || double(self.lendingLimitGPUs) <= double(self.guaranteedGPUs)",
            message="lendingLimitGPUs must be <= guaranteedGPUs",
            check=lambda s: s.lending_limit_gpus is None or s.lending_limit_gpus <= s.guaranteed_gpus,
            field_path=".lendingLimitGPUs",
        ),
    )


class GPUsByKind(WireModel):
    """GPUs of a queue by the kind of object that holds them."""

    apps: float = Field(default=0.0, ge=0, description="GPUs its Apps' leases hold.")
    trial_groups: float = Field(default=0.0, ge=0, description="GPUs its TrialGroups' pools hold.")
    model_deployments: float = Field(
        default=0.0,
        ge=0,
        description="GPUs its ModelDeployments' replicas hold (replicas in a shared serving pool count for no "
        "queue).",
    )
    pods: float = Field(
        default=0.0,
        ge=0,
        description="GPUs its admitted pods hold: plain pods and Jobs' pods asking for tessera.io/gpu, admitted "
        "through the queue's scheduling gate (docs/queues.md, Pods and Jobs in a queue).",
    )


class WorkloadsByKind(WireModel):
    """Objects of a queue by kind."""

    apps: int = Field(default=0, ge=0)
    trial_groups: int = Field(default=0, ge=0)
    model_deployments: int = Field(default=0, ge=0)
    pods: int = Field(default=0, ge=0, description="Gated groups: a Job's pods, or a plain pod.")


class PendingWorkload(WireModel):
    """One object of the queue waiting for GPUs, and why."""

    kind: WorkloadKind
    namespace: str
    name: str
    queue: str = Field(
        description="The queue it belongs to: this one, or for a parent's status a queue of its subtree."
    )
    gpus: float = Field(ge=0, description="GPUs it waits for (beyond those it holds).")
    since: str = Field(description="RFC 3339 time it began waiting, as far as this operator has seen.")
    reason: str = Field(
        pattern=r"^[A-Za-z][A-Za-z0-9]*$",
        description="Why it waits: QueueAtMax, QueueModelQuota, QueueCPUQuota, QueueMemoryQuota, NoGPUOfType, Reclaiming, LenderMinRuntime, QueueAtShare, "
        "QueueRoom, NoFreeGPUs, NextRound or, for a Job, WaitingForPods (docs/queues.md).",
    )
    message: str = Field(description="The reason in words, with the numbers and times behind it.")


class OwnUsage(WireModel):
    """A parent queue's own objects (those of the namespaces it serves itself), apart from its children's."""

    share_gpus: float = Field(default=0.0, ge=0, description="GPUs the division entitles its own objects to.")
    allocated_gpus: float = Field(default=0.0, ge=0, description="GPUs its own objects hold.")
    waiting: int = Field(default=0, ge=0, description="Its own objects waiting for GPUs.")


class QueueStatus(WireModel):
    """What the operator reports for a Queue every round. For a queue with children every count is its
    subtree's (its guarantee and maximum are too); `own` keeps its own objects' part."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this status reflects."
    )
    share_gpus: float = Field(
        default=0.0, ge=0, description="GPUs the division entitles the queue (its subtree) to now."
    )
    allocated_gpus: float = Field(
        default=0.0,
        ge=0,
        description="GPUs its objects (its subtree's) hold now: Apps' leases, TrialGroups' pools, "
        "ModelDeployments' replicas, admitted pods.",
    )
    allocated_by_kind: GPUsByKind = Field(
        default_factory=GPUsByKind, description="allocatedGPUs by the kind of object holding them."
    )
    borrowed_gpus: float = Field(
        default=0.0, ge=0, description="GPUs held above its guarantee (by its subtree)."
    )
    lent_gpus: float = Field(
        default=0.0,
        ge=0,
        description="Guaranteed GPUs it does not use now, which other queues may borrow (at most "
        "lendingLimitGPUs).",
    )
    waiting: int = Field(
        default=0,
        ge=0,
        description="Objects of the queue waiting for GPUs, of every kind (kubectl's Pending).",
    )
    waiting_by_kind: WorkloadsByKind = Field(
        default_factory=WorkloadsByKind, description="waiting by the kind of object."
    )
    pending: list[PendingWorkload] = Field(
        default_factory=list,
        max_length=PENDING_LIMIT,
        description=f"The waiting objects that have waited longest (at most {PENDING_LIMIT}; waiting counts "
        "them all), longest first, each with what it waits for and why.",
    )
    own: OwnUsage | None = Field(
        default=None, description="For a queue with children: its own objects' share, GPUs and waiting count."
    )
    max_rho: float | None = Field(
        default=None, ge=0, description="Largest ρ among its Apps (its subtree's) now."
    )
    namespaces: list[str] = Field(default_factory=list, description="Namespaces the queue serves.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Valid: False while the queue breaks a rule over several queues (unknown parent, a cycle, "
        "children guaranteed more than the parent), naming the field.",
    )


def hierarchy_errors(specs: Mapping[str, QueueSpec]) -> dict[str, list[tuple[str, str]]]:
    """Problems that involve several Queues, as (field path, message) per queue name: a parent that does not
    exist, parents forming a cycle, children's guarantees above the parent's, a child guaranteed more than
    the parent's maximum. A queue with no problem is absent."""
    out: dict[str, list[tuple[str, str]]] = {}

    def add(name: str, path: str, msg: str) -> None:
        out.setdefault(name, []).append((path, msg))

    for name, spec in specs.items():
        if name == DEFAULT_QUEUE and spec.parent is not None:
            add(name, "spec.parent", f"the {DEFAULT_QUEUE} queue must be top-level")
        if spec.parent is None:
            continue
        if spec.parent not in specs:
            add(name, "spec.parent", f"queue {spec.parent!r} does not exist")
            continue
        seen = {name}
        p: str | None = spec.parent
        while p is not None and p in specs:
            if p in seen:
                add(name, "spec.parent", f"parents form a cycle through {p!r}")
                break
            seen.add(p)
            p = specs[p].parent
        parent = specs[spec.parent]
        if parent.max_gpus is not None and spec.guaranteed_gpus > parent.max_gpus:
            add(name, "spec.guaranteedGPUs", f"must be <= the parent's maxGPUs {parent.max_gpus:g}")
    for name, spec in specs.items():
        kids = sorted(k for k, s in specs.items() if s.parent == name)
        total = sum(specs[k].guaranteed_gpus for k in kids)
        if kids and total > spec.guaranteed_gpus + 1e-9:
            add(
                name,
                "spec.guaranteedGPUs",
                f"children {', '.join(kids)} are guaranteed {total:g} GPUs in all, above this queue's "
                f"{spec.guaranteed_gpus:g}",
            )
    return out
