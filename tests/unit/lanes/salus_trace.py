"""A seeded 100-job training trace shaped like Salus §2.5.1, for the Table 2.1 reproduction.

What the seed fixes: 100 jobs drawn from Table A.1's models × batch sizes, online arrivals, one 16 GB P100,
mean exclusive execution ≈ 3.0 min (FIFO avg JCT − avg queuing, Salus §2.5), persistent memory
110.9-822.2 MB and peaks up to 13.8 GB (§2.2.1), and a production-like heavy-tailed duration
distribution (§2.5.1). What it does not give (durations per job, arrival times, utilisation) is drawn
here: log-normal durations (σ = 1.4) scaled to a 3.0 min mean, Poisson arrivals over the first half of the
serial makespan, and an exclusive SM utilisation of 0.7-1.0 per job.
"""

from __future__ import annotations

import math
import random

from tessera.policy.lanes.replay import TrainingJob

# (persistent GB, ephemeral peak GB) per workload class, spanning the seed's reported ranges.
_WORKLOADS = [
    ("resnet152_75", 0.82, 12.9),
    ("resnet101_75", 0.6, 9.5),
    ("resnet50_50", 0.4, 5.5),
    ("inception3_50", 0.35, 6.0),
    ("inception4_50", 0.5, 8.0),
    ("vgg16_50", 0.7, 7.5),
    ("vgg11_25", 0.6, 3.5),
    ("alexnet_25", 0.3, 1.2),
    ("googlenet_25", 0.11, 2.0),
    ("overfeat_50", 0.45, 3.0),
    ("superres_128", 0.15, 2.5),
    ("vae_128", 0.05, 0.1),
    ("speech_50", 0.4, 6.5),
    ("seq2seq_medium", 0.3, 3.5),
]


def salus_trace(
    seed: int = 0, n: int = 100, mean_minutes: float = 3.0, sigma: float = 1.4, arrival_span: float = 0.5
) -> list[TrainingJob]:
    rng = random.Random(seed)
    raw = [rng.lognormvariate(0.0, sigma) for _ in range(n)]
    scale = mean_minutes * 60.0 * n / sum(raw)
    span = arrival_span * mean_minutes * 60.0 * n
    t, jobs = 0.0, []
    for k in range(n):
        name, p, e = rng.choice(_WORKLOADS)
        jobs.append(
            TrainingJob(
                job_id=f"{k:03d}-{name}",
                arrival=t,
                duration=raw[k] * scale,
                iteration=rng.uniform(0.2, 2.0),
                persistent=p,
                ephemeral=e,
                utilization=rng.uniform(0.7, 1.0),
            )
        )
        t += -math.log(1.0 - rng.random()) * span / n
    return jobs
