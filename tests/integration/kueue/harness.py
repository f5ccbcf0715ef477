"""The real Kueue (sigs.k8s.io/kueue, built by `hack/kueue-assets.sh`) beside the test control plane.

`running_kueue(cluster)` installs Kueue's own CRDs and webhook configurations (from the module version built,
next to the binary), writes a Kueue Configuration and runs `kueue` — controllers, scheduler and webhook
server, as upstream's image runs it — as a process of the cluster, with cluster-admin's kubeconfig.

What a cluster gives Kueue and the harness stands in for, and nothing more:

- **The webhook Service.** Kueue's manifests reach its webhooks (and its CRDs' conversion webhook) through
  the Service `kueue-webhook-service` in `kueue-system`. Here that Service is of type ExternalName,
  `127.0.0.1`: the API server resolves an ExternalName Service to that name and the webhook's port, and still
  verifies the serving certificate for `kueue-webhook-service.kueue-system.svc`. The only change to Kueue's
  manifests is that port (the free port the webhook server listens on instead of the Service's 443).
- **The Secret volume.** Kueue's internal certificate management (on, as in every Kueue install) makes a CA
  and a serving certificate for that DNS name, stores them in the Secret `kueue-webhook-server-cert`, injects
  the CA into the webhook configurations and CRDs, and waits for the kubelet to mount the Secret in its
  certificate directory. The harness writes the Secret's `tls.crt` and `tls.key` there once Kueue has
  filled it, as the kubelet's secret volume would.

Kueue v0.17 cannot run outside a cluster with its internal certificate management off: `cmd/kueue` then
reads the metrics server's certificate from the fixed path `/etc/kueue/metrics/certs`. And its visibility
API server (feature gate `VisibilityOnDemand`, on by default) writes or reads its certificate in the fixed
directory `/visibility`; it is turned off here (the test reads pending Workloads from the API instead).

Importable outside pytest (benchmarks): nothing here needs a fixture.

    with kwok_control_plane() as cluster, running_kueue(cluster) as kueue:
        ...  # ResourceFlavors, ClusterQueues, LocalQueues, Jobs with kueue.x-k8s.io/queue-name
"""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.integration.k8s.controlplane import ControlPlane, Process, go_assets, wait_until
from tests.ports import free_port

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API = f"/apis/{GROUP}/{VERSION}"
QUEUE_LABEL = f"{GROUP}/queue-name"  # a Job's or Pod's LocalQueue
# Kueue's own names, as its kustomization (config/default: namePrefix kueue-, namespace kueue-system) and its
# Configuration defaults give them; the rotator derives the webhook configurations' names from the Service's.
NAMESPACE = "kueue-system"
PREFIX = "kueue-"
SERVICE = f"{PREFIX}webhook-service"
SECRET = f"{PREFIX}webhook-server-cert"
# The integrations the comparisons need: batch/v1 Jobs and plain Pods.
FRAMEWORKS = ("batch/job", "pod")
# Kueue manages Jobs and Pods that name a LocalQueue only in namespaces its managedJobsNamespaceSelector
# matches (for every integration since v0.15: feature ManagedJobsNamespaceSelectorAlwaysRespected); here,
# those with this label (`manage_namespace`). Kueue requires a selector that leaves kube-system and its own
# namespace out.
MANAGED_LABEL = "tessera.io/kueue-managed"
MANAGED_SELECTOR: dict[str, Any] = {"matchLabels": {MANAGED_LABEL: "true"}}


def kueue_dir() -> Path:
    """The directory `hack/kueue-assets.sh` prints: `$TESSERA_KUEUE_DIR` (hack/test.sh exports it), else what
    the script builds (from its cache once built). NoBinaries where there is no Go to build it."""
    return go_assets("TESSERA_KUEUE_DIR", "kueue-assets.sh", "Kueue", ("kueue",))


