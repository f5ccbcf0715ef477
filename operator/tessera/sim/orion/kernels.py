"""Kernels and synthetic per-model kernel mixes for the GPU-sharing simulator.

A kernel has a duration when it runs alone with all the SMs it can use, an SM demand `sm_needed` (Orion's
`ceil(blocks / blocks_per_sm)`, more than the GPU's SMs for a multi-wave kernel), a profile (compute, memory,
unknown) and its compute and memory-bandwidth utilisation when alone.

SYNTHETIC. The per-model mixes are not measured kernel traces: they are generated so that their
duration-weighted compute and memory-bandwidth utilisation and SM occupancy match Table 1 of the paper
(V100, Orion §3), their request latency or iteration time matches the paper's (inference: the
DUR_THRESHOLD of the artifact, 160 µs and 100 µs at 2.5%, gives 6.4 ms and 4 ms; others scaled from Table 1's
relative load; training: Table 4's dedicated it/s, Orion §6.2.1). How:
- three kernel classes with fixed utilisations (compute-bound: 85% compute, 25% memory; memory-bound: 15%, 80%;
  small/unknown: 10%, 10%); the share of time in each class solves the two Table 1 averages (compute %, mem BW %)
  as a 2×2 linear system, clamped to [0, 1];
- per-kernel durations are log-normal (σ = 0.8), then each class is rescaled to its share of the total;
- SM demand of compute- and memory-bound kernels is drawn around Table 1's "SMs busy" fraction (training
  kernels may need several waves, up to 4× the SMs); unknown kernels are small (≤ 20% of the SMs), as §4.1 says;
- kernel counts are kept modest (coarse kernels stand for fused groups) so one run takes well under a second.
`summary()` reports what a mix really averages, and a test checks it against the Table 1 row it came from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from tessera.policy.orion.profiles import Profile

Role = Literal["inference", "training"]

CLASS_UTIL: dict[Profile, tuple[float, float]] = {
    Profile.COMPUTE: (0.85, 0.25),
    Profile.MEMORY: (0.15, 0.80),
    Profile.UNKNOWN: (0.10, 0.10),
}


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    duration: float  # seconds alone, with min(sm_needed, SMs) SMs
    sm_needed: int
    profile: Profile
    compute: float  # compute-throughput utilisation alone, 0..1
    memory: float  # memory-bandwidth utilisation alone, 0..1

    def __post_init__(self) -> None:
        if self.duration <= 0 or self.sm_needed <= 0:
            raise ValueError(f"kernel {self.name}: duration and sm_needed must be positive")


@dataclass(frozen=True, slots=True)
class ModelRow:
    """Orion's Table 1 (§3) plus the latency or iteration time the mix is scaled to."""

    model: str
    role: Role
    batch: int
    sm_busy: float
    compute: float
    membw: float
    time_s: float  # request latency (inference) or iteration time (training), dedicated V100
    kernels: int


# Inference latencies: ResNet50 6.4 ms and MobileNetV2 4 ms from the artifact's DUR_THRESHOLD at 2.5%
# (B.4); ResNet101 from the ResNet101 dedicated latency implied by B.6 (23 ms at 10%, ≈ 17 ms at 2.5%, we take
# 12 ms, ≈ 2× ResNet50 as in Table 3's rate ratios); BERT and Transformer likewise from Table 3's rates.
# Training iteration times are 1 / Table 4's dedicated it/s.
MODELS: dict[str, ModelRow] = {
    r.model + "-" + r.role: r
    for r in (
        ModelRow("resnet50", "inference", 4, 0.24, 0.30, 0.22, 6.4e-3, 40),
        ModelRow("mobilenetv2", "inference", 4, 0.06, 0.18, 0.21, 4.0e-3, 40),
        ModelRow("resnet101", "inference", 4, 0.29, 0.24, 0.37, 12.0e-3, 60),
        ModelRow("bert", "inference", 2, 0.95, 0.72, 0.28, 60.0e-3, 60),
        ModelRow("transformer", "inference", 4, 0.61, 0.52, 0.29, 25.0e-3, 60),
        ModelRow("resnet50", "training", 32, 0.81, 0.48, 0.45, 1 / 10.3, 150),
        ModelRow("mobilenetv2", "training", 64, 0.71, 0.34, 0.49, 1 / 12.5, 150),
        ModelRow("resnet101", "training", 32, 0.85, 0.50, 0.43, 1 / 6.3, 200),
        ModelRow("bert", "training", 8, 0.61, 0.44, 0.21, 1 / 4.91, 150),
        ModelRow("transformer", "training", 8, 0.495, 0.29, 0.30, 1 / 6.0, 150),
    )
}


