"""Offline profiling of a model on a live worker: the inputs Orloj and the baselines need up front.

* Per-application **priors**: solo execution times of sample requests (Orloj §3.2: user-provided
  priors until enough samples exist); the online profiler refines them while serving.
* The **batching model** l_B(k) = a_k + s_k · max solo, fitted per batch size by least squares on batches
  of known members (Orloj Eq. 3-4; the paper leaves the fit open, so Tessera regresses measured
  batch time on max(l) for each k). The batch time is the round trip the gateway sees — request encoding, HTTP
  and the worker's run — since that is what decides whether a batch finishes by its deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from tessera.gateway.batch_wire import WorkerAnswer, WorkerFailure, post_batch
from tessera.gateway.config import LatencyConfig
from tessera.gateway.protocol import dumps


@dataclass(frozen=True)
class Calibration:
    priors: dict[str, list[float]]  # app -> solo seconds, one per sample payload
    latency: LatencyConfig
    mean_solo_s: float

    def as_config(self) -> dict[str, Any]:
        """The fields of a ModelConfig this calibration fills in."""
        return {
            "priors": self.priors,
            "latency": self.latency.model_dump(),
            "mean_solo_s": self.mean_solo_s,
        }


async def _batch(
    session: aiohttp.ClientSession, url: str, model: str, payloads: Sequence[Mapping[str, Any]], solo: bool
) -> WorkerAnswer:
    """One batch over the same wire as the gateway's (:mod:`tessera.gateway.batch_wire`)."""
    try:
        answer = await post_batch(
            session, url.rstrip("/"), model, [dumps(p) for p in payloads], solo=solo, timeout_s=60.0
        )
    except WorkerFailure as err:
        raise RuntimeError(f"worker {url} refused the calibration batch: {err}") from None
    for i, (status, fragment, _) in enumerate(answer.members):
        if status != 200:
            raise ValueError(f"calibration payload {i} was refused by the worker: {fragment.decode()}")
    return answer


async def solo_times(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    payloads: Sequence[Mapping[str, Any]],
    repeats: int = 2,
) -> list[float]:
    """Each payload run alone ``repeats`` times; the minimum (least disturbed) time of each."""
    best = [float("inf")] * len(payloads)
    for _ in range(repeats):
        data = await _batch(session, url, model, payloads, solo=True)
        if data.solo_seconds is None:
            raise RuntimeError(f"worker {url} sent no solo timings for a solo batch")
        best = [
            min(b, float(t if t is not None else "inf")) for b, t in zip(best, data.solo_seconds, strict=True)
        ]
    return best


def fit_per_size(samples: Mapping[int, Sequence[tuple[float, float]]]) -> LatencyConfig:
    """Least squares of batch time on max solo time for each k: {k: [(max_solo, batch_time), ...]}.

    A negative intercept or a degenerate spread of max solo times falls back to a fit through the origin,
    so the model never predicts a batch faster than its members' scaled maximum.
    """
    table: dict[int, tuple[float, float]] = {}
    for k, pts in sorted(samples.items()):
        if not pts:
            raise ValueError(f"no calibration batches of size {k}")
        m = np.array([p[0] for p in pts])
        t = np.array([p[1] for p in pts])
        a, s = 0.0, float(np.dot(m, t) / np.dot(m, m))
        if m.size >= 3 and np.ptp(m) > 0.1 * float(np.mean(m)):
            s_fit, a_fit = np.polyfit(m, t, 1)
            if a_fit >= 0 and s_fit > 0:
                a, s = float(a_fit), float(s_fit)
        table[k] = (a, s)
    return LatencyConfig(table=table)


async def calibrate(
    url: str,
    model: str,
    apps: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    batches_per_size: int = 8,
    seed: int = 0,
) -> Calibration:
    """Measure priors per application and fit the per-batch-size latency model on the worker at ``url``."""
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as session:
        priors: dict[str, list[float]] = {}
        pool: list[tuple[Mapping[str, Any], float]] = []
        for app, payloads in apps.items():
            times = await solo_times(session, url, model, payloads)
            priors[app] = times
            pool.extend(zip(payloads, times, strict=True))
        samples: dict[int, list[tuple[float, float]]] = {}
        for k in batch_sizes:
            samples[k] = []
            for _ in range(batches_per_size):
                members = [rng.choice(pool) for _ in range(k)]
                t0 = time.perf_counter()
                await _batch(session, url, model, [m[0] for m in members], solo=False)
                samples[k].append((max(m[1] for m in members), time.perf_counter() - t0))
    all_solo = [x for xs in priors.values() for x in xs]
    return Calibration(priors, fit_per_size(samples), float(np.mean(all_solo)))
