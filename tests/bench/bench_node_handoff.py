"""Benchmark: pods with equal requests bound to one real node at once, with and without the extender's handoff.

    .venv/bin/python tests/bench/bench_node_handoff.py [--rounds 20] [--pods 4] [--no-baseline]

It starts the one-node cluster of tests/integration/node (real kubelet, containerd, runc; the chart installed
with Helm from the images built here; the agent on its fake GPU backend), then runs rounds: each creates
`--pods` lane pods with equal requests at once in a namespace routed to tessera-scheduler, waits until all
have finished, and checks each container's CUDA_VISIBLE_DEVICES and TESSERA_LANE_ID against its pod's
assignment (tests/integration/node/together.py). First with the chart's handoff on (the default), then — the
baseline, side by side — with `scheduler.extender.handoff.enabled=false` (a `helm upgrade`).

Per configuration: rounds, pods, containers on another pod's lane (must be 0), pods the kubelet failed because
Allocate refused to guess (0 with the handoff), pods bound per second on the one node (creation of the first
pod → the last bound; median and worst round) and seconds until every pod of a round has run (median).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tessera.progress import Progress

from tests.integration.k8s.admin_cli import AdminCLI, find_cli
from tests.integration.k8s.controlplane import wait_until
from tests.integration.node.node import one_node_cluster
from tests.integration.node.test_chart_on_node import (
    NS,
    RELEASE,
    chart_values,
    helm_install,
    pods,
    ready,
    route_to_tessera,
)
from tests.integration.node.together import Round, bind_together
from tests.unit.chart.chart_render import CHART


def run_rounds(node: object, namespace: str, rounds: int, count: int, label: str) -> list[Round]:
    out = []
    with Progress(rounds, label, enabled=True) as progress:
        for r in range(rounds):
            out.append(bind_together(node, namespace, count, f"{label[:3]}{r}"))  # type: ignore[arg-type]
            progress.update(r + 1, f"{sum(len(x.mismatches) for x in out)} mismatched")
    return out


def row(label: str, rounds: list[Round]) -> str:
    rates = [r.binds_per_second for r in rounds]
    return (
        f"| {label} | {len(rounds)} | {sum(r.pods for r in rounds)} | {sum(len(r.mismatches) for r in rounds)} | "
        f"{sum(len(r.refused) for r in rounds)} | {statistics.median(rates):.2f} [{min(rates):.2f}] | "
        f"{statistics.median(r.seconds_to_done for r in rounds):.1f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pods", type=int, default=4, help="pods bound together per round (default 4)")
    parser.add_argument("--no-baseline", action="store_true", help="only the handoff on")
    args = parser.parse_args()
    with one_node_cluster() as node:
        values = chart_values(node)
        cli = AdminCLI(find_cli(), node.plane.kubeconfig, node.plane.workdir / "helm-home")
        helm_install(node, cli, RELEASE, values)
        wait_until(
            lambda: len(got := pods(node, NS)) == 4 and all(ready(p) for p in got), 300, "the chart's pods"
        )
        namespace = f"bench-{secrets.token_hex(3)}"
        status, body = node.plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        assert status == 201, body
        route_to_tessera(node, namespace)
        wait_until(
            lambda: (
                node.plane.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200
            ),
            60,
            "the namespace's default ServiceAccount",
        )
        results = {"handoff on": run_rounds(node, namespace, args.rounds, args.pods, "handoff on")}
        if not args.no_baseline:
            values["scheduler"]["extender"] = {"handoff": {"enabled": False}}
            path = node.plane.workdir / "handoff-off.yaml"
            path.write_text(yaml.safe_dump(values))
            cli.helm("upgrade", RELEASE, str(CHART), "-n", NS, "-f", str(path), "--timeout", "300s")
            # four pods again, all Ready: the old scheduler pod (and its extender) is gone
            wait_until(
                lambda: len(got := pods(node, NS)) == 4 and all(ready(p) for p in got),
                300,
                "the chart's pods after the upgrade",
            )
            results["handoff off"] = run_rounds(node, namespace, args.rounds, args.pods, "handoff off")
    print(f"\n{args.pods} pods with equal requests bound to one node at once, per round:\n")
    print(
        "| extender | rounds | pods | on another pod's lane | refused by Allocate | binds/s median [worst] | s to all done |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, rounds in results.items():
        print(row(label, rounds))
    for label, rounds in results.items():
        for r in rounds:
            for problem in r.mismatches + r.refused:
                print(f"  {label}: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
