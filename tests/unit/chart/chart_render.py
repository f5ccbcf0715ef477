"""Render the chart with the real Helm engine (helm-python-sdk) and load the objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "tessera"
RELEASE = "tessera"
NAMESPACE = "tessera-system"


def render(
    values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included), as release `name` into `namespace`."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name=name, namespace=namespace, is_install=True)


def objects(rendered: dict[str, str], *, hooks: bool = False) -> list[dict[str, Any]]:
    """Every Kubernetes object the templates produced that the release holds; with `hooks`, only the Helm
    hooks instead (made for an install or uninstall step, not kept as the release's objects)."""
    found: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                annotations = doc.setdefault("metadata", {}).setdefault("annotations", {})
                if ("helm.sh/hook" in annotations) == hooks:
                    found.append(doc)
    return found


def find(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    if len(matches) != 1:
        raise AssertionError(
            f"expected one {kind} named *{name_suffix}, found {[o['metadata']['name'] for o in matches]}"
        )
    return matches[0]


def chart_crds() -> list[dict[str, Any]]:
    return [
        doc
        for p in sorted((CHART / "crds").glob("*.yaml"))
        for doc in yaml.safe_load_all(p.read_text())
        if doc
    ]
