"""What a round costs must not grow as Apps × GPUs. At 5,000 kwok nodes (26,000 GPUs) the arbiter spent
half of each arrival round in `_export`, which listed every GPU of the cluster once per App."""

from __future__ import annotations

import json

import pytest
from tessera.api import contract
from tessera.cluster import Cluster
from tessera.controller.apps import record_from_body
from tessera.controller.arbiter import Arbiter
from tessera.controller.config import OperatorConfig
from tessera.controller.context import Context
from tessera.controller.metrics import operator_metrics
from tessera.controller.view import ClusterView

from tests.unit.controller.test_leases import body, job

T0 = 1_700_000_000.0


def test_exporting_rho_lists_the_clusters_gpus_once_not_once_per_app(monkeypatch: pytest.MonkeyPatch) -> None:
    view = ClusterView()
    for n in range(4):
        inv = [{"uuid": f"n{n}-{i}", "index": i, "memoryMiB": 16384} for i in range(8)]
        view.on_node(
            {"metadata": {"name": f"n{n}", "annotations": {contract.ANN_NODE_GPUS: json.dumps(inv)}}}
        )
    arbiter = Arbiter(
        Context(OperatorConfig(clock=lambda: T0), view, None, operator_metrics(), lambda *_: None)
    )  # type: ignore[arg-type]  # no API call here
    cluster = view.cluster()
    for i in range(30):
        raw = body([job("j", 1)])
        raw["metadata"] = {"name": f"a{i:02d}", "namespace": "ml", "uid": f"u-{i}"}
        rec = record_from_body(raw, T0)
        rec.grant([cluster.gpu_ids[i]], T0 + 600, "auction", cluster)
        arbiter.upsert(rec)
    listed = 0
    real = Cluster.gpu_ids.fget
    assert real is not None

    def counted(self: Cluster) -> list[str]:
        nonlocal listed
        listed += 1
        return real(self)

    monkeypatch.setattr(Cluster, "gpu_ids", property(counted))
    arbiter._export(T0 + 60, cluster)
    assert all(r.rho is not None for r in arbiter.records.values())
    assert listed <= 1
