"""Orion's BE admission policy, Listing 1 (Orion §5.1.1), with the fixes of the authors' scheduler.

`OrionPolicy` holds the state the listing keeps across loop iterations (`be_duration`, the throttle flag)
and decides, for the BE kernel at the head of a client's queue, whether to launch it now. The caller (a
simulator, or an interception layer) tells it whether an HP request is in flight, the profile of the HP
kernel most recently submitted, and whether every BE kernel launched so far has completed (the non-blocking
event queries of line 13). HP kernels are never held back: the caller launches them at once (line 8).

Resolutions (how the authors' code reads the ambiguous lines):
- lines 12-15: once `be_duration > DUR_THRESHOLD`, BE launches wait until all launched BE work has completed;
  then the counter resets *and* the waiting kernel is launched (line 15 is an else of line 13);
- `hp_task_running` is true from the first kernel of an HP request (or iteration) until its last completes;
- SM check `size + sm_needed <= SM_THRESHOLD`, `size` summing BE kernels launched in the same round;
- `DUR_THRESHOLD` is a fraction (default 2.5%, Orion §5.1.1) of the HP job's dedicated request latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .profiles import Profile, different_profiles


@dataclass(frozen=True, slots=True)
class OrionConfig:
    num_sms: int = 80  # V100
    sm_threshold: int | None = None  # None: all SMs (Orion §5.1.1)
    dur_threshold_fraction: float = 0.025  # of the HP request latency (Orion §5.1.1)
    # The ablation of §6.4: which parts of the policy are on.
    use_profiles: bool = True
    use_sm_size: bool = True
    use_throttle: bool = True

    def __post_init__(self) -> None:
        if self.num_sms <= 0:
            raise ValueError(f"num_sms must be positive, got {self.num_sms}")
        if self.sm_threshold is not None and self.sm_threshold < 0:
            raise ValueError(f"sm_threshold must be non-negative, got {self.sm_threshold}")
        if not 0 < self.dur_threshold_fraction <= 1:
            raise ValueError(f"dur_threshold_fraction must be in (0, 1], got {self.dur_threshold_fraction}")

    @property
    def effective_sm_threshold(self) -> int:
        return self.num_sms if self.sm_threshold is None else self.sm_threshold


@dataclass(frozen=True, slots=True)
class BeKernel:
    sm_needed: int
    profile: Profile
    duration: float  # expected duration alone, seconds (from the profile)


@dataclass(slots=True)
class OrionPolicy:
    config: OrionConfig
    hp_latency: float  # the HP job's dedicated request latency (or iteration time), seconds
    sm_threshold: int = field(init=False)
    be_duration: float = field(init=False, default=0.0)
    large_found: bool = field(init=False, default=False)
    round_sms: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.hp_latency <= 0:
            raise ValueError(f"HP latency must be positive, got {self.hp_latency}")
        self.sm_threshold = self.config.effective_sm_threshold

    @property
    def dur_threshold(self) -> float:
        """DUR_THRESHOLD in seconds: the configured fraction of the HP latency (B.10)."""
        return self.config.dur_threshold_fraction * self.hp_latency

    def new_round(self) -> None:
        """A new pass of the scheduler loop: the same-round SM accumulator starts from zero."""
        self.round_sms = 0

    def schedule_be(self, hp_task_running: bool, hp_profile: Profile | None, be: BeKernel) -> bool:
        """Lines 23-30: may this BE kernel run beside the HP work now?"""
        if not hp_task_running:
            return True
        if self.config.use_sm_size and self.round_sms + be.sm_needed > self.sm_threshold:
            return False
        return not self.config.use_profiles or different_profiles(hp_profile, be.profile)

    def admit(
        self, hp_task_running: bool, hp_profile: Profile | None, be: BeKernel, be_all_done: bool
    ) -> bool:
        """Lines 10-21 for one BE head: True means launch it now (the caller pops and launches it)."""
        schedule = self.schedule_be(hp_task_running, hp_profile, be)
        if self.config.use_throttle and self.large_found:
            if be_all_done:
                self.large_found = False
                self.be_duration = 0.0
            else:
                schedule = False
        if schedule:
            self.be_duration += be.duration
            self.round_sms += be.sm_needed
            if self.be_duration > self.dur_threshold:
                self.large_found = True
        return schedule
