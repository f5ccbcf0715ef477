"""The shipped KubeSchedulerConfiguration passes kube-scheduler's extender validation rules (§2.2-2.3)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from tessera.api import contract

CONFIG = Path(__file__).parents[3] / "deploy" / "scheduler" / "kube-scheduler-config.yaml"


def test_scheduler_config_sends_every_pod_to_the_extender() -> None:
    doc = yaml.safe_load(CONFIG.read_text())
    assert (
        doc["apiVersion"] == "kubescheduler.config.k8s.io/v1" and doc["kind"] == "KubeSchedulerConfiguration"
    )
    assert [p["schedulerName"] for p in doc["profiles"]] == [contract.SCHEDULER_NAME]
    (ext,) = doc["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["weight"] > 0  # required when prioritizeVerb is set
    assert ext["nodeCacheCapable"] is True
    # Every pod of the profile reaches the extender (no managedResources), and kube-scheduler's fit check
    # ignores the two resources no node advertises.
    assert "managedResources" not in ext
    (profile,) = doc["profiles"]
    (fit,) = [c for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    ignored = fit["args"]["ignoredResources"]
    assert set(ignored) == {contract.RESOURCE_GPU_MEMORY, contract.RESOURCE_GPU_COMPUTE}
    assert all(re.fullmatch(r"[a-z0-9.-]+/[a-z0-9-]+", name) for name in ignored)
    assert doc["percentageOfNodesToScore"] == 100


def test_extender_command_is_registered() -> None:
    from tessera.cli import build_parser

    args = build_parser().parse_args(
        ["extender", "--port", "9999", "--kubeconfig", "/nope", "--score", "spread=2"]
    )
    assert args.port == 9999 and args.func is not None
    from tessera.commands.extender import placement_config

    assert placement_config(args).weights == (("spread", 2.0),)
