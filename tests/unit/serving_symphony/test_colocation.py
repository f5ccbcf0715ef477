"""Symphony beside BE lanes: planning with the dedicated ℓ(b) starts a batch too late for a GPU slowed by
colocation, the colocated profile (ℓ times the observed inflation) starts it in time; the gateway's config
builds its scheduler with that profile."""

from __future__ import annotations

import math

import pytest
from tessera.gateway.config import ConfigError, GatewayConfig, build_scheduler
from tessera.policy.serving.common import Batch, LinearProfile, Request
from tessera.policy.serving.symphony import SymphonyScheduler
from tessera.policy.serving.symphony.colocation import colocated_profile, observed_inflation

DEDICATED = LinearProfile(0.010, 0.020, max_batch=8)  # ℓ(1) = 30 ms, ℓ(2) = 40 ms
INFLATION = observed_inflation(p99_colocated=0.045, p99_dedicated=0.030)  # 1.5x


def first_batch(profile: LinearProfile) -> Batch:
    s = SymphonyScheduler({"m": profile}, 1)
    s.enqueue(Request(0, "m", 0.0, 0.100), 0.0)
    t = s.next_timer()
    assert t is not None
    (batch,) = s.advance(t)
    return batch


def test_dedicated_profile_misses_the_deadline_on_a_shared_gpu() -> None:
    actual = colocated_profile(DEDICATED, INFLATION)  # what the shared GPU really takes
    late = first_batch(DEDICATED)
    assert late.start == pytest.approx(0.100 - DEDICATED(2))  # the frontrun: d − ℓ(|B|+1) = 60 ms
    assert late.start + actual(late.size) > 0.100  # 60 + 45 ms: the request is late
    on_time = first_batch(actual)
    assert on_time.start == pytest.approx(0.100 - actual(2))  # 40 ms
    assert on_time.start + actual(on_time.size) <= 0.100  # 40 + 45 ms


def test_inflation_scales_the_profile_and_its_table() -> None:
    p = colocated_profile(LinearProfile(0.01, 0.02, max_batch=4, table={3: 0.06}), 2.0)
    assert (p.alpha, p.beta, p.max_batch, p(3), p(2)) == pytest.approx((0.02, 0.04, 4, 0.12, 0.08))
    assert observed_inflation(0.02, 0.03) == 1.0  # never below dedicated
    for bad in (0.5, math.nan, math.inf):
        with pytest.raises(ValueError, match="inflation"):
            colocated_profile(DEDICATED, bad)
    with pytest.raises(ValueError, match="dedicated p99"):
        observed_inflation(0.02, 0.0)


def gateway(inflation: object) -> GatewayConfig:
    symphony: dict[str, object] = {"alpha": 0.01, "beta": 0.02}
    if inflation is not None:
        symphony["colocation_inflation"] = inflation
    return GatewayConfig.parse(
        {
            "models": [
                {
                    "name": "m",
                    "policy": "symphony",
                    "slo_s": 0.1,
                    "workers": ["http://127.0.0.1:9001"],
                    "symphony": symphony,
                }
            ]
        }
    )


def test_gateway_plans_with_the_colocated_profile() -> None:
    for inflation, want in ((None, 1.0), (1.5, 1.5)):
        s = build_scheduler(gateway(inflation).models[0])
        assert isinstance(s, SymphonyScheduler)
        assert s.profiles["m"](1) == pytest.approx(0.030 * want)
    with pytest.raises(ConfigError, match="colocation_inflation"):
        gateway(0.9)
