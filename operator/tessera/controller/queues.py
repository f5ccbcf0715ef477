"""Team queues in the operator: which Queue each namespace's objects belong to (the namespace label
`tessera.io/queue`), the queues as the division sees them, and each Queue's status and metrics.

The division itself lives in tessera.policy.queues; this module only keeps the cluster's Queues and
Namespaces in step and reports. A namespace whose label names no existing Queue — or whose Queue was
deleted — belongs to `default`; its App, TrialGroup and ModelDeployment objects say so in their
QueueResolved condition (`membership`) and get a Warning event when it turns False (`membership_news`).
A Queue that breaks a rule over several Queues fails closed (`nodes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api import contract
from tessera.api.queue import DEFAULT_QUEUE, QueueSpec, QueueStatus, hierarchy_errors
from tessera.controller.conditions import Cond, condition, find
from tessera.controller.queue_status import FIELD_KINDS, Part, RoundFacts, Workload, summary
from tessera.metrics import ComponentMetrics
from tessera.policy.queues import QueueNode, ReclaimRule

QUEUE_RESOLVED = "QueueResolved"  # the condition type on the objects of a namespace with the queue label

_GAUGES = (
    "guaranteed_gpus",
    "share_gpus",
    "allocated_gpus",
    "borrowed_gpus",
    "lent_gpus",
    "waiting",
    "max_rho",
)


@dataclass
class QueueBook:
    specs: dict[str, QueueSpec] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # namespace → the queue its label names

    # --- keeping in step ---------------------------------------------------------------------------------

    def set_queue(self, name: str, spec: QueueSpec, uid: str = "") -> None:
        self.specs[name] = spec
        self.uids[name] = uid

    def remove_queue(self, name: str, metrics: ComponentMetrics | None = None) -> list[str]:
        """Forget a deleted Queue (and its series); returns the namespaces that now belong to default."""
        self.specs.pop(name, None)
        self.uids.pop(name, None)
        if metrics is not None:
            metrics.remove_series(queue=name)
        return sorted(ns for ns, q in self.labels.items() if q == name)

    def set_namespace(self, namespace: str, labels: Mapping[str, str] | None) -> None:
        q = (labels or {}).get(contract.LABEL_QUEUE)
        if q:
            self.labels[namespace] = q
        else:
            self.labels.pop(namespace, None)

    def remove_namespace(self, namespace: str) -> None:
        self.labels.pop(namespace, None)

    # --- reading -----------------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether any Queue exists (without one, every object shares the whole cluster as before)."""
        return bool(self.specs)

    def queue_of(self, namespace: str) -> str:
        q = self.labels.get(namespace)
        return q if q is not None and q in self.specs else DEFAULT_QUEUE

    def membership(self, namespace: str, generation: int | None = None) -> Cond | None:
        """The QueueResolved condition of an object of `namespace`: True (QueueFound) when the namespace's
        label names a Queue that exists (or `default`), False (QueueNotFound) when it names one that does
        not, so its objects are in `default`; None when the namespace has no label (it asks for no queue).
        The messages depend on the namespace and its label only, so they do not change between passes."""
        label = self.labels.get(namespace)
        if label is None:
            return None
        said = f"namespace {namespace} is labelled {contract.LABEL_QUEUE}={label}"
        if label in self.specs or label == DEFAULT_QUEUE:
            return condition(
                QUEUE_RESOLVED, True, "QueueFound", f"{said}: in queue {label}", generation=generation
            )
        return condition(
            QUEUE_RESOLVED,
            False,
            "QueueNotFound",
            f"{said}, but no Queue {label} exists: in queue {DEFAULT_QUEUE} until that Queue is created or "
            "the label is changed",
            generation=generation,
        )

    def invalid(self) -> set[str]:
        """Queues that break a rule over several Queues (Valid=False until fixed)."""
        return set(hierarchy_errors(self.specs))

    def nodes(self) -> list[QueueNode]:
        """The queues as the division sees them. An invalid queue fails closed: it stays in the division with
        no guarantee (one that breaks the rules cannot be honoured) but with its maximum, and its children
        stay under it, so the subtree never holds more than that maximum. (Dropping it made its children
        top-level queues with no cap: children of a 6-maximum parent got 9 GPUs of 16.) Only a parent that
        does not exist, or a link that closes a cycle, is cut: such a queue is divided as a top-level one.
        A queue's lending limit goes with its guarantee (an invalid queue reserves nothing)."""
        bad = self.invalid()
        parent = {name: s.parent if s.parent in self.specs else None for name, s in self.specs.items()}
        for name in sorted(parent):  # cut each cycle at the first of its queues met in name order
            seen = {name}
            p = parent[name]
            while p is not None:
                if p in seen:
                    parent[name] = None
                    break
                seen.add(p)
                p = parent[p]
        return [
            QueueNode(
                name,
                0.0 if name in bad else s.guaranteed_gpus,
                math.inf if s.max_gpus is None else s.max_gpus,
                s.weight,
                parent[name],
                math.inf if name in bad or s.lending_limit_gpus is None else s.lending_limit_gpus,
            )
            for name, s in sorted(self.specs.items())
        ]

    def rules(self) -> dict[str, ReclaimRule]:
        return {
            name: ReclaimRule(
                s.reclaim.mode,
                s.reclaim.min_runtime_seconds,
                s.reclaim.checkpoint_grace_seconds,
                s.preemption.reclaim_within_cohort,
                s.preemption.within_queue,
                s.preemption.borrow_within_cohort.policy,
                s.preemption.borrow_within_cohort.max_priority_threshold,
            )
            for name, s in self.specs.items()
        }

    def model_caps(self) -> dict[str, dict[str, int]]:
        """Queue → GPU model → the most GPUs of that model its Apps may hold (`maxGPUsByModel`)."""
        return {name: dict(s.max_gpus_by_model) for name, s in self.specs.items() if s.max_gpus_by_model}

    def namespaces(self, queue: str) -> list[str]:
        return sorted(ns for ns in self.labels if self.queue_of(ns) == queue)

    def status(
        self,
        name: str,
        workloads: Iterable[Workload],
        share: float,
        facts: RoundFacts | None = None,
        max_rho: float | None = None,
        generation: int | None = None,
    ) -> QueueStatus:
        """One Queue's status from its own objects (`workloads`: those of its namespaces) and own share,
        as if its children had none (`statuses` counts their subtrees)."""
        rho = {name: max_rho} if max_rho is not None else {}
        st = self.statuses({name: list(workloads)}, {name: share}, facts, rho, only=name)[name]
        return st.model_copy(update={"observed_generation": generation}) if generation is not None else st

    def statuses(
        self,
        by_queue: Mapping[str, Sequence[Workload]],
        shares: Mapping[str, float],
        facts: RoundFacts | None = None,
        max_rho: Mapping[str, float] | None = None,
        only: str | None = None,
    ) -> dict[str, QueueStatus]:
        """Every Queue's status (or `only` one's) from each queue's own objects (`by_queue`), own shares
        (`shares`), what the round knows about waits (`facts`) and the largest ρ among each queue's own
        Apps. A parent's counts are its subtree's, as its guarantee and maximum are (`own`: its own)."""
        kids: dict[str, list[str]] = {}
        for n in self.nodes():  # the tree the division uses (links that close a cycle cut)
            if n.parent is not None:
                kids.setdefault(n.parent, []).append(n.name)
        below: dict[str, list[str]] = {}

        def subtree(q: str) -> list[str]:  # the queues below q, depth first
            if q not in below:
                below[q] = [d for c in kids.get(q, []) for d in (c, *subtree(c))]
            return below[q]

        own_held = {q: sum(w.held for w in ws) for q, ws in by_queue.items()}
        held = {
            q: own_held.get(q, 0.0) + sum(own_held.get(d, 0.0) for d in subtree(q))
            for q in {*self.specs, *by_queue}
        }
        rho = max_rho or {}
        out: dict[str, QueueStatus] = {}
        for name in sorted(self.specs) if only is None else [only]:
            spec = self.specs.get(name, QueueSpec())
            parts = [
                Part(d, self.specs[d], by_queue.get(d, ()), shares.get(d, 0.0))
                for d in subtree(name)
                if d in self.specs
            ]
            rhos = [rho[q] for q in (name, *subtree(name)) if q in rho]
            out[name] = self._status(
                name,
                spec,
                summary(name, spec, by_queue.get(name, ()), shares.get(name, 0.0), facts, parts, held),
                max(rhos) if rhos else None,
            )
        return out

    def _status(
        self, name: str, spec: QueueSpec, counts: Mapping[str, Any], max_rho: float | None
    ) -> QueueStatus:
        errors = hierarchy_errors(self.specs).get(name, [])
        cond = {
            "type": "Valid",
            "status": "False" if errors else "True",
            "reason": "InvalidHierarchy" if errors else "Valid",
            "message": (
                "; ".join(f"{p}: {m}" for p, m in errors)
                + " (until fixed: no guarantee, its maximum still caps it and its children)"
                if errors
                else "the queue takes part in the division"
            ),
        }
        return QueueStatus.model_validate(
            {
                **counts,
                "maxRho": max_rho,
                "namespaces": self.namespaces(name),
                "conditions": [cond],
            }
        )

    def export(self, metrics: ComponentMetrics, name: str, status: QueueStatus) -> None:
        spec = self.specs.get(name, QueueSpec())
        values = {
            "guaranteed_gpus": spec.guaranteed_gpus,
            "share_gpus": status.share_gpus,
            "allocated_gpus": status.allocated_gpus,
            "borrowed_gpus": status.borrowed_gpus,
            "lent_gpus": status.lent_gpus,
            "waiting": float(status.waiting),
            "max_rho": status.max_rho if status.max_rho is not None else 0.0,
        }
        for g in _GAUGES:
            metrics.gauge(f"tessera_queue_{g}").labels(queue=name).set(values[g])
        allocated = status.allocated_by_kind.model_dump(by_alias=True)
        waiting = status.waiting_by_kind.model_dump(by_alias=True)
        for key, kind in FIELD_KINDS.items():
            metrics.gauge("tessera_queue_kind_allocated_gpus").labels(queue=name, kind=kind).set(
                allocated[key]
            )
            metrics.gauge("tessera_queue_pending").labels(queue=name, kind=kind).set(waiting[key])


def membership_news(
    new: Mapping[str, Any] | None, previous: Sequence[Mapping[str, Any]] | None
) -> tuple[str, str, str] | None:
    """The event (type, reason, message) an object's QueueResolved condition calls for when it goes from
    what `previous` holds to `new`: a Warning (QueueNotFound) when it turns False or names another missing
    queue, a Normal one (QueueResolved) when a False one turns True or goes with the label; else None, so
    passes that find nothing new post nothing."""
    old = find(previous, QUEUE_RESOLVED)
    was_missing = old is not None and old.get("status") == "False"
    if new is not None and new.get("status") == "False":
        if was_missing and old is not None and old.get("message") == new.get("message"):
            return None
        return "Warning", "QueueNotFound", str(new.get("message", ""))
    if not was_missing:
        return None
    if new is None:
        return "Normal", "QueueResolved", f"the namespace no longer names a queue: in queue {DEFAULT_QUEUE}"
    return "Normal", "QueueResolved", str(new.get("message", ""))


def owner_id(kind: str, namespace: str, name: str) -> str:
    """How a TrialGroup or ModelDeployment is named as a holder in a queue's reclaim plan."""
    return f"{kind}/{namespace}/{name}"
