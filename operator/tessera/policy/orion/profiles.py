"""Kernel profiles (Orion §5.2) and the cost-saving formula (§6.2.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class Profile(IntEnum):
    """A kernel's resource class, encoded as in Orion's kernel files (1 compute, 0 memory, -1 unknown)."""

    UNKNOWN = -1
    MEMORY = 0
    COMPUTE = 1


# V100 limits used by Orion's block counter.
V100_MAX_THREADS_SM = 2048
V100_MAX_SHMEM_SM = 65536
V100_MAX_REGS_SM = 65536
PROFILE_UTIL_THRESHOLD = 0.60  # §4.1: compute- (memory-) bound above 60% compute (memory BW) utilisation
ROOFLINE_AI_THRESHOLD = 9.72  # FLOP/byte ridge point of the authors' roofline script


def blocks_per_sm(
    threads_per_block: int,
    regs_per_thread: int,
    shmem_per_block: int = 0,
    *,
    max_threads: int = V100_MAX_THREADS_SM,
    max_shmem: int = V100_MAX_SHMEM_SM,
    max_regs: int = V100_MAX_REGS_SM,
) -> int:
    """Resident blocks per SM: the least of the thread, shared-memory and register limits.

    The thread limit uses floor (CUDA occupancy semantics), not the ceil of the authors' script, which
    over-counts residency for block sizes that do not divide 2048 (96 threads: 21, where the script says 22).
    """
    if threads_per_block <= 0 or regs_per_thread < 0 or shmem_per_block < 0:
        raise ValueError("threads per block must be positive; registers and shared memory non-negative")
    by_threads = max_threads // threads_per_block
    by_shmem = max_shmem // shmem_per_block if shmem_per_block > 0 else by_threads
    regs_per_warp = math.ceil(32 * max(regs_per_thread, 1) / 256) * 256
    warps_per_sm = (max_regs // regs_per_warp) // 4 * 4
    by_regs = warps_per_sm // math.ceil(threads_per_block / 32)
    return max(1, min(by_threads, by_shmem, by_regs))


def sm_needed(num_blocks: int, threads_per_block: int, regs_per_thread: int, shmem_per_block: int = 0) -> int:
    """`ceil(num_blocks / blocks_per_sm)` (Orion §5.2); may exceed the GPU's SM count (several waves)."""
    if num_blocks <= 0:
        raise ValueError(f"a kernel has at least one block, got {num_blocks}")
    return math.ceil(num_blocks / blocks_per_sm(threads_per_block, regs_per_thread, shmem_per_block))


def classify(compute_util: float, memory_util: float, arithmetic_intensity: float | None = None) -> Profile:
    """Roofline label when the arithmetic intensity is known, otherwise the 60% rule; neither → unknown."""
    if arithmetic_intensity is not None:
        return Profile.COMPUTE if arithmetic_intensity > ROOFLINE_AI_THRESHOLD else Profile.MEMORY
    if compute_util > PROFILE_UTIL_THRESHOLD and compute_util >= memory_util:
        return Profile.COMPUTE
    if memory_util > PROFILE_UTIL_THRESHOLD:
        return Profile.MEMORY
    return Profile.UNKNOWN


def different_profiles(hp: Profile | None, be: Profile) -> bool:
    """Listing 1's `have_different_profiles`: unknown on either side is compatible with anything (Orion §5.1.1)."""
    return hp is None or hp is Profile.UNKNOWN or be is Profile.UNKNOWN or hp != be


def cost_saving(throughput_collocated: float, throughput_dedicated: float) -> float:
    """`2·Throughput_collocated / Throughput_dedicated` of the BE job: two GPUs become one (Orion §6.2.1)."""
    if throughput_dedicated <= 0 or throughput_collocated < 0:
        raise ValueError("dedicated throughput must be positive and collocated throughput non-negative")
    return 2.0 * throughput_collocated / throughput_dedicated


@dataclass(frozen=True, slots=True)
class KernelShare:
    """A kernel's SM occupancy and time, for the initial BE percentage."""

    duration: float
    sm_fraction: float  # of the GPU's SMs, capped at 1


def initial_be_percent(hp_kernels: list[KernelShare], lo: int = 10, hi: int = 50) -> int:
    """`p_be0 = 100·(1 − q_hp)`, q_hp the duration-weighted median SM fraction of the HP kernels, clamped.

    A heuristic of the node-agent design, not of the paper: the clamp bounds are tunables.
    """
    if not hp_kernels:
        return hi
    total = sum(k.duration for k in hp_kernels)
    acc, q = 0.0, 1.0
    for k in sorted(hp_kernels, key=lambda k: k.sm_fraction):
        acc += k.duration
        if acc >= total / 2:
            q = min(1.0, k.sm_fraction)
            break
    return max(lo, min(hi, round(100 * (1 - q))))
