"""A real Prometheus scrapes catalogue-built exporters, and every dashboard query returns data.

The exporters are the factories the components use (tessera.metrics, tessera_agent.metrics_factory), one
HTTP endpoint per component as in a cluster, filled with one small, consistent scene: two Apps, a
TrialGroup, a ModelDeployment and one GPU node with two lanes. The live-component version of this test
(operator on kmock, extender, agent on fake NVML, gateway) replaces the scene once those are wired.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from tessera.api import metrics_catalog as catalog
from tessera.api.metrics_catalog import Component, MetricType
from tessera.metrics import ComponentMetrics
from tessera_agent.metrics_factory import AgentMetrics

from .conftest import StartPrometheus
from .prom_server import free_port

DASHBOARDS = Path(__file__).resolve().parents[3] / "charts" / "tessera" / "dashboards"

# Label values of the scene; lanes and GPUs use the same node/gpu on the agent and the extender so joins work.
SCENE_LABELS = {
    "namespace": ["ml"],
    "app": ["resnet", "bert-pretrain"],
    "trialgroup": ["lr-sweep"],
    "trial": ["t0", "t1"],
    "modeldeployment": ["bert-qa"],
    "pool": ["web"],
    "node": ["gpu-node-1"],
    "gpu": ["0"],
    "uuid": ["GPU-6a7b8c9d-0000-4000-8000-000000000000"],
    "lane": ["l0", "l1"],
    "queue": ["team-a"],
    "pod": ["worker-0"],
    "workload": ["training", "trial", "serving"],
    "change": ["granted", "revoked"],
    "state": ["running", "ready", "desired"],
    "verb": ["filter", "prioritize", "bind"],
    "result": ["ok"],
    "reason": ["none"],
    "outcome": ["slo_met", "slo_missed"],
    "action": ["deleted", "reported"],
    "limit": ["memory", "compute"],
    "mechanism": ["mps-daemon-per-lane"],
    "kind": ["App", "TrialGroup", "ModelDeployment", "Pod"],
}


def _label_sets(labels: tuple[str, ...]) -> list[dict[str, str]]:
    sets: list[dict[str, str]] = [{}]
    for label in labels:
        sets = [{**s, label: v} for s in sets for v in SCENE_LABELS[label]]
    return sets


class Scene:
    """Writes the scene into one component's metrics; `step` advances counters and histograms."""

    def __init__(self, component: Component, registry: CollectorRegistry) -> None:
        self.component = component
        self.specs = [s for s in catalog.for_component(component) if s.name != "tessera_build_info"]
        if component is Component.AGENT:
            agent = AgentMetrics(registry)
            self.gauge, self.counter = agent.gauge, agent.counter
            self.histogram = None
        else:
            metrics = ComponentMetrics.create(component, registry)
            self.gauge, self.counter, self.histogram = metrics.gauge, metrics.counter, metrics.histogram

    def step(self, i: int) -> None:
        for spec in self.specs:
            for n, labels in enumerate(_label_sets(spec.labels)):
                value = 0.5 + 0.25 * n + 0.1 * i  # distinct per series so rho differs across Apps
                if spec.type is MetricType.GAUGE:
                    if spec.name == "tessera_gpu_healthy":
                        value = 1
                    gauge = self.gauge(spec.name)
                    (gauge.labels(**labels) if labels else gauge).set(value)
                elif spec.type is MetricType.COUNTER:
                    metric = self.counter(spec.name)
                    (metric.labels(**labels) if labels else metric).inc(1 + n + i)
                else:
                    assert self.histogram is not None
                    hist = self.histogram(spec.name)
                    for sample in (spec.buckets[0], spec.buckets[len(spec.buckets) // 2]):
                        (hist.labels(**labels) if labels else hist).observe(sample)


@pytest.fixture
def exporters() -> Iterator[tuple[dict[str, list[str]], list[Scene]]]:
    targets: dict[str, list[str]] = {}
    scenes, servers = [], []
    for component in (Component.OPERATOR, Component.EXTENDER, Component.AGENT, Component.GATEWAY):
        registry = CollectorRegistry()
        scene = Scene(component, registry)
        scene.step(0)
        port = free_port()
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        servers.append(server)
        scenes.append(scene)
        targets[f"tessera-{component.value}"] = [f"127.0.0.1:{port}"]
    yield targets, scenes
    for server in servers:
        server.shutdown()


def _dashboard_queries() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dash: dict[str, Any] = json.loads(path.read_text())
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                found.append((path.name, f"{panel['title']} [{target['refId']}]", target["expr"]))
    return found


def _as_promql(expr: str) -> str:
    """Grafana's variables as Grafana would expand them with 'All' selected."""
    expr = expr.replace("$__rate_interval", "30s")
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", ".*", expr)


@pytest.mark.slow
def test_every_dashboard_query_returns_data(
    prometheus: StartPrometheus, exporters: tuple[dict[str, list[str]], list[Scene]]
) -> None:
    targets, scenes = exporters
    server = prometheus(targets)
    server.wait_for(f"count(up == 1) == {len(targets)}")
    # rate() needs two scrapes that saw the counters move.
    for i in range(1, 4):
        server.wait_for(f"count(count_over_time(tessera_build_info[30s]) >= {i + 1}) == {len(targets)}")
        for scene in scenes:
            scene.step(i)
    server.wait_for("count_over_time(tessera_auction_rounds_total[30s]) >= 4")

    queries = _dashboard_queries()
    assert len(queries) >= 30
    empty = []
    for dashboard, where, expr in queries:
        if not server.query(_as_promql(expr)):
            empty.append(f"{dashboard} {where}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)

    # One query checked for its value, not just presence: Jain's index over the two Apps' rho.
    rho = {r["metric"]["app"]: float(r["value"][1]) for r in server.query("tessera_app_rho")}
    assert len(rho) == 2
    jain_expr = next(e for d, _, e in queries if d == "fairness.json" and "count(tessera_app_rho" in e)
    (jain,) = server.query(_as_promql(jain_expr))
    expected = sum(rho.values()) ** 2 / (len(rho) * sum(v * v for v in rho.values()))
    assert float(jain["value"][1]) == pytest.approx(expected, rel=1e-9)
    assert 0.5 <= expected < 1.0
