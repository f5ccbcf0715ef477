"""Per-policy figures of a training simulation (Themis §6.1 metrics): ρ max / p50 / p90, Jain's index
over ρ, average and p95 app completion time, GPU-hours, makespan, the placement-score CDF; a table for
stdout, JSON for machines and PNG plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tessera.sim.training.simulator import SimRun


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), q in [0, 1]."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 = all equal."""
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return math.nan
    sq = sum(v * v for v in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


@dataclass(frozen=True, slots=True)
class PolicySummary:
    policy: str
    apps: int
    rejected: int
    max_rho: float
    p50_rho: float
    p90_rho: float
    jain_rho: float
    share_rho_le_1: float
    max_rho_exact: float
    avg_jct_h: float
    p95_jct_h: float
    gpu_hours: float
    makespan_h: float
    placement_p10: float
    placement_mean: float
    rounds: int
    events: int
    wall_s: float

    @staticmethod
    def of(run: SimRun) -> PolicySummary:
        done = [a for a in run.apps if not a.rejected]
        rho = [a.rho for a in done]
        jct = [(a.finish - a.arrival) / 3600.0 for a in done]
        sc = run.placement_scores
        return PolicySummary(
            policy=run.policy,
            apps=len(done),
            rejected=len(run.apps) - len(done),
            max_rho=max(rho, default=math.nan),
            p50_rho=quantile(rho, 0.5),
            p90_rho=quantile(rho, 0.9),
            jain_rho=jain(rho),
            share_rho_le_1=sum(r <= 1.0 for r in rho) / len(rho) if rho else math.nan,
            max_rho_exact=max((a.rho_exact for a in done), default=math.nan),
            avg_jct_h=sum(jct) / len(jct) if jct else math.nan,
            p95_jct_h=quantile(jct, 0.95),
            gpu_hours=run.gpu_seconds / 3600.0,
            makespan_h=run.makespan / 3600.0,
            placement_p10=quantile(sc, 0.1),
            placement_mean=sum(sc) / len(sc) if sc else math.nan,
            rounds=run.rounds,
            events=run.events,
            wall_s=run.wall_s,
        )


_COLUMNS = [
    ("policy", "policy", "{}"),
    ("max_rho", "max ρ", "{:.2f}"),
    ("p50_rho", "ρ p50", "{:.2f}"),
    ("p90_rho", "ρ p90", "{:.2f}"),
    ("jain_rho", "Jain(ρ)", "{:.3f}"),
    ("share_rho_le_1", "ρ≤1", "{:.0%}"),
    ("avg_jct_h", "avg JCT h", "{:.2f}"),
    ("p95_jct_h", "p95 JCT h", "{:.2f}"),
    ("gpu_hours", "GPU-h", "{:.0f}"),
    ("makespan_h", "makespan h", "{:.1f}"),
    ("placement_mean", "placement", "{:.3f}"),
]


class TrainingResult:
    """What `tessera simulate` prints for a training scenario (implements tessera.sim.scenario.SimResult)."""

    def __init__(self, name: str, runs: Sequence[SimRun], meta: dict[str, Any] | None = None) -> None:
        self.name = name
        self.runs = list(runs)
        self.summaries = [PolicySummary.of(r) for r in runs]
        self.meta = meta or {}

    def summary(self, policy: str) -> PolicySummary:
        for s in self.summaries:
            if s.policy == policy:
                return s
        raise KeyError(f"no run for policy {policy!r}; have {[s.policy for s in self.summaries]}")

    def table(self) -> str:
        rows = [[h for _, h, _ in _COLUMNS]]
        for s in self.summaries:
            rows.append([fmt.format(getattr(s, key)) for key, _, fmt in _COLUMNS])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"scenario {self.name}: " + ", ".join(f"{k}={v}" for k, v in self.meta.items())]
        for n, r in enumerate(rows):
            lines.append(
                "  ".join(
                    c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
                )
            )
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        themis = next((s for s in self.summaries if s.policy.startswith("themis")), None)
        others = [s for s in self.summaries if not s.policy.startswith("themis")]
        if themis and others:
            best = min(others, key=lambda s: s.max_rho)
            lines.append(
                f"themis max ρ {themis.max_rho:.2f} vs best baseline {best.policy} {best.max_rho:.2f} "
                f"({best.max_rho / themis.max_rho:.2f}×); GPU-hours vs gandiva: "
                + next(
                    (f"{themis.gpu_hours / s.gpu_hours - 1:+.1%}" for s in others if s.policy == "gandiva"),
                    "n/a",
                )
            )
        lines.extend(self._tuning_lines())
        lines.extend(self._queue_lines())
        return "\n".join(lines)

    def _queue_lines(self) -> list[str]:
        """Team queues: guarantee violations, time to reclaim, utilisation, per-queue max ρ, JCT."""
        from tessera.sim.training.queues import QueueFigures, table

        rows = [QueueFigures(**r.queues) for r in self.runs if r.queues]
        return ["", "team queues (ρ against the queue's share):", table(rows)] if rows else []

    def _tuning_lines(self) -> list[str]:
        """Per tuning app, one line per policy: how it fared with Fluid inside that policy's leases."""
        rows: dict[str, list[str]] = {}
        for r in self.runs:
            for a in r.apps:
                if not a.tuning:
                    continue
                if a.rejected or a.best_score is None:
                    line = "rejected by admission control"
                else:
                    ttt = "never" if a.time_to_target is None else f"{a.time_to_target / 3600.0:.2f} h"
                    line = (
                        f"JCT {(a.finish - a.arrival) / 3600.0:.2f} h  ρ {a.rho:.2f}  "
                        f"target reached after {ttt}  best score {a.best_score:.3f}"
                    )
                rows.setdefault(a.app_id, []).append(f"  {a.app_id:<16} {r.policy:<10} {line}")
        if not rows:
            return []
        return [
            "tuning apps (Fluid inside each policy's leases):",
            *(x for app in sorted(rows) for x in rows[app]),
        ]

    def to_json(self) -> dict[str, Any]:
        def clean(v: Any) -> Any:
            return None if isinstance(v, float) and not math.isfinite(v) else v

        queued = any(r.queues for r in self.runs)
        return {
            "scenario": self.name,
            "meta": self.meta,
            "policies": [{k: clean(v) for k, v in asdict(s).items()} for s in self.summaries],
            "apps": {
                r.policy: [
                    {
                        "app": a.app_id,
                        "rho": clean(a.rho),
                        "rho_exact": clean(a.rho_exact),
                        "jct_s": a.finish - a.arrival,
                        "gpu_s": a.gpu_seconds,
                        "rejected": a.rejected,
                        **(
                            {"time_to_target_s": a.time_to_target, "best_score": clean(a.best_score)}
                            if a.tuning
                            else {}
                        ),
                    }
                    for a in r.apps
                ]
                for r in self.runs
            },
            "placement_cdf": {
                r.policy: [quantile(r.placement_scores, q / 20) for q in range(21)] for r in self.runs
            },
            **({"queues": [{k: clean(v) for k, v in r.queues.items()} for r in self.runs]} if queued else {}),
        }

    def plots(self, directory: Path) -> list[Path]:
        from tessera.sim.plotting import pyplot, save_figure

        plt = pyplot()

        directory.mkdir(parents=True, exist_ok=True)
        out: list[Path] = []
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in self.runs:
            xs = sorted(a.rho for a in r.apps if not a.rejected)
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=r.policy)
        ax.set_xlabel("finish-time fairness ρ")
        ax.set_ylabel("fraction of apps")
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.legend(fontsize=8)
        ax.set_title(f"ρ CDF — {self.name}")
        out.append(save_figure(plt, fig, directory / "rho_cdf.png"))
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar([s.policy for s in self.summaries], [s.gpu_hours for s in self.summaries])
        ax.set_ylabel("GPU-hours")
        ax.set_title(f"GPU time — {self.name}")
        out.append(save_figure(plt, fig, directory / "gpu_hours.png"))
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in self.runs:
            xs = sorted(r.placement_scores)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=r.policy)
        ax.set_xlabel("placement score 1/S")
        ax.set_ylabel("fraction of placements")
        ax.legend(fontsize=8)
        out.append(save_figure(plt, fig, directory / "placement_cdf.png"))
        return out
