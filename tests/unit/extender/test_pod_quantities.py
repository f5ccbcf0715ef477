"""CPU and memory a pod requests, as the extender reads them: any quantity the API server writes, through
the official client's parser (`8k` is how the server returns 8000; `16Gi` is 16 GiB of bytes)."""

from __future__ import annotations

import pytest
from tessera.extender.view import PodRequestError, pod_cpu_memory


def _pod(*containers: dict[str, dict[str, str]]) -> dict[str, object]:
    return {"spec": {"containers": [{"resources": c} for c in containers]}}


@pytest.mark.parametrize(
    ("requests", "cpu_milli", "memory_mib"),
    [
        ({"cpu": "8k", "memory": "16Gi"}, 8_000_000.0, 16384.0),
        ({"cpu": "500m", "memory": "512Mi"}, 500.0, 512.0),
        ({"cpu": "2", "memory": "8k"}, 2000.0, 8000 / (1 << 20)),  # memory counts bytes: 8k is 8000 bytes
        ({"cpu": "1.5", "memory": "1G"}, 1500.0, 1e9 / (1 << 20)),
    ],
)
def test_suffixed_quantities_are_read_in_their_units(
    requests: dict[str, str], cpu_milli: float, memory_mib: float
) -> None:
    assert pod_cpu_memory(_pod({"requests": requests})) == pytest.approx((cpu_milli, memory_mib))


def test_containers_add_up_and_a_limit_stands_for_a_missing_request() -> None:
    pod = _pod(
        {"requests": {"cpu": "8k"}}, {"limits": {"cpu": "1", "memory": "16Gi"}, "requests": {"cpu": "250m"}}
    )
    assert pod_cpu_memory(pod) == (8_000_250.0, 16384.0)


@pytest.mark.parametrize("bad", ["8kb", "16GB", "lots", "", "1e999", "-1", "-500m"])
def test_a_bad_quantity_is_a_pod_request_error(bad: str) -> None:
    with pytest.raises(PodRequestError, match="bad quantity"):
        pod_cpu_memory(_pod({"requests": {"memory": bad}}))
