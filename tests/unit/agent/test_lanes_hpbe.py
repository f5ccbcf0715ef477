"""HP/BE lanes on the node agent: class, MPS env per class, memory admission, one HP per GPU."""

from __future__ import annotations

import pytest
from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera_agent.config import AgentConfig
from tessera_agent.kubelet.allocate import AllocateRequestError, container_allocation
from tessera_agent.lanes.book import LaneAdmissionError, LaneBook, lane_class
from tessera_agent.pods import NodePod, pod_info_from_manifest

U0, U1 = "GPU-aaaa", "GPU-bbbb"
CFG = AgentConfig(node_name="n")


def pod(name: str, workload: str = "", mem: int = 4096, compute: int = 60, gpus: tuple[str, ...] = (U0,),
        priority_class: str = "", checkpoints: bool = False) -> NodePod:  # fmt: skip
    a = Assignment(
        node="n", gpu_uuids=list(gpus), lane_id=f"lane-{name}", memory_mib=mem, compute_percent=compute
    )
    return NodePod("ns", name, f"uid-{name}", "2026-01-01T00:00:00Z", (len(gpus),), a,
                   workload=workload, priority_class=priority_class, checkpoints=checkpoints)  # fmt: skip


def test_class_from_annotation_then_priority_class() -> None:
    assert lane_class(pod("a", "serving:latency-critical")) == "HP"
    assert lane_class(pod("b", "training:best-effort", priority_class="latency-critical")) == "BE"
    assert lane_class(pod("c", "training", priority_class="latency-critical")) == "HP"
    assert lane_class(pod("d", "training", priority_class="prod-serving"), ["prod-serving"]) == "HP"
    assert lane_class(pod("e")) == "BE"
    with pytest.raises(LaneAdmissionError, match="class must be"):
        lane_class(pod("f", "serving:urgent"))


def test_manifest_fields_reach_pod_info() -> None:
    p = pod_info_from_manifest(
        {
            "metadata": {
                "namespace": "ns",
                "name": "x",
                "annotations": {
                    contract.ANN_WORKLOAD: "serving:latency-critical",
                    contract.ANN_CHECKPOINTS: "true",
                },
            },
            "spec": {"priorityClassName": "latency-critical", "containers": []},
        }
    )
    assert (p.workload, p.priority_class, p.checkpoints) == (
        "serving:latency-critical",
        "latency-critical",
        True,
    )


def test_hp_and_be_env() -> None:
    book = LaneBook({U0: 16000}, default_be_percent=40)
    hp = container_allocation(pod("hp", "serving:latency-critical", compute=50), CFG, book).envs
    assert hp[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "100"
    assert hp[contract.ENV_MPS_CLIENT_PRIORITY] == "0"
    assert hp[contract.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=4096M"
    be = container_allocation(pod("be", "training:best-effort", compute=60), CFG, book).envs
    assert be[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "40"  # p_be, below the assigned 60
    assert be[contract.ENV_MPS_CLIENT_PRIORITY] == "1"
    small = container_allocation(pod("be2", "training:best-effort", compute=25), CFG, book).envs
    assert small[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "25"  # never above the assigned share
    book.set_be_percent(U0, 20)
    be3 = container_allocation(pod("be3", "trial:best-effort", mem=1000, compute=60), CFG, book).envs
    assert be3[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "20"


def test_without_a_book_env_is_unchanged() -> None:
    envs = container_allocation(pod("x", "serving:latency-critical", compute=50), CFG).envs
    assert envs[contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "50"
    assert contract.ENV_MPS_CLIENT_PRIORITY not in envs


def test_at_most_one_hp_per_gpu() -> None:
    book = LaneBook({U0: 16000, U1: 16000})
    container_allocation(pod("hp1", "serving:latency-critical"), CFG, book)
    with pytest.raises(AllocateRequestError, match="already has a high-priority lane"):
        container_allocation(pod("hp2", "serving:latency-critical"), CFG, book)
    container_allocation(pod("hp3", "serving:latency-critical", gpus=(U1,)), CFG, book)  # other GPU: fine
    with pytest.raises(AllocateRequestError, match="already has a high-priority lane"):
        container_allocation(pod("hp4", "serving:latency-critical", gpus=(U1, U0)), CFG, book)
    assert {ln.pod for ln in book.lanes.values()} == {"ns/hp1", "ns/hp3"}  # a refusal records nothing


def test_memory_admission_never_exceeds_usable() -> None:
    book = LaneBook({U0: 10000})
    container_allocation(pod("a", mem=6000), CFG, book)
    container_allocation(pod("b", mem=4000), CFG, book)  # exactly full: allowed
    with pytest.raises(AllocateRequestError, match="over the 10000 MiB usable"):
        container_allocation(pod("c", mem=1), CFG, book)
    assert sum(ln.memory_mib for ln in book.on_gpu(U0)) == 10000
    dropped = book.sync(["uid-b"])  # pod a is gone
    assert [ln.pod for ln in dropped] == ["ns/a"]
    container_allocation(pod("c", mem=6000), CFG, book)
    container_allocation(pod("b", mem=4000), CFG, book)  # re-admitting the same pod does not double-count


def test_unknown_gpu_and_bad_percent() -> None:
    with pytest.raises(AllocateRequestError, match="not on this node"):
        container_allocation(pod("a", gpus=("GPU-zzz",)), CFG, LaneBook({U0: 1000}))
    with pytest.raises(ValueError, match=r"1\.\.100"):
        LaneBook({U0: 1000}).set_be_percent(U0, 0)
