"""Team-queue figures of a training simulation: guarantee violations (GPU-seconds a queue with waiting work
spent below its guarantee, and how long each such spell lasted — the time to reclaim), utilisation,
per-queue max ρ and average JCT. The same measure for Tessera and the KAI-style and Kueue-style baselines.

ρ here is measured against the queue's share: T_id is an app's time on a 1/N_avg part (N_avg counted among
its queue's apps) of the GPUs the division gives its queue when every queue has work (`static_shares`), so
the three policies are held to one yardstick.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.policy.queues.division import QueueNode, divide, own_share
from tessera.policy.queues.training import DEFAULT_QUEUE, with_default
from tessera.policy.themis.estimate import t_id

_EPS = 1e-9


def static_shares(capacity: int, queues: Sequence[QueueNode], used: set[str]) -> dict[str, float]:
    """Each queue's share when all the queues in `used` have unbounded demand."""
    qs = with_default(queues)
    return own_share(qs, divide(capacity, qs, dict.fromkeys(used, math.inf)))


@dataclass(slots=True)
class QueueMeter:
    """Called at every instant of a simulation (before its events) with the state that held since the last
    one; integrates each queue's shortfall below min(guarantee, demand)."""

    queues: Sequence[QueueNode]
    violation_gpu_s: dict[str, float] = field(default_factory=dict)
    spells: dict[str, list[float]] = field(default_factory=dict)  # lengths of finished violation spells
    _since: dict[str, float] = field(default_factory=dict)
    _last: float | None = None

    def __call__(self, now: float, sim: Any) -> None:
        if self._last is not None and now > self._last:
            names = {q.name for q in self.queues}
            held: dict[str, float] = {}
            demand: dict[str, float] = {}
            for a in sim.live.values():
                q = a.spec.queue if a.spec.queue in names else DEFAULT_QUEUE
                held[q] = held.get(q, 0.0) + len(a.held)
                demand[q] = demand.get(q, 0.0) + a.runtime.demand()
            for q in self.queues:
                short = min(q.guaranteed, demand.get(q.name, 0.0)) - held.get(q.name, 0.0)
                if short > _EPS:
                    self.violation_gpu_s[q.name] = self.violation_gpu_s.get(q.name, 0.0) + short * (
                        now - self._last
                    )
                    self._since.setdefault(q.name, self._last)
                elif q.name in self._since:
                    self.spells.setdefault(q.name, []).append(self._last - self._since.pop(q.name))
        self._last = now

    def close(self) -> None:
        for name, since in list(self._since.items()):
            if self._last is not None:
                self.spells.setdefault(name, []).append(self._last - since)
            del self._since[name]


@dataclass(frozen=True, slots=True)
class QueueFigures:
    policy: str
    violation_gpu_s: float  # all queues
    longest_violation_s: float  # the longest spell any queue spent below its guarantee with work waiting
    mean_time_to_reclaim_s: float
    utilisation: float  # GPU-seconds held / (GPUs × makespan): allocation, as KAI and Kueue report it
    useful: float  # serial GPU-seconds of work done / (GPUs × makespan): allocation less restarts and waste
    longest_by_queue: dict[str, float]
    worst_max_rho: float  # max over queues of the queue's max ρ
    max_rho: dict[str, float]
    avg_jct_h: float

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "violation_gpu_s": self.violation_gpu_s,
            "longest_violation_s": self.longest_violation_s,
            "mean_time_to_reclaim_s": self.mean_time_to_reclaim_s,
            "utilisation": self.utilisation,
            "useful": self.useful,
            "longest_by_queue": self.longest_by_queue,
            "worst_max_rho": self.worst_max_rho,
            "max_rho": self.max_rho,
            "avg_jct_h": self.avg_jct_h,
        }


def figures(
    run: Any, meter: QueueMeter, queues: Sequence[QueueNode], capacity: int, app_queue: dict[str, str]
) -> QueueFigures:
    """The figures of one SimRun (`app_queue`: app id → its queue)."""
    meter.close()
    names = {q.name for q in with_default(queues)}
    done = [a for a in run.apps if not a.rejected]
    qof = {
        a.app_id: (
            app_queue.get(a.app_id, DEFAULT_QUEUE) if app_queue.get(a.app_id) in names else DEFAULT_QUEUE
        )
        for a in done
    }
    shares = static_shares(capacity, queues, set(qof.values()))
    max_rho: dict[str, float] = {}
    for a in done:
        q = qof[a.app_id]
        # "exact": work / min(share / N_avg, demand) — the paper's form would overstate T_id for apps that
        # want fewer GPUs than their queue's share.
        tid = t_id(a.total_work, max(1, round(shares[q])), a.peak_demand, a.n_avg, "exact")
        rho = (a.finish - a.arrival) / tid if tid > 0 else math.inf
        max_rho[q] = max(max_rho.get(q, 0.0), rho)
    spells = [s for v in meter.spells.values() for s in v]
    span = capacity * run.makespan
    util = run.gpu_seconds / span if span > 0 else 0.0
    useful = sum(a.total_work for a in done) / span if span > 0 else 0.0
    jct = [a.finish - a.arrival for a in done]
    return QueueFigures(
        policy=run.policy,
        violation_gpu_s=sum(meter.violation_gpu_s.values()),
        longest_violation_s=max(spells, default=0.0),
        mean_time_to_reclaim_s=sum(spells) / len(spells) if spells else 0.0,
        utilisation=util,
        useful=useful,
        longest_by_queue={q: max(v) for q, v in sorted(meter.spells.items()) if v},
        worst_max_rho=max(max_rho.values(), default=math.nan),
        max_rho=dict(sorted(max_rho.items())),
        avg_jct_h=sum(jct) / len(jct) / 3600 if jct else math.nan,
    )


def table(rows: Sequence[QueueFigures]) -> str:
    """The comparison, one line per policy."""
    queues = sorted({q for r in rows for q in r.max_rho})
    head = (
        f"{'policy':<14}{'viol GPU-s':>11}{'longest s':>10}{'reclaim s':>10}{'alloc':>7}{'useful':>7}"
        f"{'worst ρ':>9}{'JCT h':>8}"
    )
    head += "".join(f"{'ρ ' + q:>12}" for q in queues)
    lines = [head]
    for r in rows:
        line = (
            f"{r.policy:<14}{r.violation_gpu_s:>11.0f}{r.longest_violation_s:>10.0f}{r.mean_time_to_reclaim_s:>10.0f}"
            f"{r.utilisation:>7.3f}{r.useful:>7.3f}{r.worst_max_rho:>9.2f}{r.avg_jct_h:>8.2f}"
        )
        line += "".join(f"{r.max_rho.get(q, math.nan):>12.2f}" for q in queues)
        lines.append(line)
    return "\n".join(lines)
