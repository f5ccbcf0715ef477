"""How a workload uses GPUs: Salus lanes and per-job memory classes (Salus, Yu's dissertation ch. 2)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tessera.api.base import MAX_MIB, CrossFieldRule, WireModel

DEFAULT_GPU_MEMORY_MIB = 16384
"""16 GiB: the P100/V100 cards of the Salus and AlpaServe evaluations."""

DEFAULT_RESERVED_MIB = 300
"""Headroom Salus' public code holds back per GPU (SymbioticLab/Salus; not in the paper)."""


class LaneSize(WireModel):
    """A fixed slice of one GPU (Salus lane §1.5), enforced with MPS memory and thread limits."""

    memory_mib: int = Field(
        ge=1, le=MAX_MIB, description="Device memory of the lane in MiB (MPS pinned memory limit)."
    )
    compute_percent: int = Field(
        default=100, ge=1, le=100, description="Share of the GPU's SMs (MPS active thread percentage)."
    )


class GPUUsage(WireModel):
    """GPU type and memory profile of one workload, the inputs of Salus' lane assignment (Alg. 2.1).

    `persistentMiB` is P (model + framework state, held for the job's life) and `ephemeralPeakMiB` is E
    (peak per-iteration scratch); a lane is sized to the largest E it hosts (§1.7, Eq. 2.1).
    """

    gpu_memory_mib: int = Field(
        default=DEFAULT_GPU_MEMORY_MIB,
        ge=1,
        le=MAX_MIB,
        description="Memory of one GPU of the type to run on, in MiB.",
    )
    reserved_mib: int = Field(
        default=DEFAULT_RESERVED_MIB,
        ge=0,
        le=MAX_MIB,
        description="Per-GPU headroom never handed to lanes, in MiB.",
    )
    persistent_mib: int | None = Field(
        default=None,
        ge=0,
        le=MAX_MIB,
        description="P: persistent memory per job in MiB; measured when unset.",
    )
    ephemeral_peak_mib: int | None = Field(
        default=None,
        ge=0,
        le=MAX_MIB,
        description="E: peak ephemeral memory per iteration in MiB; measured when unset.",
    )
    lane: LaneSize | None = Field(
        default=None, description="Pin the workload to a lane of this size; unset lets Salus choose."
    )
    workload_class: Literal["latency-critical", "best-effort"] = Field(
        default="best-effort",
        description="Orion priority class for interference-aware co-location (Orion, Strati et al., EuroSys'24).",
    )

    cross_field_rules = (
        CrossFieldRule(
            cel="!has(self.lane) || self.lane.memoryMiB <= self.gpuMemoryMiB - self.reservedMiB",
            message="lane.memoryMiB must be <= gpuMemoryMiB - reservedMiB (a lane lives on one GPU)",
            check=lambda s: s.lane is None or s.lane.memory_mib <= s.gpu_memory_mib - s.reserved_mib,
            field_path=".lane.memoryMiB",
        ),
        CrossFieldRule(
            cel="!has(self.persistentMiB) || !has(self.ephemeralPeakMiB) || "
            "self.persistentMiB + self.ephemeralPeakMiB <= self.gpuMemoryMiB - self.reservedMiB",
            message="persistentMiB + ephemeralPeakMiB must be <= gpuMemoryMiB - reservedMiB, "
            "or the job cannot run even alone on a GPU (Salus safety condition, Eq. 2.1)",
            check=lambda s: (
                s.persistent_mib is None
                or s.ephemeral_peak_mib is None
                or s.persistent_mib + s.ephemeral_peak_mib <= s.gpu_memory_mib - s.reserved_mib
            ),
            field_path=".ephemeralPeakMiB",
        ),
        CrossFieldRule(
            cel="!has(self.lane) || !has(self.ephemeralPeakMiB) || self.lane.memoryMiB >= self.ephemeralPeakMiB",
            message="lane.memoryMiB must be >= ephemeralPeakMiB: a lane holds its jobs' peak scratch (§1.7)",
            check=lambda s: (
                s.lane is None or s.ephemeral_peak_mib is None or s.lane.memory_mib >= s.ephemeral_peak_mib
            ),
            field_path=".lane.memoryMiB",
        ),
    )
