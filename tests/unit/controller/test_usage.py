"""GPUs per namespace and pending pods from the pod view (controller/usage.py)."""

from __future__ import annotations

from tessera.api import contract
from tessera.controller.usage import usage_of, workload_of
from tessera.controller.view import PodInfo


def pod(
    name: str, labels: dict[str, str], gpus: tuple[int, ...] = (0,), phase: str = "Pending", **kw: object
) -> PodInfo:
    return PodInfo("ml", name, labels, "n1" if gpus else None, gpus, phase, False, **kw)  # type: ignore[arg-type]


APP = {contract.LABEL_APP: "a"}
TRIAL = {contract.LABEL_TRIALGROUP: "tg"}
WORKER = {contract.LABEL_MODELDEPLOYMENT: "m", contract.LABEL_ROLE: "worker"}


def test_workload_kinds_and_foreign_pods() -> None:
    assert workload_of(pod("p", APP)) == "training"
    assert workload_of(pod("p", TRIAL)) == "trial"
    assert workload_of(pod("p", WORKER)) == "serving"
    assert (
        workload_of(pod("p", {contract.LABEL_MODELDEPLOYMENT: "m", contract.LABEL_ROLE: "gateway"})) is None
    )
    assert workload_of(pod("p", {})) is None


def test_distinct_gpus_and_pending_counts() -> None:
    u = usage_of(
        [
            pod("a0", APP, (0, 1)),
            pod("a1", APP, (2,), phase="Running"),
            pod("t0", TRIAL, (3,), bound=True),  # bound: waiting on the kubelet, not on a GPU
            pod("t1", TRIAL, (3,), phase="Running"),  # packed on the same GPU: counted once
            pod("done", APP, (4,), phase="Succeeded"),
            pod("x", {}, (5,)),
        ]
    )
    assert u.gpus == {("ml", "training"): 3, ("ml", "trial"): 1}
    assert u.pending == {("ml", "training"): 1}