def manage_namespace(cluster: ControlPlane, namespace: str) -> None:
    """Label `namespace` for Kueue (MANAGED_SELECTOR, the harness's default): its queued Jobs and Pods are
    Kueue's."""
    status, out = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {MANAGED_LABEL: "true"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, f"labelling namespace {namespace}: {status} {str(out)[:400]}"


def _merge(base: Any, patch: Any) -> Any:
    """`patch` merged into `base` as a strategic merge patch does for these manifests: maps key by key, lists of
    maps with a `name` element by element (webhooks), anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in [*base, *patch])
    ):
        merged = [dict(x) for x in base]
        index = {x["name"]: i for i, x in enumerate(merged)}
        for item in patch:
            if item["name"] in index:
                merged[index[item["name"]]] = _merge(merged[index[item["name"]]], item)
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(patch)


def _route(service: dict[str, Any], port: int) -> None:
    """A `clientConfig.service` of Kueue's manifests (`system/webhook-service`), as kustomize names it, on the
    webhook server's port."""
    service["namespace"] = NAMESPACE
    service["name"] = PREFIX + service["name"]
    service["port"] = port


def crd_objects(assets: Path, webhook_port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs as its kustomization (`crd/kustomization.yaml`) builds them: the bases, with the conversion
    webhook patched in where it says, routed to the webhook server's port."""
    crd = assets / "crd"
    kustomization = yaml.safe_load((crd / "kustomization.yaml").read_text())
    objs = [yaml.safe_load((crd / path).read_text()) for path in kustomization["resources"]]
    by_name = {o["metadata"]["name"]: i for i, o in enumerate(objs)}
    for entry in kustomization.get("patches") or []:
        patch = yaml.safe_load((crd / entry["path"]).read_text())
        i = by_name[patch["metadata"]["name"]]
        objs[i] = _merge(objs[i], {"spec": patch["spec"]})
    for o in objs:
        webhook = ((o["spec"].get("conversion") or {}).get("webhook") or {}).get("clientConfig")
        if webhook and "service" in webhook:
            _route(webhook["service"], webhook_port)
    return objs


def webhook_objects(assets: Path, webhook_port: int) -> list[dict[str, Any]]:
    """Kueue's Mutating- and ValidatingWebhookConfiguration as its kustomizations build them (`webhook/`: the
    namespace selectors of the pod, deployment and statefulset webhooks; config/default: the `kueue-` prefix),
    each webhook routed to the webhook server's port. Their caBundle is Kueue's to inject."""
    webhook = assets / "webhook"
    kustomization = yaml.safe_load((webhook / "kustomization.yaml").read_text())
    objs = [o for o in yaml.safe_load_all((webhook / "manifests.yaml").read_text()) if o]
    for entry in kustomization.get("patches") or []:
        patch = (
            yaml.safe_load(entry["patch"])
            if "patch" in entry
            else yaml.safe_load((webhook / entry["path"]).read_text())
        )
        for i, o in enumerate(objs):
            if (o["kind"], o["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"]):
                objs[i] = _merge(
                    o, {k: v for k, v in patch.items() if k not in ("apiVersion", "kind", "metadata")}
                )
    for o in objs:
        o["metadata"]["name"] = PREFIX + o["metadata"]["name"]
        for hook in o["webhooks"]:
            _route(hook["clientConfig"]["service"], webhook_port)
    return objs


def _apply(cluster: ControlPlane, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply as the harness's field manager (the object created or brought to `obj`)."""
    status, body = cluster.request(
        "PATCH",
        f"{path}/{obj['metadata']['name']}?fieldManager=tessera-kueue-harness&force=true",
        obj,
        content_type="application/apply-patch+yaml",
    )
    assert status in (200, 201), (
        f"applying {obj['kind']} {obj['metadata']['name']}: {status} {str(body)[:800]}"
    )
    return dict(body)


WEBHOOK_PATHS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def install_crds(cluster: ControlPlane, assets: Path, webhook_port: int) -> list[str]:
    """Kueue's CRDs applied and Established; their names."""
    objs = crd_objects(assets, webhook_port)
    for o in objs:
        _apply(cluster, CRD_PATH, o)

    def established(name: str) -> bool:
        crd = cluster.get(f"{CRD_PATH}/{name}") or {}
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    names = [o["metadata"]["name"] for o in objs]
    for name in names:
        wait_until(lambda name=name: established(name), 60, f"CRD {name} to be Established")
    return names


def configuration(
    assets: Path,
    *,
    workdir: Path,
    webhook_port: int,
    health_port: int,
    metrics_port: int,
    frameworks: Sequence[str] = FRAMEWORKS,
    managed_namespaces: Mapping[str, Any] = MANAGED_SELECTOR,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Configuration Kueue ships (`manager/controller_manager_config.yaml`: concurrency, client QPS), with
    what differs beside the test control plane: loopback ports, one replica without leader election, the
    certificate directory the harness fills, `frameworks`, the namespaces whose Jobs and Pods Kueue manages, and the
    visibility server off (see the module's docstring). `overrides` is merged on top."""
    config = yaml.safe_load((assets / "manager" / "controller_manager_config.yaml").read_text())
    config = _merge(
        config,
        {
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(workdir / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": SERVICE,
                "webhookSecretName": SECRET,
            },
            "managedJobsNamespaceSelector": dict(managed_namespaces),
            "integrations": {"frameworks": list(frameworks)},
            "featureGates": {"VisibilityOnDemand": False},
        },
    )
    return dict(_merge(config, dict(overrides or {})))


@dataclass
class Kueue:
    """A running Kueue: its process (log in the cluster's work dir), ports and manifests' directory."""

    process: Process
    assets: Path
    version: str
    config: dict[str, Any]
    workdir: Path
    webhook_port: int
    health_port: int
    metrics_port: int

    def ready(self) -> bool:
        """The main manager's own readiness check (its webhook server started). The certificate bootstrap
        runs a manager of its own on the same port first, whose /readyz has no such check."""
        return _probe(self.health_port, "/readyz/readyz")

    def tail(self, lines: int = 40) -> str:
        return self.process.tail(lines)


def _probe(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _play_secret_volume(cluster: ControlPlane, certs: Path) -> bool:
    """The kubelet's part for Kueue's webhook Secret: once Kueue has filled it, its serving certificate and
    key (and the CA) as files in the certificate directory, each written whole before it appears."""
    secret = cluster.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}") or {}
    data = secret.get("data") or {}
    if not all(data.get(k) for k in ("tls.crt", "tls.key", "ca.crt")):
        return False
    certs.mkdir(parents=True, exist_ok=True)
    for name in ("ca.crt", "tls.key", "tls.crt"):  # tls.crt last: Kueue waits for it
        tmp = certs / f".{name}.tmp"
        tmp.write_bytes(base64.b64decode(data[name]))
        tmp.chmod(0o600)
        tmp.replace(certs / name)
    return True


def _webhooks_answer(cluster: ControlPlane) -> bool:
    """A dry-run ClusterQueue create went through Kueue's mutating and validating webhooks: the API server
    reaches them through the Service with the CA Kueue injected."""
    probe = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterQueue",
        "metadata": {"name": "tessera-harness-probe"},
        "spec": {},
    }
    status, body = cluster.request("POST", f"{API}/clusterqueues?dryRun=All", probe)
    if status != 201:
        raise RuntimeError(f"dry-run ClusterQueue: {status} {str(body)[:400]}")
    return True


def _delete_webhooks(cluster: ControlPlane) -> None:
    """Kueue's webhook configurations deleted: their failurePolicy is Fail, and nothing answers once Kueue has
    stopped (every Job and Pod create in the cluster would be refused)."""
    for kind, path in WEBHOOK_PATHS.items():
        name = f"{PREFIX}{'mutating' if kind.startswith('Mutating') else 'validating'}-webhook-configuration"
        cluster.request("DELETE", f"{path}/{name}")


@contextlib.contextmanager
def running_kueue(
    cluster: ControlPlane,
    *,
    frameworks: Sequence[str] = FRAMEWORKS,
    managed_namespaces: Mapping[str, Any] = MANAGED_SELECTOR,
    overrides: Mapping[str, Any] | None = None,
    args: Sequence[str] = ("--zap-log-level=2",),
    ready_timeout: float = 180,
) -> Iterator[Kueue]:
    """Kueue installed and running against `cluster`, its webhooks answering; on exit it is stopped and its
    webhook configurations deleted (its CRDs, namespace and objects stay: a later Kueue takes them up).

    `frameworks`, `managed_namespaces` (a label selector) and `overrides` shape its Configuration
    (`configuration`); `args` are added to kueue's command line (its log: `<workdir>/kueue-<port>.log`).
    A Kueue that exits or is not ready within `ready_timeout` seconds fails with its log's tail."""
    assets = kueue_dir()
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    workdir = cluster.workdir / f"kueue-{webhook_port}"
    workdir.mkdir()
    install_crds(cluster, assets, webhook_port)
    _apply(
        cluster,
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    namespaced = f"/api/v1/namespaces/{NAMESPACE}"
    # Kueue's own empty Secret (config/components/internalcert): its certificate rotator fills it.
    _apply(
        cluster, f"{namespaced}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET}}
    )
    _apply(
        cluster,
        f"{namespaced}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE},
            "spec": {"type": "ExternalName", "externalName": "127.0.0.1"},
        },
    )
    for o in webhook_objects(assets, webhook_port):
        _apply(cluster, WEBHOOK_PATHS[o["kind"]], o)
    config = configuration(
        assets,
        workdir=workdir,
        webhook_port=webhook_port,
        health_port=health_port,
        metrics_port=metrics_port,
        frameworks=frameworks,
        managed_namespaces=managed_namespaces,
        overrides=overrides,
    )
    config_file = workdir / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    proc = cluster.spawn(
        f"kueue-{webhook_port}",
        [str(assets / "kueue"), f"--config={config_file}", f"--kubeconfig={cluster.kubeconfig}", *args],
    )
    kueue = Kueue(
        proc,
        assets,
        (assets / "VERSION").read_text().strip(),
        config,
        workdir,
        webhook_port,
        health_port,
        metrics_port,
    )
    try:
        wait_until(
            lambda: _play_secret_volume(cluster, workdir / "certs"),
            ready_timeout,
            "Kueue's certificates",
            proc,
        )
        wait_until(kueue.ready, ready_timeout, "Kueue's /readyz", proc)
        wait_until(lambda: _webhooks_answer(cluster), ready_timeout, "Kueue's webhooks to answer", proc)
        yield kueue
    finally:
        proc.stop()
        _delete_webhooks(cluster)
