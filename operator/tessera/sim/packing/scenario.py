"""Scenario kind ``packing`` for ``tessera simulate``: FGD's experiment (Weng et al., ATC'23, §6) for every
packing policy, on Alibaba's trace or a synthetic cluster.

    kind: packing
    name: alibaba
    trace: alibaba-gpu-v2023     # a folder with openb_node_list_gpu_node.csv and openb_pod_list_default.csv:
                                 # a path (relative to this file), or a name under $TESSERA_TRACES or the
                                 # checkout's ../shared/traces
    # synthetic: {...}           # instead of trace: see tessera.sim.packing.synthetic
    seeds: [0, 1, 2]
    policies: [random, first-fit, best-fit, dot-product, gpu-packing, gpu-clustering, fgd, tessera]
    node_sample: 1               # keep every k-th node (and so 1/k of the pods): a reduced run
    tessera: {decay: 0.999, max_shapes: 64, prior: none, scores: integer}
                                 # prior: none | trace (the pod list's distribution); scores: integer (FGD's
                                 # integer score, ties to the fuller node) | exact
    fgd: {scores: integer, ties: first, workload: typical, popularity: 0.95}   # FGD as its artifact runs it;
                                 # scores: exact, ties: random, workload: full for FGD's rule as the paper states it
    arrivals: sample             # sample (with replacement, FGD §6.1) | shuffle (the pod list in random order
                                 # first, as FGD's artifact tunes its workload)
    through_extender: true       # also replay the first seed through the extender's filter/prioritize/bind

Example: ``tessera/sim/data/packing-default.yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, Strict

from tessera.policy.lanes.fragmentation import Shape, typical_workload, workload_of
from tessera.policy.lanes.packing import POLICIES, Fgd, PackingConfig, PackingPolicy, make_policy
from tessera.progress import Progress
from tessera.sim.inputs import Bool, Input, Int, PositiveInt, one_of
from tessera.sim.inputs import validate as validate_input
from tessera.sim.packing import synthetic, through_extender
from tessera.sim.packing.experiment import GRID, Curve, arrivals
from tessera.sim.packing.experiment import run as run_policy
from tessera.sim.packing.synthetic import SyntheticInput
from tessera.sim.packing.trace import NodeSpec, PackingTraceError, read_nodes, read_pods
from tessera.sim.scenario import ScenarioError

NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_default.csv"
REPORT_AT = (80, 90, 95, 100)
# FGD's published share of GPU capacity unallocated at 100 % arrived on this trace (Fig. 9 / §6.2)
PUBLISHED = {
    "random": 13.7,
    "best-fit": 7.1,
    "dot-product": 9.4,
    "gpu-packing": 8.2,
    "gpu-clustering": 8.4,
    "fgd": 4.8,
}


@dataclass(frozen=True)
class FgdVariant:
    """How FGD is run: its artifact's integer scores, tie-break and typical-pod cut, or the exact rule."""

    scores: str = "integer"  # integer | exact
    ties: str = "first"  # first (the artifact's least node name) | random (upstream selectHost)
    workload: str = "typical"  # typical (the most frequent shapes covering `popularity`) | full
    popularity: float = 0.95


@dataclass(frozen=True)
class PackingScenario:
    source: str
    name: str
    nodes: list[NodeSpec]
    pods: list[Shape]
    seeds: list[int]
    policies: list[str]
    decay: float = 0.999
    max_shapes: int = 64
    prior: str = "none"
    through_extender: bool = False
    seed: int = 0  # `--seed` replaces the seeds with this one
    origin: str = ""
    fgd: FgdVariant = field(default_factory=FgdVariant)
    arrivals: str = "sample"
    tessera_scores: str = "integer"


def trace_dir(name: str, source: str) -> Path:
    """The trace folder: a path relative to the scenario file, else a name under $TESSERA_TRACES or the
    checkout's ../shared/traces."""
    here = Path(source).resolve().parent
    candidates = [here / name, Path(name)]
    if os.environ.get("TESSERA_TRACES"):
        candidates.append(Path(os.environ["TESSERA_TRACES"]) / name)
    for parent in Path(__file__).resolve().parents:
        candidates.append(parent.parent / "shared" / "traces" / name)
    for c in candidates:
        if (c / NODE_FILE).is_file():
            return c
    raise ScenarioError(
        source, "trace", f"no {NODE_FILE} found for {name!r} (set TESSERA_TRACES or give a path)"
    )


class TesseraInput(Input):
    """Knobs of Tessera's own packing policy."""

    decay: Annotated[float, Strict(), Field(gt=0.0, le=1.0)] = 0.999
    max_shapes: PositiveInt = 64
    prior: Literal["none", "trace"] = "none"
    scores: Literal["integer", "exact"] = "integer"


