"""The least RBAC the operator needs, as data (the Helm chart's ClusterRole is aligned to it).

kopf itself: watch the custom resources and patch them (finalizers, progress annotations, status), peering
objects, discovery of CRDs and namespaces. The controller: watch nodes and pods, create/delete pods, patch
App status from arbiter rounds, post events. `tests/integration/operator/test_rbac.py` checks every request
the operator sent to the API during a run against these rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.api import contract


@dataclass(frozen=True, slots=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def to_k8s(self) -> dict[str, list[str]]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


_CRS = (contract.PLURAL_APP, contract.PLURAL_TRIALGROUP, contract.PLURAL_MODELDEPLOYMENT)

RULES: tuple[Rule, ...] = (
    Rule((contract.GROUP,), _CRS, ("get", "list", "watch", "patch")),
    Rule((contract.GROUP,), tuple(f"{p}/status" for p in _CRS), ("get", "patch")),
    Rule(("",), ("pods",), ("get", "list", "watch", "create", "delete")),
    Rule(("",), ("nodes",), ("get", "list", "watch")),
    Rule(("",), ("services", "configmaps"), ("get", "create", "patch", "delete")),
    Rule(("apps",), ("deployments",), ("get", "create", "patch", "delete")),
    Rule(("",), ("events",), ("create",)),
    Rule(("",), ("namespaces",), ("list", "watch")),
    Rule(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("list", "watch")),
    Rule(("kopf.dev",), ("kopfpeerings", "clusterkopfpeerings"), ("get", "list", "watch", "patch")),
)


def allowed(group: str, resource: str, verb: str, rules: tuple[Rule, ...] = RULES) -> bool:
    return any(group in r.api_groups and resource in r.resources and verb in r.verbs for r in rules)