def class_shares(compute: float, membw: float) -> dict[Profile, float]:
    """Time shares of the three classes whose weighted utilisations give (compute, membw)."""
    (cc, cm), (mc, mm), (uc, um) = (CLASS_UTIL[p] for p in (Profile.COMPUTE, Profile.MEMORY, Profile.UNKNOWN))
    # fC·cc + fM·mc + (1−fC−fM)·uc = compute ; fC·cm + fM·mm + (1−fC−fM)·um = membw
    a11, a12, b1 = cc - uc, mc - uc, compute - uc
    a21, a22, b2 = cm - um, mm - um, membw - um
    det = a11 * a22 - a12 * a21
    fc = max(0.0, (b1 * a22 - a12 * b2) / det)
    fm = max(0.0, (a11 * b2 - a21 * b1) / det)
    if fc + fm > 1:
        fc, fm = fc / (fc + fm), fm / (fc + fm)
    return {Profile.COMPUTE: fc, Profile.MEMORY: fm, Profile.UNKNOWN: 1 - fc - fm}


def synthesize(row: ModelRow, rng: random.Random, num_sms: int = 80) -> tuple[Kernel, ...]:
    """A synthetic kernel sequence for one request / iteration of `row` (see the module docstring)."""
    shares = class_shares(row.compute, row.membw)
    classes = rng.choices(list(shares), weights=list(shares.values()), k=row.kernels)
    for p, s in shares.items():  # every class with a share gets at least one kernel
        if s > 0.01 and p not in classes:
            classes[rng.randrange(len(classes))] = p
    raw = [rng.lognormvariate(0.0, 0.8) for _ in classes]
    totals = {p: sum(r for r, c in zip(raw, classes, strict=True) if c is p) for p in shares}
    multi_wave = row.role == "training"
    out = []
    for i, (r, p) in enumerate(zip(raw, classes, strict=True)):
        dur = row.time_s * shares[p] * r / totals[p]
        if p is Profile.UNKNOWN:
            sm = rng.randint(1, max(1, num_sms // 5))
        else:
            frac = min(1.0, max(0.02, rng.gauss(row.sm_busy, 0.15)))
            if multi_wave and frac > 0.9 and rng.random() < 0.5:
                frac *= rng.uniform(1.0, 4.0)
            sm = max(1, round(frac * num_sms))
        c, m = CLASS_UTIL[p]
        out.append(Kernel(f"{row.model}-{row.role}-{i}", dur, sm, p, c, m))
    return tuple(out)


def summary(kernels: tuple[Kernel, ...], num_sms: int = 80) -> dict[str, float]:
    """Duration-weighted compute, memory BW and SM occupancy of a mix, and its total time."""
    total = sum(k.duration for k in kernels)
    return {
        "time_s": total,
        "compute": sum(k.compute * k.duration for k in kernels) / total,
        "membw": sum(k.memory * k.duration for k in kernels) / total,
        "sm_busy": sum(min(1.0, k.sm_needed / num_sms) * k.duration for k in kernels) / total,
        "kernels": float(len(kernels)),
    }


def mix(model: str, role: Role, seed: int, num_sms: int = 80) -> tuple[Kernel, ...]:
    key = f"{model}-{role}"
    if key not in MODELS:
        raise KeyError(f"no kernel mix for {key}; known: {', '.join(sorted(MODELS))}")
    return synthesize(MODELS[key], random.Random(f"{key}/{seed}"), num_sms)


# Table 2's toy kernels (V100, batch 32; Orion §3.2). SM demand: Conv2d fills the GPU (two waves), BN2d 40%.
CONV2D = Kernel("conv2d", 1.35e-3, 160, Profile.COMPUTE, 0.89, 0.20)
BN2D = Kernel("bn2d", 0.93e-3, 32, Profile.MEMORY, 0.14, 0.80)
