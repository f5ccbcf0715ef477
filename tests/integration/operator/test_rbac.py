"""Every API request the operator made during a run (as kmock received them) is allowed by rbac.RULES, the
default install's ClusterRole. The real API server's audit log is checked both ways in
tests/integration/k8s/test_rbac.py; this is the quick check."""

from __future__ import annotations

import kmock
from tessera.api import contract
from tessera.controller.rbac import RULES, allowed

from .conftest import APPS, NS, add_node, app_body, job, pods, running_operator, wait_for


def verb_of(method: str, name: str | None, watch: bool) -> str:
    if method == "GET":
        return "watch" if watch else ("get" if name else "list")
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]


async def test_every_request_is_covered_by_the_rules(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=2)])
    api.objects[APPS, NS, "bad"] = app_body("bad", [job("j1", gpus=0)])
    async with running_operator(api):
        await wait_for(lambda: pods(api, **{contract.LABEL_APP: "a"}), what="pods")
        await api.delete(f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/apps/a")
        await wait_for(lambda: (APPS, NS, "a") not in api.objects, what="App gone")
    seen = set()
    for r in api:
        if r.method.value == "DELETE" and r.resource is not None and r.resource.plural == "apps":
            continue  # the test's own (the user's) delete
        if r.resource is None or r.resource.plural is None:
            continue  # discovery (/api, /apis/...) needs no RBAC
        resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        watch = r.params.get("watch") in ("true", "1")
        seen.add((r.resource.group or "", resource, verb_of(str(r.method.value), r.name, watch)))
    missing = {s for s in seen if not allowed(*s, name=contract.LEDGER_CONFIGMAP if s[2] == "get" else None)}
    assert not missing, f"requests not covered by rbac.RULES: {sorted(missing)}"
    assert ("", "pods", "create") in seen and (contract.GROUP, "apps/status", "patch") in seen
    # One object is read by name here, the arbiter's ledger, and the only ConfigMap `get` granted is of that
    # object. The other `get` is of a gated Job (controller/gate.py), which this run has none of.
    assert [s for s in seen if s[2] == "get"] == [("", "configmaps", "get")]
    gets = {(r.api_groups, r.resources, r.resource_names) for r in RULES if "get" in r.verbs}
    assert gets == {(("",), ("configmaps",), (contract.LEDGER_CONFIGMAP,)), (("batch",), ("jobs",), ())}
