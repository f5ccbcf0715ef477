"""What `Ready` means for each kind, computed from the controller's records after a pass.

The same meanings are documented on the status models' `conditions` (tessera.api), which is what users
read. Pods count as created when the pod watch lists them or this controller created them and the watch
has not listed them yet (RecentCreates); a pod being deleted does not count. Messages name what is
missing but nothing that changes every pass, so an unchanged state writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessera.api import contract
from tessera.controller.apps import AppRecord
from tessera.controller.conditions import Cond, Readiness, condition, generation_of, with_ready
from tessera.controller.pods import PodPlan
from tessera.controller.serving import ServingRecord
from tessera.controller.sync import RecentCreates
from tessera.controller.trialgroups import TrialGroupRecord
from tessera.controller.view import PodInfo

ADMITTED_MESSAGE = "bidding in Themis rounds"


def missing_pods(
    plans: Sequence[PodPlan], existing: Sequence[PodInfo], recent: RecentCreates | None, namespace: str
) -> list[PodPlan]:
    """The planned pods that neither the watch lists (alive) nor this controller just created."""
    have = {p.name for p in existing if not p.deleting}
    if recent is not None:
        have |= recent.pending(namespace, {p.name for p in existing}, (p.name for p in plans))
    return [p for p in plans if p.name not in have]


def _gangs(missing: Sequence[PodPlan], gang: Callable[[PodPlan], str]) -> str:
    return ", ".join(sorted({gang(p) for p in missing}))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def app_readiness(rec: AppRecord, missing: Sequence[PodPlan]) -> Readiness:
    """Ready of an admitted App (the arbiter holds it): running on its leases, or done."""
    if rec.done:
        return Readiness(True, "Succeeded", "all jobs completed")
    if not rec.leases:
        return Readiness(
            False,
            "WaitingForGPUs",
            f"admitted; bidding for up to {_plural(rec.demand(), 'GPU')}, no lease yet",
        )
    if missing:
        jobs = _gangs(missing, lambda p: p.labels[contract.LABEL_JOB])
        return Readiness(
            False, "PodsNotCreated", f"pods of job(s) {jobs} not created: see the GangFailed events"
        )
    jobs = ", ".join(sorted(rec.job_gpus()))
    return Readiness(
        True, "Running", f"{_plural(len(rec.held()), 'GPU')} leased to job(s) {jobs}; their pods are created"
    )


def app_conditions(
    rec: AppRecord,
    missing: Sequence[PodPlan],
    previous: Sequence[Mapping[str, Any]] | None,
    queue: Cond | None = None,
) -> dict[str, Any]:
    """observedGeneration and conditions (Admitted, QueueResolved when `queue` is given, Ready) of an App
    the arbiter holds. `previous` is what this operator last wrote; without it (first write, or after a
    restart) what the object holds."""
    if previous is None:
        previous = (rec.body.get("status") or {}).get("conditions") or []
    gen = generation_of(rec.body)
    own = [condition("Admitted", True, "Admitted", ADMITTED_MESSAGE, generation=gen)]
    if queue is not None:
        own.append(queue if gen is None else {**queue, "observedGeneration": gen})
    out: dict[str, Any] = {"conditions": with_ready(own, app_readiness(rec, missing), gen, previous)}
    if gen is not None:
        out["observedGeneration"] = gen
    return out


def trialgroup_readiness(rec: TrialGroupRecord, missing: Sequence[PodPlan]) -> Readiness:
    """Ready of a TrialGroup: pool held, trials planned by Fluid, their pods created; or every trial ended."""
    if rec.done:
        return Readiness(True, "Succeeded", f"all {_plural(len(rec.spec.trials), 'trial')} ended")
    if not rec.pool:
        return Readiness(False, "WaitingForGPUs", "waiting for free GPUs for the group's pool")
    if rec.placement is None:
        return Readiness(False, "NotPlanned", "no Fluid plan yet: see the Planned condition")
    if missing:
        trials = _gangs(missing, lambda p: p.labels[contract.LABEL_TRIAL])
        return Readiness(
            False, "PodsNotCreated", f"pods of trial(s) {trials} not created: see the GangFailed events"
        )
    queued = [t.name for t in rec.live() if t.name in rec.placement.queued]
    planned = len(rec.live()) - len(queued)
    tail = f"; {len(queued)} queued" if queued else ""
    return Readiness(
        True,
        "Running",
        f"{_plural(planned, 'trial')} planned on {_plural(len(rec.pool), 'GPU')}, pods created{tail}",
    )


def deployment_readiness(rec: ServingRecord, wanted: int, missing: Sequence[PodPlan]) -> Readiness:
    """Ready of a ModelDeployment: the wanted replicas placed, their workers created, the gateway applied
    (the controller calls this only after a pass that applied the gateway objects)."""
    placed = len(rec.gpus)
    if placed < wanted:
        return Readiness(
            False, "WaitingForGPUs", f"{placed} of {_plural(wanted, 'replica')} placed: waiting for free GPUs"
        )
    if missing:
        replicas = _gangs(missing, lambda p: p.env[contract.ENV_REPLICA])
        return Readiness(
            False,
            "PodsNotCreated",
            f"worker pods of replica(s) {replicas} not created: see the GangFailed events",
        )
    gpus = sum(len(g) for g in rec.gpus)
    return Readiness(
        True,
        "Serving",
        f"{_plural(placed, 'replica')} on {_plural(gpus, 'GPU')}; gateway and workers created",
    )
