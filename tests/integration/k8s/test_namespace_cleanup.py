"""The harness's namespace teardown on the real API server: a test's Tessera objects do not outlive it.

Each real-cluster test runs its own operator, watching the whole cluster. Objects a test left with the
operator's finalizer kept their namespace Terminating until the next test's operator came by, which then
admitted such an App and leased it GPUs of its own node before the namespace controller deleted it: in a
CI-like run a TrialGroup's pod was never bound, and the log showed `Admitted` and pod creates refused in
the earlier test's Terminating namespace."""

from __future__ import annotations

import secrets

from tessera.api import contract

from .conftest import TESSERA_PLURALS, delete_namespace
from .controlplane import ControlPlane, wait_until


def test_a_deleted_namespace_takes_its_finalized_tessera_objects_with_it(crds: ControlPlane) -> None:
    cluster = crds
    ns = f"t-{secrets.token_hex(4)}"
    status, body = cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    assert status == 201, body
    base = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}"
    job = {"name": "j1", "iterTotal": 10, "iterTimeSerialSeconds": 1.0, "maxGPUs": 1}
    spec = {"template": {"spec": {"containers": [{"name": "main", "image": "trainer:1"}]}}, "jobs": [job]}
    app = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_APP,
        # As the operator leaves it: its finalizer on, no operator running any more.
        "metadata": {"name": "left", "finalizers": [contract.FINALIZER]},
        "spec": spec,
    }
    status, body = cluster.request("POST", f"{base}/{contract.PLURAL_APP}", app)
    assert status == 201, body

    delete_namespace(cluster, ns)

    wait_until(
        lambda: cluster.request("GET", f"/api/v1/namespaces/{ns}")[0] == 404, 120, f"namespace {ns} gone"
    )
    for plural in TESSERA_PLURALS:
        left = (cluster.get(f"/apis/{contract.GROUP}/{contract.VERSION}/{plural}") or {}).get("items") or []
        assert not [o for o in left if o["metadata"]["namespace"] == ns], plural
