"""Dashboard queries as PromQL Prometheus can run, and the catalogue metrics each one names.

The parsing lives in tests/unit/chart/promql_names.py (checked by the chart's unit tests); this module
loads it and expands Grafana's variables the way Grafana does with "All" selected.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from tessera.api import metrics_catalog as catalog

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = ROOT / "charts" / "tessera" / "dashboards"


def _promql_names():  # type: ignore[no-untyped-def]
    name = "_promql_names"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests/unit/chart/promql_names.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def as_promql(expr: str) -> str:
    """Grafana's variables as Grafana would expand them with 'All' selected."""
    expr = expr.replace("$__rate_interval", "30s")
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", ".*", expr)


def dashboard_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard file, where, expression as written, PromQL) for every panel target and query variable."""
    names = _promql_names()
    out = []
    for file, dash in names.load_dashboards(DASHBOARDS).items():
        for where, expr in names.dashboard_exprs(dash):
            out.append((file, where, expr, as_promql(expr)))
    return out


def dashboard_metrics(expr: str) -> set[str]:
    """The catalogue families `expr` selects (`x_bucket` -> `x`)."""
    return {catalog.base_name(n) for n in _promql_names().metric_names(as_promql(expr))}
