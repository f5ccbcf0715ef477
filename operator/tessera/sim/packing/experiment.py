"""FGD's experiment (Weng et al., ATC'23, §6.1): pods sampled from a trace arrive one by one until the GPUs
they ask for reach the cluster's capacity; each is placed by the policy or fails (and is not retried). The
figure of merit is the share of GPU capacity left unallocated against the arrived workload (GPUs asked so
far over capacity), and the pods that failed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tessera.policy.lanes.fragmentation import PackingState, Shape
from tessera.policy.lanes.packing import PackingPolicy
from tessera.sim.packing.trace import NodeSpec

GRID = tuple(range(1, 101))  # arrived workload, percent of capacity, where the curve is read


def build_state(nodes: Sequence[NodeSpec]) -> PackingState:
    state = PackingState(width=max(n.gpus for n in nodes), capacity=len(nodes))
    for n in nodes:
        row = state.add_row()
        state.set_row(
            row,
            model=n.model,
            gpu_memory_mib=[n.gpu_memory_mib] * n.gpus,
            free_compute=[1.0] * n.gpus,
            free_memory_mib=[n.gpu_memory_mib] * n.gpus,
            cpu_free=n.cpu_milli,
            memory_free=n.memory_mib,
            cpu_capacity=n.cpu_milli,
            memory_capacity=n.memory_mib,
        )
    return state


ARRIVALS = ("sample", "shuffle")


def arrivals(pods: Sequence[Shape], capacity: float, seed: int, mode: str = "sample") -> list[Shape]:
    """Pods until the GPUs they ask for reach `capacity`. `sample`: drawn uniformly with replacement (FGD
    §6.1 as written). `shuffle`: as FGD's artifact builds its workload (workload tuning): the whole pod list in
    random order, then pods drawn with replacement, so every listed pod arrives once before any twice."""
    if mode not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {mode!r}")
    rng = random.Random(seed)
    out: list[Shape] = []
    asked = 0.0
    if mode == "shuffle":
        order = list(pods)
        rng.shuffle(order)
        for s in order:
            if asked >= capacity - 1e-9:
                return out
            out.append(s)
            asked += s.gpu_share
    while asked < capacity - 1e-9:
        s = pods[rng.randrange(len(pods))]
        out.append(s)
        asked += s.gpu_share
    return out


@dataclass
class Curve:
    policy: str
    seed: int
    unallocated: list[float]  # share of GPU capacity unallocated at each GRID point
    failed: list[int]  # pods failed so far at each GRID point
    failed_gpu: list[int]  # of them, pods that asked for GPUs
    picks: list[tuple[int, tuple[int, ...]] | None]


def run(
    nodes: Sequence[NodeSpec],
    stream: Sequence[Shape],
    policy: PackingPolicy,
    seed: int,
    step: Callable[[int], None] | None = None,
) -> Curve:
    """Replay `stream` through `policy` on a fresh cluster of `nodes`."""
    state = build_state(nodes)
    capacity = float(sum(n.gpus for n in nodes))
    tie = random.Random(seed + 1)
    asked = allocated = 0.0
    failed = failed_gpu = 0
    unalloc: list[float] = []
    fails: list[int] = []
    fails_gpu: list[int] = []
    picks: list[tuple[int, tuple[int, ...]] | None] = []
    point = 0
    for k, shape in enumerate(stream):
        pick = policy.choose(state, shape, tie)
        picks.append(pick)
        if pick is None:
            failed += 1
            failed_gpu += shape.gpus > 0
        else:
            state.take(pick[0], pick[1], shape)
            policy.placed(state, pick, shape)
            allocated += shape.gpu_share
        asked += shape.gpu_share
        while point < len(GRID) and asked >= GRID[point] / 100.0 * capacity - 1e-9:
            unalloc.append(1.0 - allocated / capacity)
            fails.append(failed)
            fails_gpu.append(failed_gpu)
            point += 1
        if step is not None:
            step(k)
    while point < len(GRID):  # a stream cut short (tests): hold the last value
        unalloc.append(1.0 - allocated / capacity)
        fails.append(failed)
        fails_gpu.append(failed_gpu)
        point += 1
    return Curve(policy.name, seed, unalloc, fails, fails_gpu, picks)


def mean_at(curves: Sequence[Curve], percent: int) -> tuple[float, float]:
    """Mean unallocated share and failed pods over `curves` at `percent` arrived."""
    i = GRID.index(percent)
    return float(np.mean([c.unallocated[i] for c in curves])), float(np.mean([c.failed[i] for c in curves]))
