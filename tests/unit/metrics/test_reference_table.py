"""docs/operations.md carries the metric reference generated from the catalogue, and it is current."""

from __future__ import annotations

from pathlib import Path

import pytest
from tessera import metrics
from tessera.api.metrics_catalog import CATALOG

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def test_operations_doc_has_the_current_metric_table() -> None:
    text = DOC.read_text()
    assert metrics.with_table(text) == text, (
        "docs/operations.md's metric table is stale: run .venv/bin/python -m tessera.metrics docs/operations.md"
    )


def test_table_has_one_row_per_catalogue_entry_with_its_labels() -> None:
    rows = [r for r in metrics.markdown_table().splitlines() if r.startswith("| `tessera_")]
    assert len(rows) == len(CATALOG)
    binds = next(r for r in rows if r.startswith("| `tessera_extender_binds_total`"))
    assert "| counter | `outcome`, `reason` | extender |" in binds


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(ValueError, match="metrics-table:begin"):
        metrics.with_table("# no table here\n")
