"""The Helm chart: renders through the real Helm engine, lints clean, and every object validates."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from tessera.api import contract

from tests.unit.api.apiserver import cel_errors, openapi_errors

from .chart_render import CHART, NAMESPACE, ROOT, chart_crds, find, objects, render

# A recent Kubernetes that kubernetes-validate ships schemas for, and the oldest the chart supports.
KUBE_VERSIONS = ("1.37.0", "1.35.0")  # the tested version and the chart's floor
MAP_GA = "1.36.0"  # MutatingAdmissionPolicy in admissionregistration.k8s.io/v1 (gpuNodes.reserve)

NON_DEFAULT: dict[str, Any] = {
    "image": {"repository": "registry.example.com/ml/tessera", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "fullnameOverride": "gpu-share",
    "commonLabels": {"team": "ml-platform"},
    "logLevel": "DEBUG",
    "operator": {
        "replicas": 3,
        "allNamespaces": False,
        "peeringName": "gpu-share",
        "themis": {
            "leaseSeconds": 300,
            "fairnessKnob": 0.5,
            "starvingRank": "cap",
            "renewInPlace": False,
            "admissionThreshold": 1.5,
            "preemptionGraceSeconds": 60,
        },
        "extraArgs": ["--pass-deadline-seconds", "90"],
    },
    "scheduler": {
        "schedulerName": "gpu-share",
        "extender": {
            "port": 9443,
            "urlPath": "/scheduler",
            "weight": 10,
            "ignorable": True,
            "extraArgs": ["--score", "binpack=2"],
        },
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    },
    "agent": {
        "runtimeClassName": "nvidia",
        "slotsPerGpu": 4,
        "nodeSelector": {"gpu": "on"},
        "hostPID": False,
    },
    "serviceAccounts": {"agent": {"create": True, "name": "tessera-node"}},
    "serviceMonitor": {"enabled": True, "skipCapabilityCheck": True, "additionalLabels": {"release": "kps"}},
    "dashboards": {"namespace": "monitoring", "label": "grafana.io/dashboard", "labelValue": "tessera"},
}
VALUE_SETS = {
    "default": None,
    "non-default": NON_DEFAULT,
    # The example in values.yaml's comment: a two-level hierarchy of team queues.
    "queues": {
        "queues": [
            {"name": "research", "spec": {"guaranteedGPUs": 16}},
            {
                "name": "team-a",
                "spec": {
                    "parent": "research",
                    "guaranteedGPUs": 8,
                    "maxGPUs": 24,
                    "weight": 2,
                    "reclaim": {"mode": "immediate", "minRuntimeSeconds": 600, "checkpointGraceSeconds": 30},
                },
            },
            {"name": "team-b", "spec": {"parent": "research", "guaranteedGPUs": 8}},
        ]
    },
    # GPU nodes reserved, namespaces routed by a label of the admin's.
    "gpu-nodes": {
        "gpuNodes": {"reserve": True, "namespaceLabel": {"key": "example.com/team", "value": "ml"}}
    },
    "agent-only": {
        "operator": {"enabled": False},
        "scheduler": {"enabled": False},
        "dashboards": {"enabled": False},
    },
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    rendered = render(VALUE_SETS[request.param])
    return request.param, objects(rendered) + objects(rendered, hooks=True)


def _older(version: str, than: str) -> bool:
    return tuple(map(int, version.split("."))) < tuple(map(int, than.split(".")))


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of the CRDs the chart ships."""
    schemas = {}
    for crd in chart_crds():
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def _check_service_monitor(obj: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    """No CRD schema for prometheus-operator here: check it selects a rendered Service with that port name."""
    spec = obj["spec"]
    selector = spec["selector"]["matchLabels"]
    services = [
        s
        for s in objs
        if s["kind"] == "Service" and selector.items() <= s["metadata"].get("labels", {}).items()
    ]
    assert len(services) == 1, f"{obj['metadata']['name']} selects {len(services)} Services"
    port_names = {p["name"] for p in services[0]["spec"]["ports"]}
    for endpoint in spec["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["honorLabels"] is True


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_rendered_object_validates(
    rendered: tuple[str, list[dict[str, Any]]], kube_version: str
) -> None:
    _, objs = rendered
    assert objs
    crd_schemas = _crd_schemas()
    for obj in objs:
        key = (obj["apiVersion"], obj["kind"])
        if key in crd_schemas and obj["apiVersion"].startswith("tessera.io/"):
            # Tessera's own kinds as the API server checks them: OpenAPI v3.0 (boolean exclusiveMinimum),
            # then the CEL rules.
            assert openapi_errors(obj, crd_schemas[key]) == [], obj["metadata"]["name"]
            assert cel_errors(obj, crd_schemas[key]) == [], obj["metadata"]["name"]
        elif key in crd_schemas:
            jsonschema.validate(obj, crd_schemas[key])
        elif obj["kind"] == "ServiceMonitor":
            _check_service_monitor(obj, objs)
        elif obj["kind"].startswith("MutatingAdmissionPolicy") and _older(kube_version, MAP_GA):
            continue  # admissionregistration.k8s.io/v1 from 1.36: the chart refuses to render it for older
        else:
            kubernetes_validate.validate(obj, kube_version, strict=True)


def test_shipped_crds_validate() -> None:
    for crd in chart_crds():
        kubernetes_validate.validate(crd, KUBE_VERSIONS[0], strict=True)


def test_chart_crds_are_the_generated_crds() -> None:
    # Helm reads CRDs only from the chart's own crds/ and cannot reach ../../crds, so the chart carries a
    # copy of what hack/gen-crds writes; this keeps the copy exact.
    generated = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    copied = {p.name: p.read_text() for p in (CHART / "crds").glob("tessera.io_*.yaml")}
    assert generated, "crds/ is empty: run hack/gen-crds"
    assert copied == generated, "charts/tessera/crds is stale: cp crds/tessera.io_*.yaml charts/tessera/crds/"
    kinds = {d["spec"]["names"]["kind"] for d in chart_crds()}
    assert {"App", "TrialGroup", "ModelDeployment", "ClusterKopfPeering", "KopfPeering"} <= kinds


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_lint_is_clean(values: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[values], strict=True, namespace=NAMESPACE, kube_version="v1.37.0")
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_services_select_pods_and_name_real_ports(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    workloads = [o for o in objs if o["kind"] in ("Deployment", "DaemonSet")]
    for svc in (o for o in objs if o["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        targets = [
            w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, svc["metadata"]["name"]
        container_ports = {
            p["name"]
            for c in targets[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in container_ports
    for w in workloads:
        assert (
            w["spec"]["selector"]["matchLabels"].items()
            <= w["spec"]["template"]["metadata"]["labels"].items()
        )


def test_operator_runs_two_peered_replicas() -> None:
    objs = objects(render())
    deploy = find(objs, "Deployment", "-operator")
    assert deploy["spec"]["replicas"] == 2
    command = " ".join(deploy["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "tessera --log-level INFO operator" in command
    assert "--peering tessera" in command and "--priority" in command and "--all-namespaces" in command
    assert find(objs, "ClusterKopfPeering")["metadata"]["name"] == "tessera"
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_uninstall_runs_a_hook_that_removes_the_agents_node_annotation_and_taint_or_gives_up() -> None:
    rendered = render()
    hooks = objects(rendered, hooks=True)
    assert {o["kind"] for o in hooks} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
    for obj in hooks:
        ann = obj["metadata"]["annotations"]
        # After the release is gone (agents and their rights too), so a Job that cannot run does not keep
        # the release half-removed; deleted whether it succeeded or failed.
        assert ann["helm.sh/hook"] == "post-delete"
        assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded,hook-failed"
    # The Job runs last, after its ServiceAccount and rights exist.
    weight = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hooks}
    assert weight["Job"] > max(w for k, w in weight.items() if k != "Job")
    job_obj = find(hooks, "Job")
    # It gives up within the deadline (uninstall waits no longer), and Helm prints a failed Job's logs.
    assert job_obj["spec"]["activeDeadlineSeconds"] == 40
    assert job_obj["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    deadline = render({"agent": {"cleanupDeadlineSeconds": 90}})
    assert find(objects(deadline, hooks=True), "Job")["spec"]["activeDeadlineSeconds"] == 90
    # NOTES say what is left when it gave up, and how to remove it.
    notes = rendered["tessera/templates/NOTES.txt"]
    assert "gives up\nafter 40 s" in notes
    assert "kubectl annotate nodes --all tessera.io/gpus-" in notes
    assert "kubectl taint nodes --all tessera.io/gpu-node-" in notes
    job = job_obj["spec"]["template"]["spec"]
    assert job["containers"][0]["command"][:2] == ["tessera-agent", "--forget-nodes"]
    assert job["securityContext"]["runAsNonRoot"] is True
    assert find(hooks, "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}
    ]
    # It runs where every node may be a reserved GPU node (gpuNodes.reserve).
    assert contract.gpu_node_toleration() in job["tolerations"]
    # The release's own objects do not include it, and without the agent there is nothing to clean.
    assert all("cleanup" not in o["metadata"]["name"] for o in objects(rendered))
    assert not objects(render({"agent": {"enabled": False}}), hooks=True)
    assert not objects(render({"agent": {"cleanupOnUninstall": False}}), hooks=True)


def test_scheduler_config_keeps_the_extender_contract() -> None:
    objs = objects(render())
    config = yaml.safe_load(find(objs, "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "tessera-scheduler"
    # Scores that spread by node resources would undo the extender's packing (test_scheduling.py).
    assert {p["name"] for p in profile["plugins"]["score"]["disabled"]} == {
        "NodeResourcesFit",
        "NodeResourcesBalancedAllocation",
        "ImageLocality",
    }
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8888"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["nodeCacheCapable"] is True and ext["weight"] > 0
    # No managed resources: kube-scheduler sends every pod of the profile (CPU-only ones too) to the
    # extender; its own fit check ignores the two resources no node advertises.
    assert "managedResources" not in ext
    (fit,) = [c for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    assert set(fit["args"]["ignoredResources"]) == {"tessera.io/gpu-memory", "tessera.io/gpu-compute"}
    assert config["percentageOfNodesToScore"] == 100
    pod = find(objs, "Deployment", "-scheduler")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["kube-scheduler", "extender"]
    assert "--config=/etc/tessera-scheduler/config.yaml" in pod["containers"][0]["command"]


def test_agent_daemonset_has_host_access_for_device_plugin_and_mps() -> None:
    objs = objects(render())
    pod = find(objs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu", contract.TAINT_GPU_NODE_KEY}
    (container,) = pod["containers"]
    assert (
        container["securityContext"]["privileged"] is True and container["securityContext"]["runAsUser"] == 0
    )
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"]}
    assert host_paths == {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/run/tessera/mps",  # each lane's own pipe/, log/ and shm/ under lanes/; no node-wide /dev/shm
        "/run/tessera/progress",
        "/sys/fs/cgroup",  # lanes' dmem limits on their pods' cgroups (agent.dmem.mode auto)
    }
    assert "/dev/shm" not in {m["mountPath"] for m in container["volumeMounts"]}
    (audit_mount,) = [m for m in container["volumeMounts"] if m["name"] == "pod-resources"]
    assert audit_mount == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    env = {e["name"] for e in container["env"]}
    assert "NODE_NAME" in env
    assert {"--mps-root=/run/tessera/mps", "--device-plugin-dir=/var/lib/kubelet/device-plugins"} <= set(
        container["args"]
    )
    assert "-v" not in container["args"]
    assert not [
        a for a in container["args"] if a.startswith(("--fake-gpu-backend", "--dev-root")) or a == "--no-mps"
    ]


@pytest.mark.parametrize("values", [{}, {"agent": {"healthPort": 9200}}])
def test_agent_probes_ask_its_health_endpoints_on_the_port_it_serves_them(values: dict[str, Any]) -> None:
    """Readiness from /readyz (the kubelet has the lanes' API), liveness from /healthz (the event loop answers)."""
    (container,) = find(objects(render(values)), "DaemonSet", "-agent")["spec"]["template"]["spec"][
        "containers"
    ]
    port = values.get("agent", {}).get("healthPort", 9103)
    assert f"--health-port={port}" in container["args"]
    assert {"name": "health", "containerPort": port, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


@pytest.mark.parametrize(
    ("values", "wanted", "unwanted"),
    [
        (  # MPS enforces: v3 namespaces where the driver has them, a daemon per lane, exclusive GPUs
            {},
            {"--mps-protocol=auto", "--mps-server-sharing=lane"},
            {"--no-mps", "--declared-only", "--no-exclusive-process"},
        ),
        (
            {"agent": {"mps": {"protocol": "v3", "serverSharing": "gpu", "exclusiveProcess": False}}},
            {"--mps-protocol=v3", "--mps-server-sharing=gpu", "--no-exclusive-process"},
            {"--no-mps"},
        ),
        ({"agent": {"enforcement": "declaredOnly"}}, {"--no-mps", "--declared-only"}, set()),
        (  # fake GPUs: the lanes' daemons are the fake MPS control binary's
            {"agent": {"fakeGpus": 2}},
            {
                "--fake-gpu-backend=2",
                "--mps-binary=tessera-fake-mps-control",
                "--dev-root=/run/tessera/fake-dev",
            },
            {"--declared-only", "--no-mps"},
        ),
        (
            {"agent": {"fakeGpus": 2, "enforcement": "declaredOnly"}},
            {"--fake-gpu-backend=2", "--no-mps", "--declared-only"},
            {"--mps-binary=tessera-fake-mps-control"},
        ),
    ],
)
def test_enforcement_values_reach_the_agent(
    values: dict[str, Any], wanted: set[str], unwanted: set[str]
) -> None:
    pod = find(objects(render(values)), "DaemonSet", "-agent")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert wanted <= set(container["args"]) and not unwanted & set(container["args"])
    fake_dev = [v for v in pod["volumes"] if v["name"] == "fake-dev"]
    assert bool(fake_dev) == ("fakeGpus" in values.get("agent", {}))


@pytest.mark.parametrize(
    ("dmem", "wanted", "unwanted", "mounted"),
    [
        ({}, {"--dmem=auto", "--cgroup-root=/host/sys/fs/cgroup"}, {"--no-dmem-guarantee"}, True),
        (
            {"mode": "required", "guarantee": False},
            {"--dmem=required", "--cgroup-root=/host/sys/fs/cgroup", "--no-dmem-guarantee"},
            set(),
            True,
        ),
        ({"mode": "off"}, {"--dmem=off"}, {"--cgroup-root=/host/sys/fs/cgroup"}, False),
    ],
)
def test_dmem_values_reach_the_agent_with_the_hosts_cgroups(
    dmem: dict[str, Any], wanted: set[str], unwanted: set[str], mounted: bool
) -> None:
    """The agent writes lanes' dmem limits on pods' cgroups in the host's hierarchy, mounted where
    --cgroup-root says (docs/node-agent.md, "GPU memory through cgroup dmem")."""
    pod = find(objects(render({"agent": {"dmem": dmem}})), "DaemonSet", "-agent")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert wanted <= set(container["args"]) and not unwanted & set(container["args"])
    volumes = [v for v in pod["volumes"] if v["name"] == "host-cgroup"]
    mounts = [m for m in container["volumeMounts"] if m["name"] == "host-cgroup"]
    if mounted:
        assert volumes == [
            {"name": "host-cgroup", "hostPath": {"path": "/sys/fs/cgroup", "type": "Directory"}}
        ]
        assert mounts == [{"name": "host-cgroup", "mountPath": "/host/sys/fs/cgroup"}]
    else:
        assert not volumes and not mounts


def test_lane_audit_and_handoff_values_reach_the_agent_the_extender_and_rbac() -> None:
    """The lane audit (agent) and the handoff (extender) are on by default; off, each says so in its args, and
    the audit's pods delete / events create grants go with it (docs/node-agent.md, docs/extender.md)."""

    def args(objs: list[dict], kind: str, suffix: str, container: str) -> list[str]:
        spec = find(objs, kind, suffix)["spec"]["template"]["spec"]
        return next(c for c in spec["containers"] if c["name"] == container)["args"]

    def agent_rules(objs: list[dict]) -> set[tuple[str, str]]:
        role = next(
            o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-agent")
        )
        return {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}

    on = objects(render())
    assert {
        "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
        "--lane-audit-interval=10",
        "--on-lane-mismatch=delete",
    } <= set(args(on, "DaemonSet", "-agent", "agent"))
    assert {"--handoff-wait=3", "--handoff-stale=60"} <= set(args(on, "Deployment", "-scheduler", "extender"))
    assert {("pods", "delete"), ("events", "create")} <= agent_rules(on)
    assert ("pods", "get") not in agent_rules(on)  # only the BE feedback loop reads a pod before deleting it

    off = objects(
        render(
            {
                "agent": {"laneAudit": {"enabled": False}},
                "scheduler": {"extender": {"handoff": {"enabled": False}}},
            }
        )
    )
    agent_args = args(off, "DaemonSet", "-agent", "agent")
    assert "--no-lane-audit" in agent_args and not [a for a in agent_args if a.startswith("--pod-resources")]
    assert "--no-allocate-handoff" in args(off, "Deployment", "-scheduler", "extender")
    assert not {("pods", "delete"), ("events", "create")} & agent_rules(off)
    spec = find(off, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    assert "pod-resources" not in {v["name"] for v in spec["volumes"]}
    report = objects(render({"agent": {"laneAudit": {"onMismatch": "report"}}}))
    assert "--on-lane-mismatch=report" in args(report, "DaemonSet", "-agent", "agent")


def test_fake_gpus_value_runs_the_fake_backend_and_the_fake_mps_control_binary() -> None:
    """`agent.fakeGpus` (for testing without GPUs): the in-memory backend with the real API and kubelet, and
    the lanes' daemons run by the fake MPS control binary that the image installs."""
    objs = objects(render({"agent": {"fakeGpus": 2}}))
    (container,) = find(objs, "DaemonSet", "-agent")["spec"]["template"]["spec"]["containers"]
    assert {"--fake-gpu-backend=2", "--mps-binary=tessera-fake-mps-control"} <= set(container["args"])
    assert "--no-mps" not in container["args"]
    assert "--fake-gpus" not in " ".join(container["args"]).replace("--fake-gpu-backend", "")


def _rules(objs: list[dict[str, Any]], kind: str, suffix: str) -> set[tuple[str, str, str]]:
    role = find(objs, kind, suffix)
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_least_privilege() -> None:
    objs = objects(render())
    extender = _rules(objs, "ClusterRole", "-scheduler-extender")
    assert extender == {
        ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"),
        ("", "pods/binding", "create"),
    }  # fmt: skip
    # kube-scheduler beside it runs under the built-in scheduler roles (events, its informers, volumes).
    bound = {o["roleRef"]["name"] for o in objs if o["kind"] == "ClusterRoleBinding"}
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= bound
    agent = _rules(objs, "ClusterRole", "-agent")
    # Allocate marks the pod it serves (tessera.io/allocated) and progress lands on the pod: pods patch.
    # Its node is read and patched: the inventory annotation, and the GPU-node taint set or removed.
    # The lane audit deletes a pod found on another pod's lane and says so in events.
    assert agent == {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "pods", "list"),
        ("", "pods", "patch"),
        ("", "pods", "delete"),
        ("", "events", "create"),
    }
    operator = _rules(objs, "ClusterRole", "-operator")
    assert ("", "pods", "create") in operator and ("", "pods", "delete") in operator
    assert ("tessera.io", "apps/status", "patch") in operator
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in operator
    # Nothing anywhere may touch secrets or use wildcards.
    for role in (o for o in objs if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            assert (
                "*" not in rule["verbs"]
                and "*" not in rule["resources"]
                and "secrets" not in rule["resources"]
            )


def test_dashboards_ship_as_sidecar_configmaps() -> None:
    objs = objects(render())
    maps = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    assert len(maps) == len(list((CHART / "dashboards").glob("*.json"))) == 5
    for cm in maps:
        ((key, text),) = cm["data"].items()
        source = CHART / "dashboards" / key.removeprefix("tessera-")
        assert json.loads(text) == json.loads(source.read_text())


def test_non_default_values_take_effect() -> None:
    objs = objects(render(NON_DEFAULT))
    deploy = find(objs, "Deployment", "gpu-share-operator")
    assert deploy["spec"]["replicas"] == 3
    assert (
        deploy["spec"]["template"]["spec"]["containers"][0]["image"]
        == "registry.example.com/ml/tessera:0.1.0-rc1"
    )
    assert deploy["metadata"]["labels"]["team"] == "ml-platform"
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "--namespace tessera-system" in args and '"--pass-deadline-seconds" "90"' in args
    assert "--lease-seconds 300 --preemption-grace-seconds 60 --fairness-knob 0.5 --starving-rank cap" in args
    assert "--no-renew-in-place" in args
    assert "--admission-threshold 1.5" in args
    # The gateways of ModelDeployments run the chart's own image.
    assert "--gateway-image registry.example.com/ml/tessera:0.1.0-rc1" in args
    assert find(objs, "KopfPeering")["metadata"]["namespace"] == NAMESPACE
    config = yaml.safe_load(find(objs, "ConfigMap", "-scheduler-config")["data"]["config.yaml"])
    assert config["extenders"][0]["urlPrefix"] == "http://127.0.0.1:9443/scheduler"
    assert config["profiles"][0]["schedulerName"] == "gpu-share"
    monitors = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 3 and all(m["metadata"]["labels"]["release"] == "kps" for m in monitors)
    dashboards = [
        o for o in objs if o["kind"] == "ConfigMap" and "grafana.io/dashboard" in o["metadata"]["labels"]
    ]
    assert len(dashboards) == 5 and {d["metadata"]["namespace"] for d in dashboards} == {"monitoring"}
    agent = find(objs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    assert agent["runtimeClassName"] == "nvidia" and agent["serviceAccountName"] == "tessera-node"
    assert {"--slots-per-gpu=4", "-v"} <= set(agent["containers"][0]["args"])


def test_service_monitors_need_the_crd_unless_told_otherwise() -> None:
    objs = objects(render({"serviceMonitor": {"enabled": True}}))
    assert not [o for o in objs if o["kind"] == "ServiceMonitor"]  # offline render: the CRD is not announced
    assert (
        "WARNING: serviceMonitor.enabled"
        in render({"serviceMonitor": {"enabled": True}})["tessera/templates/NOTES.txt"]
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": 0}}, "at '/operator/replicas': minimum: got 0, want 1"),
        ({"operatr": {"replicas": 2}}, "additional properties 'operatr' not allowed"),
        ({"agent": {"mpsRoot": "run/mps"}}, "at '/agent/mpsRoot'"),
        ({"agent": {"slotsPerGpu": 100}}, "at '/agent/slotsPerGpu': maximum"),
        ({"scheduler": {"extender": {"weight": 0}}}, "at '/scheduler/extender/weight': minimum"),
        ({"scheduler": {"extender": {"port": 70000}}}, "at '/scheduler/extender/port': maximum"),
        ({"scheduler": {"schedulerName": "Tessera_Scheduler"}}, "at '/scheduler/schedulerName'"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        ({"dashboards": {"labelValue": 1}}, "at '/dashboards/labelValue': got number, want string"),
        ({"serviceMonitor": {"interval": "often"}}, "at '/serviceMonitor/interval'"),
        ({"logLevel": "verbose"}, "at '/logLevel': value must be one of"),
        ({"operator": {"themis": {"fairnessKnob": 1.5}}}, "at '/operator/themis/fairnessKnob': maximum"),
        ({"operator": {"themis": {"starvingRank": "fifo"}}}, "at '/operator/themis/starvingRank'"),
        ({"operator": {"themis": {"renewInPlace": "no"}}}, "at '/operator/themis/renewInPlace'"),
        ({"operator": {"themis": {"leaseSeconds": 0}}}, "at '/operator/themis/leaseSeconds'"),
        ({"gpuNodes": {"reserve": "yes"}}, "at '/gpuNodes/reserve': got string, want boolean"),
        ({"agent": {"dmem": {"mode": "on"}}}, "at '/agent/dmem/mode': value must be one of"),
        # An empty value would be a label no namespace is meant to carry by accident.
        ({"gpuNodes": {"namespaceLabel": {"value": ""}}}, "at '/gpuNodes/namespaceLabel/value'"),
        ({"gpuNodes": {"namespaceLabel": {"key": "a b"}}}, "at '/gpuNodes/namespaceLabel/key'"),
        ({"agent": {"mps": {"protocol": "v4"}}}, "at '/agent/mps/protocol'"),
    ],
)
def test_schema_rejects_bad_values_with_the_offending_key(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError) as err:
            chart.validate_schema(values)
        assert message in str(err.value)
        with pytest.raises(helm.HelmValuesError):
            chart.render(values, name="t", namespace="t")


@pytest.mark.parametrize("path", [("image",), ("scheduler", "kubeScheduler", "image")])
def test_latest_tags_are_refused_with_a_clear_message(path: tuple[str, ...]) -> None:
    values: dict[str, Any] = {"tag": "latest"}
    for key in reversed(path):
        values = {key: values}
    with pytest.raises(helm.HelmRenderError, match="'latest' is not allowed; "):
        render(values)


def test_servers_shared_per_gpu_without_v3_are_refused_with_a_clear_message() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"agent\.mps\.serverSharing: gpu needs MPS v3 namespaces"):
        render({"agent": {"mps": {"protocol": "legacy", "serverSharing": "gpu"}}})


def test_schema_accepts_the_default_values() -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.values)
        assert chart.schema is not None and chart.schema["$schema"].startswith(
            "http://json-schema.org/draft-07"
        )


def test_kube_scheduler_tag_follows_the_cluster_unless_pinned() -> None:
    def image(values: dict[str, Any] | None) -> str:
        deployment = find(objects(render(values)), "Deployment", "-scheduler")
        (ks,) = [
            c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "kube-scheduler"
        ]
        return str(ks["image"])

    # Offline rendering has Helm's default capabilities; installed, the API server's version (checked on the
    # real control plane in tests/integration/k8s/test_chart_install.py).
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.\d+\.\d+", image(None))
    pinned = {"scheduler": {"kubeScheduler": {"image": {"tag": "v1.36.3"}}}}
    assert image(pinned) == "registry.k8s.io/kube-scheduler:v1.36.3"


def test_kube_scheduler_extra_args_follow_its_own_flags() -> None:
    def command(values: dict[str, Any] | None) -> list[str]:
        deployment = find(objects(render(values)), "Deployment", "-scheduler")
        (ks,) = [
            c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "kube-scheduler"
        ]
        return list(ks["command"])

    default = command(None)
    assert default[0] == "kube-scheduler" and not [a for a in default if "unschedulable" in a]
    retry = "--pod-max-in-unschedulable-pods-duration=60s"
    given = command({"scheduler": {"kubeScheduler": {"extraArgs": [retry]}}})
    assert given == [*default, retry]
    with pytest.raises(helm.HelmValuesError, match="extraArgs"):  # the schema: strings only
        render({"scheduler": {"kubeScheduler": {"extraArgs": [60]}}})