class FgdInput(Input):
    """FGD as its artifact runs it (the defaults) or as the paper states the rule."""

    scores: Literal["integer", "exact"] = "integer"
    ties: Literal["first", "random"] = "first"
    workload: Literal["typical", "full"] = "typical"
    popularity: Annotated[float, Strict(), Field(gt=0.0, le=1.0)] = 0.95


class PackingFile(Input):
    """A `kind: packing` scenario: exactly one of `trace` (a folder of Alibaba's CSVs) or `synthetic`."""

    kind: Literal["packing"] = "packing"
    name: str = "packing"
    description: str | None = None
    trace: str | None = None
    synthetic: SyntheticInput | None = None
    seeds: Annotated[list[Int], Field(min_length=1)] = Field(default_factory=lambda: [0, 1, 2])
    policies: Annotated[
        list[one_of(POLICIES)],  # type: ignore[valid-type]
        Field(min_length=1, default_factory=lambda: list(POLICIES)),
    ]
    node_sample: PositiveInt = 1
    """Keep every n-th node."""
    tessera: TesseraInput = TesseraInput()
    fgd: FgdInput = FgdInput()
    arrivals: Literal["sample", "shuffle"] = "sample"
    through_extender: Bool = False


def load(data: dict[str, Any], source: str) -> PackingScenario:
    """Validate a ``kind: packing`` scenario; errors name the file and field."""
    if isinstance(data, dict):  # `tessera:` or `fgd:` left empty: the defaults
        data = {k: v for k, v in data.items() if not (k in ("tessera", "fgd") and v is None)}
    d = validate_input(PackingFile, data, source)
    if (d.trace is None) == (d.synthetic is None):
        raise ScenarioError(source, "trace", "give exactly one of trace or synthetic")
    if d.trace is not None:
        folder = trace_dir(d.trace, source)
        try:
            nodes, pods = read_nodes(folder / NODE_FILE), read_pods(folder / POD_FILE)
        except PackingTraceError as err:
            raise ScenarioError(source, "trace", str(err)) from None
        origin = str(folder)
    else:
        assert d.synthetic is not None
        nodes = synthetic.nodes_of(d.synthetic.nodes, source)
        pods = synthetic.population(synthetic.mix_of(d.synthetic.pods, source), seed=d.seeds[0])
        origin = "synthetic"
    if d.node_sample > 1:
        nodes = nodes[:: d.node_sample]
    return PackingScenario(
        source,
        d.name,
        nodes,
        pods,
        list(d.seeds),
        list(d.policies),
        d.tessera.decay,
        d.tessera.max_shapes,
        d.tessera.prior,
        d.through_extender,
        d.seeds[0],
        origin,
        FgdVariant(d.fgd.scores, d.fgd.ties, d.fgd.workload, d.fgd.popularity),
        d.arrivals,
        d.tessera.scores,
    )


@dataclass
class PackingResult:
    scenario: PackingScenario
    curves: dict[str, list[Curve]]
    pods_per_seed: list[int]
    extender: dict[str, Any] = field(default_factory=dict)

    def mean(self, policy: str, percent: int) -> tuple[float, float]:
        i = GRID.index(percent)
        cs = self.curves[policy]
        return float(np.mean([c.unallocated[i] for c in cs])), float(np.mean([c.failed[i] for c in cs]))

    def table(self) -> str:
        sc = self.scenario
        gpus = sum(n.gpus for n in sc.nodes)
        lines = [
            f"{sc.name}: {len(sc.nodes)} nodes, {gpus} GPUs, pods sampled from {len(sc.pods)} until the GPUs asked "
            f"reach capacity ({', '.join(map(str, self.pods_per_seed))} pods); mean of seeds {sc.seeds}",
            "GPU capacity unallocated (%) / failed pods, at arrived workload (% of capacity)",
            f"{'policy':<15}" + "".join(f"{p:>15}" for p in REPORT_AT) + f"{'FGD paper @100':>16}",
        ]
        for policy in sc.policies:
            cells = "".join(
                f"{100 * u:>8.2f} / {f:>4.0f}" for u, f in (self.mean(policy, p) for p in REPORT_AT)
            )
            pub = PUBLISHED.get(policy) if sc.origin != "synthetic" else None
            lines.append(f"{policy:<15}{cells}{(f'{pub:.1f}' if pub is not None else '-'):>16}")
        if self.extender:
            lines.append(
                f"through the extender (seed {self.extender['seed']}): {self.extender['unallocated_100']:.2f} % "
                f"unallocated, {self.extender['failed']} failed; same placements as the simulated rule: "
                f"{self.extender['same']} of {self.extender['pods']} pods"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.scenario.name,
            "nodes": len(self.scenario.nodes),
            "gpus": sum(n.gpus for n in self.scenario.nodes),
            "seeds": self.scenario.seeds,
            "grid_percent": list(GRID),
            "policies": {
                p: {
                    "unallocated": [c.unallocated for c in cs],
                    "failed": [c.failed for c in cs],
                    "at": {
                        str(q): dict(zip(("unallocated", "failed"), self.mean(p, q), strict=True))
                        for q in REPORT_AT
                    },
                    "published_unallocated_100": PUBLISHED.get(p),
                }
                for p, cs in self.curves.items()
            },
            "extender": self.extender,
        }

    def plots(self, directory: Path) -> list[Path]:
        from tessera.sim.plotting import pyplot, save_figure

        plt = pyplot()

        directory.mkdir(parents=True, exist_ok=True)
        out = []
        for what, label in (("unallocated", "GPU capacity unallocated (%)"), ("failed", "failed pods")):
            fig, ax = plt.subplots(figsize=(6, 4))
            for p, cs in self.curves.items():
                ys = np.mean([getattr(c, what) for c in cs], axis=0)
                ax.plot(GRID, ys * (100 if what == "unallocated" else 1), label=p)
            if what == "unallocated":
                ax.plot(GRID, [100 - g for g in GRID], "k:", label="ideal", linewidth=0.8)
                ax.set_xlim(70, 100)
                ax.set_ylim(0, 32)
            else:
                ax.set_xlim(70, 100)
            ax.set_xlabel("arrived workload (% of GPU capacity)")
            ax.set_ylabel(label)
            ax.set_title(self.scenario.name)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            path = save_figure(plt, fig, directory / f"{self.scenario.name}-{what}.png")
            out.append(path)
        return out


