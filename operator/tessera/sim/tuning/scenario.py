"""The `tuning` scenario kind: tuning algorithms × {FIFO baseline, Fluid} on a pool of GPUs.

    kind: tuning
    name: my-run
    seed: 0                     # runs use seeds seed, seed+1, … (workload optimum and algorithm RNG)
    runs: 3                     # seeded runs per (algorithm, executor); the table shows their means
    gpus: 8                     # the pool: one machine up to 16 GPUs, else machines of 8
    algorithms: [hyperband, syncbohb, asha, bohb, pbt]
    executors: [fifo, fluid]    # fifo = each algorithm's default execution (one trial per GPU worker)
    budget: {max_budget: 27, samples: 40}      # iterations per trial at most; configs for ASHA/BOHB
    fluid: {max_pack: 2, max_workers: 4, epsilon: 0, intra_gpu: true, inter_gpu: true, dynamic: true}
    horizon: rung               # what Fluid plans on: remaining work to the next rung, or to the budget
    observe: iteration          # when time-to-target sees scores: every iteration, or milestones only
    workload: {iter_time: 10, alpha: 1.15, beta: 1.05, target: 0.85, …}   # tessera.sim.tuning.workload

Reports time-to-target, makespan, GPU utilisation and GPU-seconds (Fluid, dissertation §3.6), with
Fluid's ratio over FIFO. Every error names the file, the field and what is wrong.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, Field

from tessera.policy.fluid import FluidConfig
from tessera.progress import Progress
from tessera.sim.inputs import Budget, Gpus, Input, Int, Runs, Trials, one_of
from tessera.sim.inputs import validate as validate_input
from tessera.sim.scenario import ScenarioError
from tessera.sim.tuning.app_spec import FluidInput, WorkloadInput, build_fluid, build_workload
from tessera.sim.tuning.engine import Executor, Horizon, Observe, TuningResult
from tessera.sim.tuning.experiments import ALGORITHMS, run_one
from tessera.sim.tuning.workload import TuningWorkload

_EXECUTORS: tuple[Executor, ...] = ("fifo", "fluid")
METRICS = ("time_to_target", "makespan", "utilisation", "gpu_seconds")


@dataclass(frozen=True, slots=True)
class TuningScenario:
    name: str
    source: str
    seed: int
    runs: int
    gpus: int
    algorithms: tuple[str, ...]
    executors: tuple[Executor, ...]
    max_budget: int
    samples: int
    fluid: FluidConfig
    horizon: Horizon
    observe: Observe
    workload: TuningWorkload


def _names(known: tuple[str, ...]) -> Any:
    """A non-empty list of names out of `known` (default: all), none twice."""

    def distinct(v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("lists a name twice")
        return v

    return Annotated[
        list[one_of(known)],  # type: ignore[misc]
        Field(min_length=1, default_factory=lambda: list(known)),
        AfterValidator(distinct),
    ]


class BudgetInput(Input):
    max_budget: Budget = 27
    """Iterations per trial at most."""
    samples: Trials = 40
    """Configs for ASHA/BOHB."""


class TuningFile(Input):
    """A `kind: tuning` scenario."""

    kind: Literal["tuning"] = "tuning"
    name: str | None = None
    description: str | None = None
    seed: Int = 0
    runs: Runs = 3
    gpus: Gpus = 8
    algorithms: _names(ALGORITHMS)  # type: ignore[valid-type]
    executors: _names(_EXECUTORS)  # type: ignore[valid-type]
    budget: BudgetInput = BudgetInput()
    fluid: FluidInput = FluidInput()  # type: ignore[valid-type]
    horizon: Literal["rung", "budget"] = "rung"
    observe: Literal["iteration", "milestone"] = "iteration"
    workload: WorkloadInput = WorkloadInput()  # type: ignore[valid-type]


def load(data: dict[str, Any], source: str) -> TuningScenario:
    """Validate a `kind: tuning` scenario. Raises ScenarioError naming the file, field and problem."""
    d = validate_input(TuningFile, data, source)
    try:
        fluid = build_fluid(d.fluid)
    except (TypeError, ValueError) as e:
        raise ScenarioError(source, "fluid", str(e)) from None
    try:
        workload = build_workload(d.workload)
    except (TypeError, ValueError) as e:
        raise ScenarioError(source, "workload", str(e)) from None
    return TuningScenario(
        name=d.name if d.name is not None else Path(source).stem,
        source=source,
        seed=d.seed,
        runs=d.runs,
        gpus=d.gpus,
        algorithms=tuple(d.algorithms),
        executors=cast(tuple[Executor, ...], tuple(d.executors)),
        max_budget=d.budget.max_budget,
        samples=d.budget.samples,
        fluid=fluid,
        horizon=d.horizon,
        observe=d.observe,
        workload=workload,
    )


@dataclass(frozen=True, slots=True)
class Cell:
    """Means over the seeded runs of one algorithm under one executor."""

    algorithm: str
    executor: str
    time_to_target: float | None  # None when no run reached the target
    reached: int  # runs that reached the target
    makespan: float
    utilisation: float
    gpu_seconds: float
    runs: tuple[TuningResult, ...]

    @staticmethod
    def of(algorithm: str, executor: str, runs: list[TuningResult]) -> Cell:
        ttts = [r.time_to_target for r in runs if r.time_to_target is not None]
        n = len(runs)
        return Cell(
            algorithm,
            executor,
            sum(ttts) / len(ttts) if ttts else None,
            len(ttts),
            sum(r.makespan for r in runs) / n,
            sum(r.utilisation for r in runs) / n,
            sum(r.gpu_seconds for r in runs) / n,
            tuple(runs),
        )


@dataclass(frozen=True, slots=True)
class TuningScenarioResult:
    scenario: TuningScenario
    cells: tuple[Cell, ...]

    def cell(self, algorithm: str, executor: str) -> Cell:
        for c in self.cells:
            if c.algorithm == algorithm and c.executor == executor:
                return c
        raise KeyError(f"no result for {algorithm} under {executor}")

    def speedup(self, algorithm: str, metric: str) -> float | None:
        """FIFO / Fluid for a time metric (> 1: Fluid is faster or uses fewer GPU-seconds)."""
        try:
            base, fluid = self.cell(algorithm, "fifo"), self.cell(algorithm, "fluid")
        except KeyError:
            return None
        b, f = getattr(base, metric), getattr(fluid, metric)
        return b / f if b is not None and f else None

    def table(self) -> str:
        s = self.scenario
        head = (
            f"{s.name}: {s.gpus} GPUs, mean of {s.runs} seeded runs (seeds {s.seed}..{s.seed + s.runs - 1}), "
            f"c={s.fluid.c} d={s.fluid.d}, target score {s.workload.target}"
        )
        cols = f"{'algorithm':<10} {'executor':<8} {'to target s':>12} {'makespan s':>11} {'GPU util':>9} {'GPU-s':>9}"
        lines = [head, cols, "-" * len(cols)]
        for c in self.cells:
            ttt = "never" if c.time_to_target is None else f"{c.time_to_target:.0f}"
            if c.time_to_target is not None and c.reached < s.runs:
                ttt += f" ({c.reached}/{s.runs})"
            lines.append(
                f"{c.algorithm:<10} {c.executor:<8} {ttt:>12} {c.makespan:>11.0f} "
                f"{c.utilisation * 100:>8.1f}% {c.gpu_seconds:>9.0f}"
            )
        if "fifo" in s.executors and "fluid" in s.executors:
            lines += ["", "Fluid speed-up over FIFO (FIFO / Fluid; > 1 is better)"]
            lines.append(f"{'algorithm':<10} {'to target':>10} {'makespan':>9} {'GPU-s':>7}")
            for a in s.algorithms:
                vals = [self.speedup(a, m) for m in ("time_to_target", "makespan", "gpu_seconds")]
                cells = ["-" if v is None else f"{v:.2f}x" for v in vals]
                lines.append(f"{a:<10} {cells[0]:>10} {cells[1]:>9} {cells[2]:>7}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        s = self.scenario
        return {
            "kind": "tuning",
            "name": s.name,
            "seed": s.seed,
            "runs": s.runs,
            "gpus": s.gpus,
            "fluid": dataclasses.asdict(s.fluid),
            "horizon": s.horizon,
            "observe": s.observe,
            "workload": dataclasses.asdict(s.workload),
            "results": [
                {
                    "algorithm": c.algorithm,
                    "executor": c.executor,
                    "time_to_target": c.time_to_target,
                    "reached": c.reached,
                    "makespan": c.makespan,
                    "utilisation": c.utilisation,
                    "gpu_seconds": c.gpu_seconds,
                    "per_run": [dataclasses.asdict(r) for r in c.runs],
                }
                for c in self.cells
            ],
            "speedup": {
                a: {m: self.speedup(a, m) for m in ("time_to_target", "makespan", "gpu_seconds")}
                for a in s.algorithms
            },
        }

    def plots(self, directory: Path) -> list[Path]:
        """One grouped bar chart per metric: algorithms on x, one bar per executor."""
        from tessera.sim.plotting import pyplot, save_figure

        plt = pyplot()

        directory.mkdir(parents=True, exist_ok=True)
        s = self.scenario
        labels = {
            "time_to_target": "time to target (s)",
            "makespan": "makespan (s)",
            "utilisation": "mean GPU utilisation",
            "gpu_seconds": "GPU-seconds",
        }
        out: list[Path] = []
        width = 0.8 / len(s.executors)
        for metric, label in labels.items():
            fig, ax = plt.subplots(figsize=(6.5, 3.8))
            for k, ex in enumerate(s.executors):
                vals = [getattr(self.cell(a, ex), metric) for a in s.algorithms]
                xs = [i + (k - (len(s.executors) - 1) / 2) * width for i in range(len(s.algorithms))]
                ax.bar(xs, [math.nan if v is None else v for v in vals], width, label=ex)
            ax.set_xticks(range(len(s.algorithms)), list(s.algorithms))
            ax.set_ylabel(label)
            ax.set_title(f"{s.name}: {label}, {s.gpus} GPUs, mean of {s.runs} runs")
            ax.legend()
            path = save_figure(plt, fig, directory / f"{s.name}-{metric.replace('_', '-')}.png", dpi=110)
            out.append(path)
        return out


def run(scenario: TuningScenario, *, progress: bool = False) -> TuningScenarioResult:
    """Every algorithm under every executor, `runs` seeded runs each (same seeds for both executors)."""
    s = scenario
    total = len(s.algorithms) * len(s.executors) * s.runs
    cells: list[Cell] = []
    with Progress(total, f"tuning {s.name}", enabled=None if progress else False) as bar:
        done = 0
        for a in s.algorithms:
            for ex in s.executors:
                runs = []
                for k in range(s.runs):
                    runs.append(
                        run_one(
                            a,
                            ex,
                            s.gpus,
                            s.seed + k,
                            s.workload,
                            s.fluid,
                            samples=s.samples,
                            max_budget=s.max_budget,
                            horizon=s.horizon,
                            observe=s.observe,
                        )
                    )
                    done += 1
                    bar.update(done, f"{a}/{ex}")
                cells.append(Cell.of(a, ex, runs))
    return TuningScenarioResult(s, tuple(cells))
