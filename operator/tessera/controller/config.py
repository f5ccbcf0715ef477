"""Operator settings (flags of `tessera operator`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OperatorConfig(BaseModel):
    """Settings of one operator process, from `tessera operator`'s flags (tests build it directly).

    A refused value is a pydantic ValidationError naming the field, which the CLI maps back to its flag."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)

    # Themis lease period: the arbiter runs a round at least this often (§5.3)
    lease_s: float = Field(default=600.0, gt=0)
    # how often App timers check whether a round is due; None = lease_s / 10
    tick_s: float | None = Field(default=None, gt=0)
    fairness_knob: float = Field(default=0.8, ge=0, le=1)  # Themis f
    # ThemisConfig.starving_rank: how Apps holding nothing are ranked
    starving_rank: Literal["fair_share", "cap"] = "fair_share"
    renew_in_place: bool = True  # ThemisConfig.renew_in_place: an App back at lease end gets its GPUs back
    # ThemisConfig.leftover_order: leftover GPUs to random Apps, or first back to the Apps that held them
    leftover_order: Literal["random", "holders"] = "random"
    # SIGTERM → SIGKILL window for checkpointing on lease loss
    preemption_grace_s: int = Field(default=30, ge=0)
    admission_threshold: float | None = Field(default=None, gt=0)  # Themis footnote 2; None admits everything
    seed: int = Field(default=0, ge=0)
    clusterwide: bool = True
    namespaces: tuple[str, ...] = ()
    standalone: bool = False
    peering_name: str = Field(default="default", min_length=1)
    priority: int = 0
    # kopf peering: a peer that stops sending keep-alives counts as dead this long after its last one, and
    # only then may a lower-priority peer take over (kopf touches every lifetime - 5..10 s, at least 1 s).
    peering_lifetime_s: int = Field(default=60, ge=1)
    post_events: bool = True
    # Team queues: watch Queue objects, and Namespaces for their `tessera.io/queue` label. Off only in tests
    # whose API emulator serves neither (kmock cannot list cluster-scoped namespaces).
    queues: bool = True
    watch_namespaces: bool = True
    gateway_image: str = Field(default="tessera:latest", min_length=1)
    # Group owning the node agent's sockets (chart: agent.sockets.groupId): every pod the operator creates
    # gets it in supplementalGroups so its non-root processes can report progress and join lanes. 0: none.
    socket_group: int = Field(default=0, ge=0, le=2**31 - 1)
    # How the pods it creates get their lanes (docs/dra.md): extended resources placed by the scheduler
    # extender, or (dra) ResourceClaimTemplates whose requests select the GPUs the policies chose.
    lanes_api: Literal["devicePlugin", "dra"] = "devicePlugin"
    # App status writes (controller/status_writes.py): ρ alone re-writes status only when it moved by more
    # than this fraction of the value last written, or when the last write is older than the staleness
    # (None = one lease period). Leases, phase, GPUs, jobs and conditions are written whenever they change.
    status_rho_tolerance: float = Field(default=0.05, ge=0)
    status_max_staleness_s: float | None = Field(default=None, gt=0)
    # Namespace of the arbiter's renewal ledger (controller/ledger.py): the operator's own (the chart sets
    # POD_NAMESPACE); replicas that peer must share it. None: the first namespace served, else default.
    ledger_namespace: str | None = Field(default=None, min_length=1)
    # API requests a round (or one workload's pod sync) keeps in flight at once (controller/concurrency.py).
    api_concurrency: int = Field(default=16, ge=1)
    # ModelDeployment stats (controller/serving_stats.py): the gateway's counters are read at most this
    # often (on the ModelDeployment timer); goodput, attainment and idleness cover the time between reads.
    # 0: not read; the status fields are then left to whatever else writes them.
    serving_stats_interval_s: float = Field(default=30.0, ge=0)
    # (namespace, ModelDeployment name) → the gateway's base URL; None: its Service's cluster DNS name.
    # Tests point it at a gateway on loopback.
    gateway_url: Callable[[str, str], str] | None = Field(default=None, exclude=True, repr=False)
    # Liveness (controller/liveness.py): the probe fails once a round or pass has run this long. None: a
    # lease period (longer, and leases lapse unrenewed), at least 60 s.
    pass_deadline_s: float | None = Field(default=None, gt=0)
    # An object deleted while its timer's pass (the tick) is still running keeps its finalizer until kopf
    # sees the timer stopped, and kopf looks again only this often. kopf's default, 60 s, held a deleted
    # TrialGroup a whole minute whenever the deletion fell inside a tick (likelier the slower the machine).
    deletion_recheck_s: float = Field(default=1.0, gt=0)
    # Wall clock for leases and rounds. Tests pass a clock they advance, so lease expiry happens when the
    # test says and not when a loaded machine happens to get there.
    clock: Callable[[], float] = Field(default=time.time, exclude=True, repr=False)

    @model_validator(mode="after")
    def _serves_somewhere(self) -> OperatorConfig:
        if not self.clusterwide and not self.namespaces:
            raise ValueError("give --namespace at least once, or --all-namespaces")
        return self

    @property
    def status_staleness(self) -> float:
        return self.status_max_staleness_s if self.status_max_staleness_s is not None else self.lease_s

    @property
    def ledger_ns(self) -> str:
        if self.ledger_namespace:
            return self.ledger_namespace
        return self.namespaces[0] if not self.clusterwide and self.namespaces else "default"

    @property
    def tick(self) -> float:
        return self.tick_s if self.tick_s is not None else max(0.05, self.lease_s / 10)

    @property
    def pass_deadline(self) -> float:
        return self.pass_deadline_s if self.pass_deadline_s is not None else max(60.0, self.lease_s)
