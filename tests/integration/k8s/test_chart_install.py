"""The chart as an admin drives it: the Helm 4 CLI (built from helm.sh/helm/v4, hack/cli-assets.sh) against
the real API server, with the commands docs/operations.md gives — `lint --strict`, `template | kubectl
apply --dry-run=server`, `install --dry-run=server`, `install`, `upgrade --reuse-values --set ...`,
`history`, `rollback`, `uninstall` — and the values schema's errors as Helm prints them.

What counts is what the API server holds afterwards: the CRDs Established, every object a render with the
same release name, namespace and values produces, owned by the release; after an upgrade the changed
values in place and the objects the new values no longer render removed, and a rollback undoing that; after
uninstall none of the release's objects left. There is no kubelet, so nothing waits for Deployments or
DaemonSets to be ready (Helm's default, as in a plain `helm install`), and the uninstall's cleanup Job
cannot run: the uninstall must still end, within a minute, and say so.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tessera.api import contract

from tests.unit.chart.chart_render import chart_crds, objects, render

from .admin_cli import AdminCLI
from .controlplane import K8S_VERSION, ControlPlane, wait_until

CHART = "charts/tessera"  # as the docs give it, from the repository root
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterKopfPeering",
    "DeviceClass",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
}
# docs/operations.md's install line, with its image values.
IMAGE = {"image": {"repository": "registry.example.com/ml/tessera", "tag": "0.1.0"}}


def api_path(obj: dict[str, Any]) -> str:
    """The object's URL; every kind the chart renders has the plural `<kind lowercased>s` (`-ies` for `-y`)."""
    group_version = obj["apiVersion"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    meta = obj["metadata"]
    scope = "" if obj["kind"] in CLUSTER_SCOPED else f"/namespaces/{meta['namespace']}"
    kind = obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
    return f"{base}{scope}/{plural}/{meta['name']}"


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def release_render(
    release: str, namespace: str, values: dict[str, Any] | None, *, hooks: bool = False
) -> list[dict[str, Any]]:
    objs = objects(render(values, name=release, namespace=namespace), hooks=hooks)
    for obj in objs:
        assert obj["kind"] in CLUSTER_SCOPED or obj["metadata"].get("namespace"), key(obj)
    return objs


def assert_held(
    cluster: ControlPlane, release: str, objs: list[dict[str, Any]]
) -> dict[tuple[str, str, str], Any]:
    """Every rendered object is on the server, owned by the release; returns them as the server holds them."""
    held = {}
    for obj in objs:
        live = cluster.get(api_path(obj))
        assert live is not None, f"{key(obj)} is not on the server"
        annotations = live["metadata"].get("annotations") or {}
        assert annotations.get("meta.helm.sh/release-name") == release, key(obj)
        assert obj["metadata"].get("labels", {}).items() <= live["metadata"].get("labels", {}).items()
        held[key(obj)] = live
    return held


def assert_gone(cluster: ControlPlane, objs: list[dict[str, Any]], what: str) -> None:
    for obj in objs:
        wait_until(
            lambda o=obj: cluster.request("GET", api_path(o))[0] == 404,
            120,
            f"{what} {key(obj)} to be deleted",
        )


def operator_args(held: dict[tuple[str, str, str], Any], namespace: str, release: str) -> str:
    deploy = held["Deployment", namespace, f"{release}-tessera-operator"]
    return str(deploy["spec"]["template"]["spec"]["containers"][0]["args"][0])


def manifest_keys(text: str) -> list[tuple[str, str, str]]:
    return sorted(key(o) for o in yaml.safe_load_all(text) if o)


def history(cli: AdminCLI, release: str, namespace: str) -> list[tuple[int, str]]:
    out = json.loads(cli.helm("history", release, "-n", namespace, "-o", "json").stdout)
    return [(int(r["revision"]), r["status"]) for r in out]


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def release_namespace(cluster: ControlPlane) -> Iterator[str]:
    """A namespace name for the release (Helm creates it, as `helm install --create-namespace`)."""
    name = f"rel-{secrets.token_hex(4)}"
    yield name
    cluster.request("DELETE", f"/api/v1/namespaces/{name}")


def test_lint_strict_and_schema_errors_as_helm_prints_them(admin_cli: AdminCLI) -> None:
    lint = admin_cli.helm("lint", "--strict", CHART)
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout
    findings = [line for line in lint.stdout.splitlines() if line.startswith("[")]
    assert findings == ["[INFO] Chart.yaml: icon is recommended"], lint.stdout
    # A bad value fails before anything reaches the cluster, with the key and the constraint.
    for args, message in (
        (["--set", "operator.replicas=0"], "- at '/operator/replicas': minimum: got 0, want 1"),
        (["--set", "operator.replica=2"], "- at '/operator': additional properties 'replica' not allowed"),
        (["--set", "agent.cleanupDeadlineSeconds=1"], "- at '/agent/cleanupDeadlineSeconds': minimum: got 1"),
    ):
        bad = admin_cli.helm("install", "bad", CHART, "-n", "default", "--dry-run=server", *args, check=False)
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr and "panic" not in bad.stderr


def test_template_piped_to_kubectl_apply_dry_run_server(crds: ControlPlane, admin_cli: AdminCLI) -> None:
    """`helm template ... | kubectl apply --dry-run=server -f -`: every rendered object, the hooks and the
    gpuNodes.reserve policy included, passes the API server's validation and admission."""
    ns = f"tpl-{secrets.token_hex(4)}"
    admin_cli.kubectl("create", "namespace", ns)
    try:
        for extra in ([], ["--set", "gpuNodes.reserve=true"]):
            rendered = admin_cli.helm("template", "t", CHART, "-n", ns, *extra).stdout
            applied = admin_cli.kubectl("apply", "--dry-run=server", "-f", "-", stdin=rendered)
            lines = applied.stdout.splitlines()
            assert lines and all(line.endswith("(server dry run)") for line in lines), applied.stdout
            assert len(lines) == len([d for d in yaml.safe_load_all(rendered) if d])
            assert any(line.startswith("job.batch/t-tessera-agent-cleanup") for line in lines)
    finally:
        crds.request("DELETE", f"/api/v1/namespaces/{ns}")


def test_install_upgrade_rollback_uninstall_with_the_helm_cli(
    crds: ControlPlane, admin_cli: AdminCLI, release_namespace: str
) -> None:
    # A server dry run needs the CRDs on the server: Helm does not install crds/ in a dry run, and the chart
    # renders kopf's ClusterKopfPeering (on a fresh cluster: "no matches for kind ClusterKopfPeering ...
    # ensure CRDs are installed first"). docs/operations.md says to apply them first, as `crds` does.
    cluster = crds
    ns = release_namespace
    release = f"r{secrets.token_hex(3)}"  # not the chart's name: every object is prefixed <release>-tessera
    helm = admin_cli.helm
    image = ["--set", "image.repository=registry.example.com/ml/tessera", "--set", "image.tag=0.1.0"]

    # --- a server dry run first: the manifest and NOTES, nothing created ------------------------------
    dry = helm("install", release, CHART, "-n", ns, "--create-namespace", *image, "--dry-run=server")
    assert "STATUS: pending-install" in dry.stdout and "NOTES:" in dry.stdout
    assert helm("list", "-n", ns, "-q").stdout.strip() == ""
    assert (
        cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-tessera-operator")[0]
        == 404
    )

    # --- install with the defaults a user starts from (docs/operations.md's line) ------------------------
    installed = helm("install", release, CHART, "-n", ns, "--create-namespace", *image)
    assert "STATUS: deployed" in installed.stdout and "REVISION: 1" in installed.stdout
    notes = installed.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply -f examples/" in notes
    # The CRDs are the chart's (crds/): Helm applies them before the templates, or finds them there.
    for crd in chart_crds():
        name = crd["metadata"]["name"]
        wait_until(
            lambda n=name: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}") or {})
                .get("status", {})
                .get("conditions", [])
            ),
            60,
            f"CRD {name} to be Established",
        )
    first = release_render(release, ns, IMAGE)
    # What Helm applied is what the chart renders offline with the same values (same objects).
    assert manifest_keys(helm("get", "manifest", release, "-n", ns).stdout) == sorted(map(key, first))
    held = assert_held(cluster, release, first)
    assert {k[0] for k in held} >= {"Deployment", "DaemonSet", "ClusterRole", "ClusterKopfPeering"}
    assert "--all-namespaces" in operator_args(held, ns, release)
    assert "--lease-seconds 600" in operator_args(held, ns, release)
    assert not [k for k in held if k[0] == "ServiceMonitor"]
    operator = held["Deployment", ns, f"{release}-tessera-operator"]["spec"]["template"]["spec"]
    assert operator["containers"][0]["image"] == "registry.example.com/ml/tessera:0.1.0"
    # The scheduler pod's kube-scheduler follows the API server's version (the tag is left empty).
    scheduler = held["Deployment", ns, f"{release}-tessera-scheduler"]["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in scheduler["containers"]}
    assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{K8S_VERSION}"
    # The custom resources the operator serves are usable as soon as the install returns.
    app = {
        "apiVersion": contract.API_VERSION,
        "kind": "App",
        "metadata": {"name": "smoke", "namespace": ns},
        "spec": {
            "template": {"spec": {"containers": [{"name": "c", "image": "trainer:1"}]}},
            "jobs": [{"name": "j", "iterTotal": 10, "iterTimeSerialSeconds": 1.0, "maxGPUs": 1}],
        },
    }
    assert (
        "app.tessera.io/smoke created"
        in admin_cli.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(app)).stdout
    )

    # --- upgrade: the docs' --reuse-values --set line plus a values file ---------------------------------
    values = {
        "operator": {"replicas": 3, "allNamespaces": False, "themis": {"leaseSeconds": 300}},
        # Asked for on a cluster without prometheus-operator: skipped (with a warning), not a failure.
        "serviceMonitor": {"enabled": True},
    }
    values_file = cluster.workdir / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    upgraded = helm(
        "upgrade", release, CHART, "-n", ns, "--reuse-values", "--set", "gpuNodes.reserve=true",
        "-f", str(values_file),
    )  # fmt: skip
    assert "STATUS: deployed" in upgraded.stdout and "REVISION: 2" in upgraded.stdout
    assert "WARNING: serviceMonitor.enabled" in upgraded.stdout
    second_values = deep_merge(deep_merge(IMAGE, values), {"gpuNodes": {"reserve": True}})
    second = release_render(release, ns, second_values)
    assert manifest_keys(helm("get", "manifest", release, "-n", ns).stdout) == sorted(map(key, second))
    assert json.loads(helm("get", "values", release, "-n", ns, "-o", "json").stdout) == second_values
    held = assert_held(cluster, release, second)
    assert held["Deployment", ns, f"{release}-tessera-operator"]["spec"]["replicas"] == 3
    args = operator_args(held, ns, release)
    assert "--lease-seconds 300" in args and f"--namespace {ns}" in args and "--all-namespaces" not in args
    assert ("Role", ns, f"{release}-tessera-operator") in held
    assert ("KopfPeering", ns, "tessera") in held
    # Installs the namespace routing (the cluster's own version passes the chart's 1.36+ check), beside the
    # queue admission policy every default install has.
    for component in ("gpu-nodes", "queue-admission"):
        for kind in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"):
            assert (kind, "", f"{release}-tessera-{component}") in held
    gone = [o for o in first if key(o) not in {key(s) for s in second}]
    assert [key(o) for o in gone] == [("ClusterKopfPeering", "", "tessera")]
    assert_gone(cluster, gone, "object the upgrade no longer renders:")
    assert history(admin_cli, release, ns) == [(1, "superseded"), (2, "deployed")]

    # --- rollback to the first revision: its objects back, the upgrade's extra ones removed ---------------
    rolled = helm("rollback", release, "1", "-n", ns)
    assert "Rollback was a success" in rolled.stdout
    assert history(admin_cli, release, ns) == [(1, "superseded"), (2, "superseded"), (3, "deployed")]
    held = assert_held(cluster, release, first)
    assert held["Deployment", ns, f"{release}-tessera-operator"]["spec"]["replicas"] == 2
    assert "--all-namespaces" in operator_args(held, ns, release)
    assert_gone(cluster, [o for o in second if key(o) not in {key(f) for f in first}], "rolled-back object")

    # --- uninstall from a cluster whose agent nodes are gone ----------------------------------------------
    # Two Node objects without a kubelet: a GPU node as its agent left it (the inventory annotation, the
    # gpuNodes.reserve taint) and another node. Nothing can run the cleanup Job (no kubelet, no scheduler
    # for it here), so it gives up at its deadline; the uninstall still ends, and removes the release.
    gpu_node, other_node = f"gone-gpu-{release}", f"gone-cpu-{release}"
    taint = {"key": contract.TAINT_GPU_NODE_KEY, "value": "reserved", "effect": "NoSchedule"}
    for name, annotated in ((gpu_node, True), (other_node, False)):
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        if annotated:
            body["metadata"]["annotations"] = {contract.ANN_NODE_GPUS: "[]"}
            body["spec"] = {"taints": [taint]}
        status, got = cluster.request("POST", "/api/v1/nodes", body)
        assert status == 201, got
    try:
        hooks = release_render(release, ns, IMAGE, hooks=True)
        assert {o["kind"] for o in hooks} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
        t0 = time.monotonic()
        out = helm("uninstall", release, "-n", ns, check=False)
        took = time.monotonic() - t0
        print(f"\nhelm uninstall with its cleanup Job unable to run: {took:.1f} s (exit {out.returncode})")
        print(f"stdout: {out.stdout.strip()}\nstderr: {out.stderr.strip()}")
        assert took < 60, f"helm uninstall took {took:.1f} s\n{out.stdout}\n{out.stderr}"
        # It says the post-delete Job failed; the release and its history are gone all the same.
        assert out.returncode != 0, out.stdout
        assert "uninstallation completed with 1 error(s)" in out.stderr, out.stderr
        assert f"Job/{ns}/{release}-tessera-agent-cleanup not ready. status: Failed" in out.stderr, out.stderr
        assert helm("list", "-n", ns, "-q").stdout.strip() == ""
        assert helm("status", release, "-n", ns, check=False).returncode != 0
        assert_gone(cluster, first, "release object")
        assert_gone(cluster, hooks, "hook object")  # hook-failed: no Job, ServiceAccount or rights left
        for crd in chart_crds():  # the CRDs and the users' resources stay
            assert cluster.get(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            )
        smoke = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.PLURAL_APP}/smoke"
        assert cluster.get(smoke) is not None
        assert cluster.request("DELETE", smoke)[0] == 200

        # What the Job would have removed is still on the Node; the NOTES' commands remove it.
        left = cluster.get(f"/api/v1/nodes/{gpu_node}")
        assert contract.ANN_NODE_GPUS in left["metadata"]["annotations"] and taint in left["spec"]["taints"]
        commands = re.findall(r"^\s+(kubectl (?:annotate|taint) nodes .*)$", notes, re.MULTILINE)
        assert commands == [
            f"kubectl annotate nodes --all {contract.ANN_NODE_GPUS}-",
            f"kubectl taint nodes --all {contract.TAINT_GPU_NODE_KEY}-",
        ]
        for line in commands:
            res = admin_cli.kubectl(*line.split()[1:], check=False)
            # A node without the taint answers "not found", as NOTES warn; every other node is cleaned.
            assert res.returncode == 0 or "not found" in res.stderr, res
        clean = cluster.get(f"/api/v1/nodes/{gpu_node}")
        assert contract.ANN_NODE_GPUS not in (clean["metadata"].get("annotations") or {})
        assert all(t["key"] != contract.TAINT_GPU_NODE_KEY for t in clean["spec"].get("taints") or [])
    finally:
        for name in (gpu_node, other_node):
            cluster.request("DELETE", f"/api/v1/nodes/{name}")
