"""Profiles from the paper's examples, shared by the AlpaServe tests."""

from __future__ import annotations

import numpy as np
from tessera.policy.serving.alpaserve import GB, ModelProfile, ParallelConfig, StageProfile, Workload
from tessera.sim.serving.arrivals import gamma_arrivals

P1, P2 = ParallelConfig(1), ParallelConfig(2)


def two_model_profiles(alpha: float = 1.0, d: float = 0.4) -> dict[str, ModelProfile]:
    """Paper §3.1: two 13.4 GB Transformer-6.7B models, 0.4 s on one GPU, or 2 stages of α·0.2 s."""
    out = {}
    for name in ("m1", "m2"):
        out[name] = ModelProfile(
            name,
            d,
            13.4 * GB,
            {
                P1: StageProfile((d,), (13.4 * GB,)),
                P2: StageProfile((alpha * d / 2,) * 2, (6.7 * GB,) * 2),
            },
        )
    return out


def gamma_workload(
    rates: dict[str, float], cv: float, duration: float, slo: dict[str, float], seed: int
) -> Workload:
    rng = np.random.default_rng(seed)
    streams = {m: gamma_arrivals(r, cv, duration, rng) for m, r in rates.items()}
    return Workload.from_streams(streams, slo)
