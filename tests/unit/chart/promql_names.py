"""Metric names a PromQL expression selects, found with a small tokenizer (no PromQL parser on PyPI).

What counts as a metric name: an identifier that is not a function or aggregation (followed by `(`), not a
keyword or modifier, not a label name inside `{...}` or inside the parenthesised list after
`by`/`without`/`on`/`ignoring`/`group_left`/`group_right`, and not a duration inside `[...]`. String
literals are skipped whole, so label values never count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_TOKEN = re.compile(
    r"""
      (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    | (?P<range>\[[^\]]*\])
    | (?P<duration>(?:[0-9]+(?:ms|[smhdwy]))+\b)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<number>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)
    | (?P<var>\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)
    | (?P<punct>[(){},]|==|!=|=~|!~|<=|>=|[-+*/%^<>=])
    | (?P<space>\s+)
    """,
    re.VERBOSE,
)
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}
)
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_LITERALS = frozenset({"inf", "nan"})
# Aggregation operators may be followed by `by (...)` before their `(`, so they are not always calls.
_AGGREGATIONS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    }
)


class PromQLSyntaxError(ValueError):
    pass


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise PromQLSyntaxError(f"cannot tokenize {expr[pos : pos + 20]!r} at offset {pos} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            yield kind, match.group()
        pos = match.end()


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects. Raises PromQLSyntaxError on unbalanced brackets."""
    tokens = list(_tokens(expr))
    names: set[str] = set()
    brace_depth = 0
    label_list_depth: int | None = None  # paren depth at which a by(...)/on(...) list is open
    paren_depth = 0
    for i, (kind, text) in enumerate(tokens):
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "punct":
            if text == "{":
                brace_depth += 1
            elif text == "}":
                brace_depth -= 1
            elif text == "(":
                paren_depth += 1
            elif text == ")":
                if label_list_depth == paren_depth:
                    label_list_depth = None
                paren_depth -= 1
            if brace_depth < 0 or paren_depth < 0:
                raise PromQLSyntaxError(f"unbalanced brackets in {expr!r}")
            continue
        if kind != "ident" or brace_depth > 0 or label_list_depth is not None:
            continue
        lowered = text.lower()
        if lowered in _LABEL_LIST_KEYWORDS:
            if nxt == "(":
                label_list_depth = paren_depth + 1
            continue
        if lowered in _KEYWORDS or lowered in _LITERALS or lowered in _AGGREGATIONS or nxt == "(":
            continue  # keyword, literal, or function / aggregation call
        names.add(text)
    if brace_depth or paren_depth:
        raise PromQLSyntaxError(f"unbalanced brackets in {expr!r}")
    return names


_LABEL_VALUES = re.compile(
    r"^\s*label_values\((?P<selector>.*),\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$"
)


def variable_query_selector(query: str) -> str:
    """The PromQL part of a Grafana `label_values(selector, label)` variable query."""
    match = _LABEL_VALUES.match(query)
    return match.group("selector") if match else query


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of a Grafana dashboard."""
    found: list[tuple[str, str]] = []

    def walk_panels(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                found.append((f"panel {panel.get('title')!r} target {target.get('refId')}", target["expr"]))
            walk_panels(panel.get("panels", []))  # rows nest panels

    walk_panels(dashboard.get("panels", []))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            found.append((f"variable {var['name']!r}", variable_query_selector(query)))
    return found


def load_dashboards(directory: Path) -> dict[str, dict[str, Any]]:
    dashboards = {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
    if not dashboards:
        raise FileNotFoundError(f"no dashboards in {directory}")
    return dashboards
