"""Whether the API server keeps what DRA lanes rely on, asked the one way that shows it: a dry-run create.

DRA lanes need consumable capacity (KEP-5075, feature gate `DRAConsumableCapacity`: beta and on by default
from Kubernetes 1.36, alpha and off in 1.34-1.35): a device shared by several claims
(`allowMultipleAllocations`), capacities with a `requestPolicy`, and claims asking `capacity.requests`.
Serving `resource.k8s.io/v1` does not say the gate is on: the schema is the same either way, and an API server
with the gate off accepts such objects and silently drops those fields (the registry's dropDisabledFields).
So each component dry-runs a create of the object it writes (the agent its ResourceSlice, the operator a
ResourceClaimTemplate) and checks that the fields came back. `lanes.api: auto` falls back to the device
plugin when they did not (docs/dra.md).
"""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime
from typing import Any, Literal

from tessera.api import contract
from tessera.kube import JsonObj, KubeClient, KubeError

log = logging.getLogger(__name__)

LanesApi = Literal["devicePlugin", "dra"]
RESOURCE_API = "/apis/resource.k8s.io/v1"
FEATURE_GATE = "DRAConsumableCapacity"
PROBE_PREFIX = "tessera-dra-probe-"
REASON_FALLBACK = "DRAUnavailable"


def _gate_off(kind: str, fields: str) -> str:
    return (
        f"the API server dropped {fields} from a dry-run {kind}: consumable capacity (feature gate "
        f"{FEATURE_GATE}) is off"
    )


async def _dry_run(api: KubeClient, path: str, body: JsonObj, kind: str) -> JsonObj | str:
    """The object as the API server would store it, or why it would not. An unreachable or failing server
    (no status, 5xx) raises KubeError: the choice is made on an answer, never on an outage."""
    try:
        return await api.request("POST", path, query={"dryRun": "All"}, body=body)
    except KubeError as err:
        if err.status == 0 or err.status >= 500:
            raise
        if err.status == 404:
            return f"the API server does not serve {kind}s of resource.k8s.io/v1"
        return f"a dry-run create of a {kind} was refused: {err}"


async def slice_refusal(api: KubeClient, resource_slice: JsonObj) -> str | None:
    """None when the API server keeps a ResourceSlice's shared devices and request policies (the agent's
    slice, under a probe name); else why DRA lanes cannot run."""
    body = copy.deepcopy(resource_slice)
    body["metadata"] = {"generateName": PROBE_PREFIX}
    kept = await _dry_run(api, f"{RESOURCE_API}/resourceslices", body, "ResourceSlice")
    if isinstance(kept, str):
        return kept
    devices: list[dict[str, Any]] = (kept.get("spec") or {}).get("devices") or []
    sent = len((resource_slice.get("spec") or {}).get("devices") or [])
    whole = len(devices) == sent and all(
        d.get("allowMultipleAllocations") is True
        and all("requestPolicy" in c for c in (d.get("capacity") or {}).values())
        for d in devices
    )
    return None if whole else _gate_off("ResourceSlice", "allowMultipleAllocations and requestPolicy")


def probe_claim_template() -> JsonObj:
    """The least ResourceClaimTemplate of the kind the operator writes: one request with capacity requests."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"generateName": PROBE_PREFIX},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": contract.DRA_DEVICE_CLASS,
            "capacity": {"requests": {contract.DRA_CAPACITY_MEMORY: "1Mi", contract.DRA_CAPACITY_COMPUTE: "1"}},
        }}]}}},
    }  # fmt: skip


async def claim_template_refusal(api: KubeClient, namespace: str) -> str | None:
    """None when the API server keeps a ResourceClaimTemplate's capacity requests; else why DRA lanes cannot
    run. Dry run in `namespace`, where the operator may create templates."""
    path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
    kept = await _dry_run(api, path, probe_claim_template(), "ResourceClaimTemplate")
    if isinstance(kept, str):
        return kept
    requests = (((kept.get("spec") or {}).get("spec") or {}).get("devices") or {}).get("requests") or []
    if requests and all((r.get("exactly") or {}).get("capacity") for r in requests):
        return None
    return _gate_off("ResourceClaimTemplate", "capacity.requests")


def fallback_message(refusal: str) -> str:
    return f"lanes.api auto: running the device plugin, not DRA lanes: {refusal}"


def fallback_event(involved: dict[str, str], refusal: str, component: str, host: str = "") -> JsonObj:
    """A Warning Event on `involved` (apiVersion, kind, name, namespace for namespaced objects) saying why
    `lanes.api: auto` runs the device plugin."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "generateName": f"{involved['name']}.",
            "namespace": involved.get("namespace", "default"),
        },
        "involvedObject": involved,
        "reason": REASON_FALLBACK,
        "message": fallback_message(refusal)[:1024],
        "type": "Warning",
        "source": {"component": component, **({"host": host} if host else {})},
        "reportingComponent": component,
        "reportingInstance": f"{component}-{host}" if host else component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def operator_lanes_api(api: KubeClient, namespace: str, pod: str | None) -> LanesApi:
    """`--lanes-api auto` for the operator: dra when the API server keeps its templates' capacity requests,
    else devicePlugin, said in the log and in a Warning Event on the operator's pod (when it knows its name:
    the chart's POD_NAME)."""
    refusal = await claim_template_refusal(api, namespace)
    if refusal is None:
        log.info("lanes api auto: the API server keeps capacity requests; DRA lanes")
        return "dra"
    log.warning("%s", fallback_message(refusal))
    if pod:
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace}
        try:
            await api.create_event(namespace, fallback_event(involved, refusal, "tessera-operator"))
        except KubeError as err:  # the log line stays
            log.warning("could not record the lanes api fallback on pod %s/%s: %s", namespace, pod, err)
    return "devicePlugin"
