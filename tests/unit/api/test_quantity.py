"""Tessera's resource quantities read as the API server returns them (canonical form)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from tessera.api.contract import RESOURCE_GPU, RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY
from tessera.api.quantity import QuantityError, resource_quantity


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        ("8000", 8000),
        ("8k", 8000),  # what the API server returns for 8000
        ("16Gi", 16384),  # binary suffix: bytes
        ("16384Mi", 16384),
        ("512Mi", 512),
        ("1048576Ki", 1024),
        ("4e3", 4000),
        ("1000m", 1),
        (4096, 4096),
        (Decimal("2048"), 2048),
    ],
)
def test_gpu_memory_in_mib(value: object, mib: int) -> None:
    assert resource_quantity(RESOURCE_GPU_MEMORY, value) == mib


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("1e999", "more than 16777216 MiB"),
        ("1e999999999", "more than 16777216 MiB"),
        ("0.5", "0.5 MiB, not a whole number of MiB"),
        ("1536Ki", "1.5 MiB, not a whole number"),
        ("500m", "not a whole number"),
        ("-1", "negative"),
        ("-1Gi", "negative"),
        ("0", "at least 1 (left out, it defaults to the whole GPU)"),
        ("abc", "not a Kubernetes quantity"),
        ("", "not a Kubernetes quantity"),
        ("8kb", "not a Kubernetes quantity"),
        ("1mi", "not a Kubernetes quantity"),  # lower-case m is milli, never a binary suffix
        ("NaN", "not a finite"),
        ("Infinity", "not a finite"),
        (float("inf"), "not a finite"),
        (True, "not a Kubernetes quantity"),
        (None, "not a Kubernetes quantity"),
        (["1"], "not a Kubernetes quantity"),
    ],
)
def test_gpu_memory_refused_with_the_reason(value: object, why: str) -> None:
    with pytest.raises(QuantityError) as err:
        resource_quantity(RESOURCE_GPU_MEMORY, value)
    assert str(err.value).startswith(f"{RESOURCE_GPU_MEMORY} {value!r}")
    assert why in str(err.value)


def test_counts_read_decimal_suffixes_and_refuse_bytes() -> None:
    assert resource_quantity(RESOURCE_GPU, "2") == 2
    assert resource_quantity(RESOURCE_GPU, "1k") == 1000
    assert resource_quantity(RESOURCE_GPU_COMPUTE, "25") == 25
    assert resource_quantity(RESOURCE_GPU_COMPUTE, "100") == 100
    with pytest.raises(QuantityError) as err:
        resource_quantity(RESOURCE_GPU_COMPUTE, "1Ki")
    assert "binary suffix means bytes; tessera.io/gpu-compute counts percent" in str(err.value)
    with pytest.raises(QuantityError) as err:
        resource_quantity(RESOURCE_GPU, "1Ki")
    assert "binary suffix means bytes; tessera.io/gpu counts GPUs" in str(err.value)


@pytest.mark.parametrize(
    ("resource", "value", "why"),
    [
        (RESOURCE_GPU_COMPUTE, "101", "more than 100 percent"),
        (RESOURCE_GPU_COMPUTE, "1e999", "more than 100 percent"),
        (RESOURCE_GPU_COMPUTE, "12.5", "not a whole number of percent"),
        (RESOURCE_GPU_COMPUTE, "0", "at least 1 (left out, it defaults to the pod's share"),
        (RESOURCE_GPU, "0", "at least 1"),
        (RESOURCE_GPU, "-2", "negative"),
        (RESOURCE_GPU, "1e999", "more than 1024 GPUs"),
        (RESOURCE_GPU, "0.5", "not a whole number of GPUs"),
    ],
)
def test_counts_refused_with_the_reason(resource: str, value: str, why: str) -> None:
    with pytest.raises(QuantityError) as err:
        resource_quantity(resource, value)
    assert str(err.value).startswith(f"{resource} {value!r}")
    assert why in str(err.value)


def test_only_tessera_resources() -> None:
    with pytest.raises(KeyError):
        resource_quantity("nvidia.com/gpu", "1")


def test_pod_totals_sums_each_resource_over_containers_limit_before_request() -> None:
    from tessera.api.quantity import pod_totals

    spec = {
        "containers": [
            {"resources": {"requests": {"tessera.io/gpu": "1"}, "limits": {"tessera.io/gpu": "2"}}},
            {"resources": {"requests": {"tessera.io/gpu-memory": "8Gi", "cpu": "1"}}},
            {"name": "no-resources"},
        ]
    }
    assert pod_totals(spec) == {
        "tessera.io/gpu": 2,
        "tessera.io/gpu-memory": 8192,
        "tessera.io/gpu-compute": 0,
    }
    assert pod_totals({"containers": [{"resources": {"limits": {"cpu": "1"}}}]}) is None
    with pytest.raises(QuantityError, match=r"tessera\.io/gpu .*not a whole number"):
        pod_totals({"containers": [{"resources": {"limits": {"tessera.io/gpu": "1.5"}}}]})