def tessera_config(sc: PackingScenario) -> PackingConfig:
    prior: tuple[tuple[Shape, float], ...] = ()
    if sc.prior == "trace":
        wl = workload_of(sc.pods, [])
        prior = tuple((s, float(w) * 1000) for s, w in zip(wl.shapes, wl.weight.tolist(), strict=True))
    return PackingConfig(
        decay=sc.decay, max_shapes=sc.max_shapes, prior=prior, integer_scores=sc.tessera_scores == "integer"
    )


def fgd_policy(sc: PackingScenario, models: list[str]) -> Fgd:
    """FGD with its target workload from the pod list, run as `sc.fgd` says."""
    v = sc.fgd
    wl = (
        typical_workload(sc.pods, models, v.popularity)
        if v.workload == "typical"
        else workload_of(sc.pods, models)
    )
    return Fgd(wl, integer_scores=v.scores == "integer", first_ties=v.ties == "first")


def run(scenario: PackingScenario, *, progress: bool = False) -> PackingResult:
    sc = scenario
    if sc.seed != sc.seeds[0]:  # `tessera simulate --seed N`
        sc = PackingScenario(**{**sc.__dict__, "seeds": [sc.seed]})
    capacity = float(sum(n.gpus for n in sc.nodes))
    models = sorted({n.model for n in sc.nodes})
    streams = {seed: arrivals(sc.pods, capacity, seed, sc.arrivals) for seed in sc.seeds}
    total = sum(len(s) for s in streams.values()) * len(sc.policies)
    if sc.through_extender:
        total += 2 * len(streams[sc.seeds[0]])
    curves: dict[str, list[Curve]] = {p: [] for p in sc.policies}
    cfg = tessera_config(sc)
    done = 0
    with Progress(total, "packing", enabled=progress) as bar:

        def step(note: str) -> Callable[[int], None]:
            start = done
            return lambda k: bar.update(start + k + 1, note)

        for seed, stream in streams.items():
            for p in sc.policies:
                if p == "tessera":
                    policy: PackingPolicy = cfg.policy()
                elif p == "fgd":
                    policy = fgd_policy(sc, models)
                else:
                    policy = make_policy(p, None)
                curves[p].append(
                    run_policy(
                        sc.nodes,
                        stream,
                        policy,
                        seed,
                        step(f"{p} seed {seed}"),
                    )
                )
                done += len(stream)
        ext: dict[str, Any] = {}
        if sc.through_extender:
            seed = sc.seeds[0]
            stream = through_extender.extender_shapes(streams[seed])
            nodes = through_extender.nominal_nodes(sc.nodes)
            sim = run_policy(
                nodes,
                stream,
                cfg.policy(),
                seed,
                step("simulated rule"),
            )
            done += len(stream)
            picks = through_extender.run(nodes, stream, cfg, step("through the extender"))
            allocated = sum(s.gpu_share for s, pk in zip(stream, picks, strict=True) if pk is not None)
            ext = {
                "seed": seed,
                "pods": len(stream),
                "same": sum(a == b for a, b in zip(sim.picks, picks, strict=True)),
                "failed": sum(pk is None for pk in picks),
                "unallocated_100": 100 * (1 - allocated / capacity),
                "simulated_unallocated_100": 100 * sim.unallocated[-1],
            }
    return PackingResult(sc, curves, [len(s) for s in streams.values()], ext)
