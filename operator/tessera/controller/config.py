"""Operator settings (flags of `tessera operator`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    lease_s: float = 600.0  # Themis lease period: the arbiter runs a round at least this often (§5.3)
    tick_s: float | None = None  # how often App timers check whether a round is due; None = lease_s / 10
    fairness_knob: float = 0.8  # Themis f
    starving_rank: str = "fair_share"  # ThemisConfig.starving_rank: how Apps holding nothing are ranked
    preemption_grace_s: int = 30  # SIGTERM → SIGKILL window for checkpointing on lease loss
    admission_threshold: float | None = None  # Themis footnote 2; None admits everything
    seed: int = 0
    clusterwide: bool = True
    namespaces: tuple[str, ...] = ()
    standalone: bool = False
    peering_name: str = "default"
    priority: int = 0
    # kopf peering: a peer that stops sending keep-alives counts as dead this long after its last one, and
    # only then may a lower-priority peer take over (kopf touches every lifetime - 5..10 s, at least 1 s).
    peering_lifetime_s: int = 60
    post_events: bool = True
    gateway_image: str = "tessera:latest"
    # Group owning the node agent's sockets (chart: agent.sockets.groupId): every pod the operator creates
    # gets it in supplementalGroups so its non-root processes can report progress and join lanes. 0: none.
    socket_group: int = 0
    # App status writes (controller/status_writes.py): ρ alone re-writes status only when it moved by more
    # than this fraction of the value last written, or when the last write is older than the staleness
    # (None = one lease period). Leases, phase, GPUs, jobs and conditions are written whenever they change.
    status_rho_tolerance: float = 0.05
    status_max_staleness_s: float | None = None
    # API requests a round (or one workload's pod sync) keeps in flight at once (controller/concurrency.py).
    api_concurrency: int = 16
    # ModelDeployment stats (controller/serving_stats.py): the gateway's counters are read at most this
    # often (on the ModelDeployment timer); goodput, attainment and idleness cover the time between reads.
    # 0: not read; the status fields are then left to whatever else writes them.
    serving_stats_interval_s: float = 30.0
    # (namespace, ModelDeployment name) → the gateway's base URL; None: its Service's cluster DNS name.
    # Tests point it at a gateway on loopback.
    gateway_url: Callable[[str, str], str] | None = field(default=None, compare=False, repr=False)
    # Liveness (controller/liveness.py): the probe fails once a round or pass has run this long. None: a
    # lease period (longer, and leases lapse unrenewed), at least 60 s.
    pass_deadline_s: float | None = None
    # Wall clock for leases and rounds. Tests pass a clock they advance, so lease expiry happens when the
    # test says and not when a loaded machine happens to get there.
    clock: Callable[[], float] = field(default=time.time, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.lease_s > 0:
            raise ValueError(f"lease period must be positive, got {self.lease_s}")
        if self.starving_rank not in ("fair_share", "cap"):
            raise ValueError(f"starving rank must be 'fair_share' or 'cap', got {self.starving_rank!r}")
        if not 0 <= self.socket_group <= 2**31 - 1:
            raise ValueError(f"socket group must be a group id in [0, 2147483647], got {self.socket_group}")
        if self.tick_s is not None and not self.tick_s > 0:
            raise ValueError(f"tick must be positive, got {self.tick_s}")
        if self.preemption_grace_s < 0:
            raise ValueError(f"preemption grace must be >= 0 seconds, got {self.preemption_grace_s}")
        if not self.status_rho_tolerance >= 0:
            raise ValueError(f"status ρ tolerance must be >= 0 (a fraction), got {self.status_rho_tolerance}")
        if self.status_max_staleness_s is not None and not self.status_max_staleness_s > 0:
            raise ValueError(f"status staleness must be positive seconds, got {self.status_max_staleness_s}")
        if not self.serving_stats_interval_s >= 0:
            raise ValueError(
                f"serving stats interval must be >= 0 (0: off), got {self.serving_stats_interval_s}"
            )
        if self.api_concurrency < 1:
            raise ValueError(f"API concurrency must be >= 1 request in flight, got {self.api_concurrency}")
        if self.peering_lifetime_s < 1:
            raise ValueError(f"peering lifetime must be >= 1 second, got {self.peering_lifetime_s}")
        if self.pass_deadline_s is not None and not self.pass_deadline_s > 0:
            raise ValueError(f"pass deadline must be positive seconds, got {self.pass_deadline_s}")
        if not self.clusterwide and not self.namespaces:
            raise ValueError("give --namespace at least once, or --all-namespaces")

    @property
    def status_staleness(self) -> float:
        return self.status_max_staleness_s if self.status_max_staleness_s is not None else self.lease_s

    @property
    def tick(self) -> float:
        return self.tick_s if self.tick_s is not None else max(0.05, self.lease_s / 10)

    @property
    def pass_deadline(self) -> float:
        return self.pass_deadline_s if self.pass_deadline_s is not None else max(60.0, self.lease_s)
