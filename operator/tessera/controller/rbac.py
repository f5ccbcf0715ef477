"""The least RBAC the operator needs, as data; the Helm chart's operator roles equal it.

Every grant is a call the operator makes, and nothing else: kopf lists and watches the resources it
handles (the three custom resources, team Queues, namespaces, PriorityClasses, nodes, pods), patches the custom resources (finalizers, progress
annotations) and their status subresource, lists and watches CRDs (resource discovery), and lists, watches
and patches its peering object; with a namespace list rather than --all-namespaces it also lists and
watches namespaces to learn which of them exist. The controller's own client (`kube.KubeApi`) creates and
deletes pods, creates, patches and deletes the gateway's Deployment, Services and ConfigMap, patches App
and Queue status after arbiter rounds and creates events. It patches pods of other kinds to take their
queue's scheduling gate off, and GETs the Job of such pods (its parallelism: `gate.py`). Otherwise it GETs
one object only: the arbiter's renewal ledger (a ConfigMap of a fixed name, `contract.LEDGER_CONFIGMAP`,
which it also creates and patches), read once before its first round; the grant names that object alone. With
`--lanes-api dra` it also creates and deletes the ResourceClaimTemplate of each worker pod (`dra.py`).

Watching every namespace, all of it is one ClusterRole. Watching only the release namespace, what lives
in a namespace is a Role there, and only the cluster-scoped part (nodes, CRDs, namespaces) stays a
ClusterRole. `tests/integration/k8s/test_rbac.py` runs the operator under the chart's roles on a real API
server and checks its audit log against them both ways (no 403, no grant unused).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.api import contract


@dataclass(frozen=True, slots=True)
class PolicyRule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()  # only these objects (none: every object of the resources)

    def to_k8s(self) -> dict[str, list[str]]:
        out = {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if self.resource_names:
            out["resourceNames"] = list(self.resource_names)
        return out


_CRS = (contract.PLURAL_APP, contract.PLURAL_TRIALGROUP, contract.PLURAL_MODELDEPLOYMENT)
_KOPF = "kopf.dev"

# What the operator does in the namespaces it serves.
NAMESPACED_RULES: tuple[PolicyRule, ...] = (
    PolicyRule((contract.GROUP,), _CRS, ("list", "watch", "patch")),
    PolicyRule((contract.GROUP,), tuple(f"{p}/status" for p in _CRS), ("patch",)),
    PolicyRule(("",), ("pods",), ("list", "watch", "create", "delete", "patch")),
    PolicyRule(("batch",), ("jobs",), ("get",)),
    PolicyRule(("",), ("services", "configmaps"), ("create", "patch", "delete")),
    PolicyRule(("apps",), ("deployments",), ("create", "patch", "delete")),
    PolicyRule(("",), ("events",), ("create",)),
)
# The arbiter's renewal ledger in the operator's namespace, read before the first round (controller/ledger.py;
# created and patched under the ConfigMap rule above).
LEDGER = PolicyRule(("",), ("configmaps",), ("get",), (contract.LEDGER_CONFIGMAP,))
# DRA mode: each worker pod's ResourceClaimTemplate, created before the pod and deleted with it.
DRA_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(("resource.k8s.io",), ("resourceclaimtemplates",), ("create", "delete")),
)
NAMESPACES = PolicyRule(("",), ("namespaces",), ("list", "watch"))
# Cluster-scoped resources, read whichever namespaces it serves: nodes, CRDs, team Queues (status written
# each round), Namespaces (their tessera.io/queue label; kopf also checks the namespaces it serves) and
# PriorityClasses (an App's priority inside its queue).
CLUSTER_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(("",), ("nodes",), ("list", "watch")),
    PolicyRule(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("list", "watch")),
    PolicyRule((contract.GROUP,), (contract.PLURAL_QUEUE,), ("list", "watch")),
    PolicyRule((contract.GROUP,), (f"{contract.PLURAL_QUEUE}/status",), ("patch",)),
    NAMESPACES,
    PolicyRule(("scheduling.k8s.io",), ("priorityclasses",), ("list", "watch")),
)
CLUSTER_PEERING = PolicyRule((_KOPF,), ("clusterkopfpeerings",), ("list", "watch", "patch"))
NAMESPACE_PEERING = PolicyRule((_KOPF,), ("kopfpeerings",), ("list", "watch", "patch"))


@dataclass(frozen=True, slots=True)
class OperatorRbac:
    """The rules of the operator's ClusterRole, and of its Role in the release namespace (if any)."""

    cluster: tuple[PolicyRule, ...]
    namespaced: tuple[PolicyRule, ...]


def operator_rbac(clusterwide: bool, lanes_api: str = "devicePlugin") -> OperatorRbac:
    namespaced = (*NAMESPACED_RULES, *(DRA_RULES if lanes_api == "dra" else ()))
    if clusterwide:
        return OperatorRbac((*namespaced, *CLUSTER_RULES, CLUSTER_PEERING, LEDGER), ())
    return OperatorRbac(CLUSTER_RULES, (*namespaced, NAMESPACE_PEERING, LEDGER))


# The default install (--all-namespaces): one ClusterRole.
RULES: tuple[PolicyRule, ...] = operator_rbac(clusterwide=True).cluster


def allowed(
    group: str, resource: str, verb: str, rules: tuple[PolicyRule, ...] = RULES, name: str | None = None
) -> bool:
    return any(
        group in r.api_groups
        and resource in r.resources
        and verb in r.verbs
        and (not r.resource_names or name in r.resource_names)
        for r in rules
    )
