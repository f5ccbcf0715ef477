"""Benchmark: Tessera's team queues and the real Kueue, side by side on one control plane, over several seeds.

    .venv/bin/python tests/bench/bench_kueue_side_by_side.py [--seeds 1-10] [--speed 240]
        [--restart-s 30] [--kueue-reclaim Never] [--leftover-order random] [--json out.json]
        [--scenario examples/scenarios/multi-team.yaml] [--sim-only]

`--sim-only` runs the simulator alone on the same seeds' workloads (no cluster: seconds a seed).

One control plane (tests/integration/kwok: etcd, kube-apiserver, kube-controller-manager with the Job
controller), kwok playing two identical pools of GPU nodes (the scenario's machines: 8 nodes of 4 GPUs), and
both systems running at once, each on its own pool:

- **Kueue** (v0.17, built from its Go module by hack/kueue-assets.sh; tests/integration/kueue/harness.py)
  with one ResourceFlavor for its pool (a node label), one ClusterQueue per team in one cohort —
  `nominalQuota` the team's guarantee, `borrowingLimit` its maximum less its guarantee, Kueue's default
  preemption (`reclaimWithinCohort: Never`, `withinClusterQueue: Never`; `--kueue-reclaim Any` or
  `LowerPriority` to change the first) and queueing strategy (BestEffortFIFO) — and a LocalQueue per team
  namespace. Each of the scenario's jobs is a batch/v1 Job of one pod asking its GPUs as `nvidia.com/gpu`
  (the name NVIDIA's device plugin gives them; the Kueue pool's nodes have it), bound by kube-scheduler's
  default profile. Kueue's fair-sharing weights are off by default and are not turned on: a team's
  `weight` has no counterpart there.
- **Tessera**: the operator (in this process, as the chart's ServiceAccount) with one Queue per team
  (guarantee, maximum, weight, reclaim mode and minimum runtime as the scenario gives them) and each job an
  App in the team's namespace (labelled `tessera.io/queue`), its pods bound by tessera-scheduler through the
  extender to the Tessera pool's nodes (`tessera.io/gpu`, the agent's GPU inventory annotation).

Time runs `--speed` times faster than the scenario's: a scenario second is 1/speed of a wall second. The
operator runs on a clock that does the same (its leases, minimum runtimes and T_id are in scenario seconds;
its tick is a tenth of a lease in scenario time, as deployed), so Tessera's lease period is the scenario's
`lease_s` (600 s). Kueue has no period to scale: it acts on events. What cannot be scaled is each system's
reaction time (a watch event, a scheduling cycle, a pod created and bound): at speed 240 a wall second is 4
scenario minutes, against jobs of 1-2 hours (3-8 GPU-hours). Checkpoint graces are 0 here (kwok removes a
deleted pod at once); the restart cost below stands for checkpoint and restart on both sides.

What runs the jobs is this bench (`Trainer`), the same code for both sides, in the place of the training
program: every `--tick` wall seconds it lists the bench's pods, and a job whose set of Running pods changed
(started, moved, preempted) restarts: `--restart-s` scenario seconds without progress, then iterations at
min(GPUs held, GPUs asked) / (iter_time × S), S the placement slowdown the simulator uses (1 on one node,
1.1 across nodes: the App API's default `crossMachine`). Progress survives a preemption (a checkpoint) on
both sides. A Tessera job reports its iterations in `tessera.io/progress` on its pods (once a wall second),
as the SDK does; a job that has run all its iterations has its pods marked Succeeded (the Job completes,
Kueue releases its quota; the App finishes).

Workload per seed: the scenario's apps (multi-team: team-a bursts, team-b is steady, team-c arrives late,
32 GPUs), each arrival moved later by up to `--jitter-s` (600) and each job's iterations scaled by a factor
in [0.85, 1.15], both drawn from the seed (seed 0: as written). The same workload goes to both sides at once.
The operator runs with the seed too (Themis' random handing out of leftover GPUs).

Measured per side and seed, with the simulator's definitions (tessera/sim/training/queues.py): guarantee
violations (GPU-seconds a queue with waiting work held less than min(guarantee, demand)), the longest spell
and the mean (time to reclaim), borrowed GPU-hours (held above the guarantee), allocation (GPU-seconds held
/ GPUs × makespan), useful utilisation (work / GPUs × makespan; work = iterations × iter_time GPU-seconds),
each app's ρ = JCT / T_id (T_id: the app's work on min(its queue's share when every queue has work / N_avg,
its GPUs), N_avg the mean number of its queue's apps alive during its life), worst and mean per-queue max ρ,
and average JCT. Every figure is in scenario seconds and hours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import ssl
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tessera.api import contract  # noqa: E402
from tessera.policy.queues.division import QueueNode  # noqa: E402
from tessera.policy.themis.estimate import t_id  # noqa: E402
from tessera.sim.packing.trace import NodeSpec  # noqa: E402
from tessera.sim.training.queues import static_shares  # noqa: E402

from tests.bench.bench_arbiter_realcluster import prepare, quiet_logging  # noqa: E402
from tests.integration.k8s.conftest import run_scheduling, running_operator  # noqa: E402
from tests.integration.k8s.controlplane import ADMIN_TOKEN, ControlPlane, default_scheduler  # noqa: E402
from tests.integration.kueue import harness as kueue  # noqa: E402
from tests.integration.kwok import harness as kwok  # noqa: E402

SCENARIO = ROOT / "examples" / "scenarios" / "multi-team.yaml"
SIDES = ("tessera", "kueue")
KUEUE_GPU = "nvidia.com/gpu"
POOL_LABEL = f"{contract.GROUP}/bench-pool"
BENCH_LABEL = f"{contract.GROUP}/bench"
SIDE_LABEL = f"{contract.GROUP}/bench-side"
APP_LABEL = f"{contract.GROUP}/bench-app"
COHORT = "bench"
FLAVOR = "bench-gpu"
CROSS_MACHINE = 1.1  # the App API's default PlacementSensitivity.cross_machine, as the simulator applies it
START = 1_700_000_000.0
_EPS = 1e-9


def say(msg: str) -> None:
    print(f"[bench_kueue_side_by_side {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the workload -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    guaranteed: int
    max: int | None
    weight: float
    reclaim: str
    min_runtime_s: float

    def node(self) -> QueueNode:
        return QueueNode(
            self.name, float(self.guaranteed), math.inf if self.max is None else self.max, self.weight
        )


@dataclass(frozen=True, slots=True)
class Work:
    """One app of the scenario: one job of `gpus` GPUs."""

    app: str
    team: str
    arrival: float
    iterations: int
    iter_time: float
    gpus: int

    @property
    def work(self) -> float:
        """Serial GPU-seconds (the simulator's total_work)."""
        return self.iterations * self.iter_time


@dataclass(frozen=True, slots=True)
class Scenario:
    teams: tuple[Team, ...]
    apps: tuple[Work, ...]
    nodes: int
    gpus_per_node: int
    lease_s: float
    restart_s: float

    @property
    def capacity(self) -> int:
        return self.nodes * self.gpus_per_node


def load(path: Path) -> Scenario:
    """The scenario's teams, apps (one job each), machines, lease and restart cost."""
    doc = yaml.safe_load(path.read_text())
    machines = doc["cluster"]["machines"]
    if len(machines) != 1:
        raise SystemExit(f"{path}: the bench needs one machine shape, got {len(machines)}")
    m = machines[0]
    teams = tuple(
        Team(
            q["name"],
            int(q.get("guaranteed", 0)),
            int(q["max"]) if "max" in q else None,
            float(q.get("weight", 1.0)),
            q.get("reclaim", "atLeaseEnd"),
            float(q.get("min_runtime_s", 0.0)),
        )
        for q in doc["queues"]
    )
    apps = []
    for a in doc["trace"]["apps"]:
        if len(a["jobs"]) != 1:
            raise SystemExit(f"{path}: app {a['id']}: the bench runs one job an app")
        j = a["jobs"][0]
        apps.append(
            Work(
                a["id"],
                a["queue"],
                float(a["arrival"]),
                int(j["iterations"]),
                float(j["iter_time"]),
                int(j["gpus"]),
            )
        )
    return Scenario(
        teams,
        tuple(apps),
        int(m["count"]),
        int(m.get("slots", 1)) * int(m["gpus_per_slot"]),
        float((doc.get("themis") or {}).get("lease_s", 600.0)),
        float((doc.get("sim") or {}).get("restart_s", 0.0)),
    )


def perturbed(apps: tuple[Work, ...], seed: int, jitter_s: float) -> tuple[Work, ...]:
    """The seed's workload: arrivals later by up to `jitter_s`, iterations × [0.85, 1.15]; seed 0 unchanged."""
    if seed == 0:
        return apps
    rng = random.Random(seed)
    out = [
        Work(
            w.app,
            w.team,
            w.arrival + rng.uniform(0.0, jitter_s),
            max(1, round(w.iterations * rng.uniform(0.85, 1.15))),
            w.iter_time,
            w.gpus,
        )
        for w in apps
    ]
    return tuple(sorted(out, key=lambda w: (w.arrival, w.app)))


# --- what both sides are measured with ----------------------------------------------------------------------


@dataclass(slots=True)
class JobRun:
    """One job on one side: its GPUs now and the progress they made."""

    work: Work
    created: bool = False
    pods: frozenset[str] = frozenset()  # uids of its Running pods
    held: int = 0
    rate: float = 0.0  # iterations per scenario second once unpaused
    paused_until: float = 0.0
    done_iters: float = 0.0
    finished_at: float | None = None
    marked: bool = False  # its pods were marked Succeeded
    restarts: int = 0
    reported: int = -1
    first_start: float | None = None  # when its pods first ran (scenario time)

    def advance(self, t0: float, t1: float) -> None:
        """Progress from t0 to t1 at the rate that held; the exact finish time if it crossed the end."""
        if self.finished_at is not None or self.rate <= 0:
            return
        start = max(t0, self.paused_until)
        if t1 <= start:
            return
        left = self.work.iterations - self.done_iters
        gain = (t1 - start) * self.rate
        if gain >= left - _EPS:
            self.done_iters = float(self.work.iterations)
            self.finished_at = start + left / self.rate
        else:
            self.done_iters += gain

    def placed(self, t: float, pods: frozenset[str], held: int, nodes: int, restart_s: float) -> None:
        """Its Running pods changed at `t`: a restart (after a checkpoint) on the new ones, or a stop."""
        self.pods, self.held = pods, held
        if not pods:
            self.rate = 0.0
            return
        slowdown = 1.0 if nodes <= 1 else CROSS_MACHINE
        self.rate = min(held, self.work.gpus) / (self.work.iter_time * slowdown)
        self.paused_until = t + restart_s
        self.restarts += 1
        if self.first_start is None:
            self.first_start = t


@dataclass(slots=True)
class Meter:
    """Per queue: GPU-seconds held, below min(guarantee, demand), above the guarantee; violation spells."""

    teams: tuple[Team, ...]
    held_gpu_s: float = 0.0
    violation_gpu_s: dict[str, float] = field(default_factory=dict)
    borrowed_gpu_s: dict[str, float] = field(default_factory=dict)
    spells: dict[str, list[float]] = field(default_factory=dict)  # per queue: finished spells' lengths
    _since: dict[str, float] = field(default_factory=dict)
    _last: float | None = None

    def sample(self, t: float, jobs: list[JobRun]) -> None:
        """The state that held since the last sample (the jobs' GPUs before this tick's changes)."""
        if self._last is not None and t > self._last:
            dt = t - self._last
            for team in self.teams:
                mine = [j for j in jobs if j.work.team == team.name and j.created]
                held = sum(j.held for j in mine)
                demand = sum(j.work.gpus for j in mine if j.finished_at is None or j.finished_at > self._last)
                self.held_gpu_s += held * dt
                self.borrowed_gpu_s[team.name] = (
                    self.borrowed_gpu_s.get(team.name, 0.0) + max(0.0, held - team.guaranteed) * dt
                )
                short = min(team.guaranteed, demand) - held
                if short > _EPS:
                    self.violation_gpu_s[team.name] = self.violation_gpu_s.get(team.name, 0.0) + short * dt
                    self._since.setdefault(team.name, self._last)
                elif team.name in self._since:
                    self.spells.setdefault(team.name, []).append(self._last - self._since.pop(team.name))
        self._last = t

    def close(self) -> None:
        for name, since in self._since.items():
            if self._last is not None:
                self.spells.setdefault(name, []).append(self._last - since)
        self._since.clear()


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue's part of a side's figures."""

    violation_gpu_s: float
    longest_violation_s: float
    mean_time_to_reclaim_s: float
    borrowed_gpu_h: float
    max_rho: float
    mean_rho: float
    avg_jct_h: float


@dataclass(frozen=True, slots=True)
class Figures:
    side: str
    seed: int
    violation_gpu_s: float
    longest_violation_s: float
    mean_time_to_reclaim_s: float
    borrowed_gpu_h: dict[str, float]
    utilisation: float
    useful: float
    worst_max_rho: float
    mean_rho: float
    max_rho: dict[str, float]
    avg_jct_h: float
    makespan_h: float
    restarts: int
    unfinished: int
    first_start_s: float  # the quickest arrival → first Running pod: the side's reaction time, at least
    by_queue: dict[str, QueueRow]


def n_avg(w: Work, finish: float, lives: list[tuple[str, float, float]]) -> float:
    """Mean number of `w`'s queue's apps alive during its life (itself included)."""
    span = finish - w.arrival
    if span <= 0:
        return 1.0
    overlap = sum(
        max(0.0, min(finish, end) - max(w.arrival, start)) for team, start, end in lives if team == w.team
    )
    return max(1.0, overlap / span)


def figures(side: str, seed: int, sc: Scenario, jobs: list[JobRun], meter: Meter) -> Figures:
    meter.close()
    done = [j for j in jobs if j.finished_at is not None]
    end = max((j.finished_at for j in done if j.finished_at is not None), default=0.0)
    start = min((j.work.arrival for j in jobs), default=0.0)
    makespan = end - start
    lives = [(j.work.team, j.work.arrival, j.finished_at) for j in done if j.finished_at is not None]
    shares = static_shares(sc.capacity, [t.node() for t in sc.teams], {t.name for t in sc.teams})
    rho: dict[str, list[float]] = {}
    for j in done:
        assert j.finished_at is not None
        tid = t_id(
            j.work.work,
            max(1, round(shares[j.work.team])),
            j.work.gpus,
            n_avg(j.work, j.finished_at, lives),
            "exact",
        )
        rho.setdefault(j.work.team, []).append((j.finished_at - j.work.arrival) / tid)
    max_rho = {q: max(v) for q, v in sorted(rho.items())}
    span = sc.capacity * makespan
    jct = [j.finished_at - j.work.arrival for j in done if j.finished_at is not None]
    spells = [s for v in meter.spells.values() for s in v]
    by_queue = {
        t.name: QueueRow(
            violation_gpu_s=meter.violation_gpu_s.get(t.name, 0.0),
            longest_violation_s=max(meter.spells.get(t.name, []), default=0.0),
            mean_time_to_reclaim_s=statistics.fmean(meter.spells[t.name])
            if meter.spells.get(t.name)
            else 0.0,
            borrowed_gpu_h=meter.borrowed_gpu_s.get(t.name, 0.0) / 3600,
            max_rho=max(rho.get(t.name, []), default=math.nan),
            mean_rho=statistics.fmean(rho[t.name]) if rho.get(t.name) else math.nan,
            avg_jct_h=statistics.fmean(
                j.finished_at - j.work.arrival
                for j in done
                if j.work.team == t.name and j.finished_at is not None
            )
            / 3600
            if any(j.work.team == t.name for j in done)
            else math.nan,
        )
        for t in sc.teams
    }
    return Figures(
        side=side,
        seed=seed,
        violation_gpu_s=sum(meter.violation_gpu_s.values()),
        longest_violation_s=max(spells, default=0.0),
        mean_time_to_reclaim_s=statistics.fmean(spells) if spells else 0.0,
        borrowed_gpu_h={q: v / 3600 for q, v in sorted(meter.borrowed_gpu_s.items())},
        utilisation=meter.held_gpu_s / span if span > 0 else 0.0,
        useful=sum(j.work.work for j in done) / span if span > 0 else 0.0,
        worst_max_rho=max(max_rho.values(), default=math.nan),
        mean_rho=statistics.fmean(r for v in rho.values() for r in v) if rho else math.nan,
        max_rho=max_rho,
        avg_jct_h=statistics.fmean(jct) / 3600 if jct else math.nan,
        makespan_h=makespan / 3600,
        restarts=sum(j.restarts for j in jobs),
        unfinished=len(jobs) - len(done),
        first_start_s=min(
            (j.first_start - j.work.arrival for j in jobs if j.first_start is not None), default=math.nan
        ),
        by_queue=by_queue,
    )


# --- the simulator on the same workload -------------------------------------------------------------------


def simulated(
    path: Path,
    apps: tuple[Work, ...],
    seed: int,
    restart_s: float,
    reclaim: str,
    leftover_order: str = "random",
) -> dict[str, dict[str, Any]]:
    """The simulator's figures for the seed's workload: Tessera's queues and its model of Kueue as configured
    here (`kueue-style`, BestEffortFIFO, `reclaim_within_cohort` as Kueue's), same seed and restart cost."""
    from tessera.sim.training import scenario as training

    doc = yaml.safe_load(path.read_text())
    doc["seed"] = seed
    doc["policies"] = [
        {"policy": "themis", "label": "tessera", "leftover_order": leftover_order},
        {
            "policy": "kueue-style",
            "label": "kueue",
            "queueing_strategy": "BestEffortFIFO",
            "reclaim_within_cohort": reclaim,
        },
    ]
    doc["sim"] = {**(doc.get("sim") or {}), "restart_s": restart_s}
    doc["trace"] = {
        "apps": [
            {
                "id": w.app,
                "queue": w.team,
                "arrival": w.arrival,
                "jobs": [{"iterations": w.iterations, "iter_time": w.iter_time, "gpus": w.gpus}],
            }
            for w in apps
        ]
    }
    result = training.run(training.load(doc, str(path)), workers=1)
    # starts: every placement of a job's GPUs (a start or a move), as the trainer counts them
    return {r.policy: {**(r.queues or {}), "starts": len(r.placement_scores)} for r in result.runs}


# --- the cluster ------------------------------------------------------------------------------------------------


def pool_nodes(sc: Scenario, side: str) -> list[dict[str, Any]]:
    """The scenario's machines as kwok nodes of one side's pool."""
    out = []
    for i in range(sc.nodes):
        spec = NodeSpec(f"{side}-{i}", 64_000, 512 * 1024, sc.gpus_per_node, "A100")
        body = kwok.node_body(spec, reserve=side == "tessera")
        body["metadata"]["labels"][POOL_LABEL] = side
        if side == "kueue":  # NVIDIA's device plugin's resource, no Tessera inventory: the operator skips it
            del body["metadata"]["annotations"][contract.ANN_NODE_GPUS]
            for key in ("capacity", "allocatable"):
                body["status"][key][KUEUE_GPU] = body["status"][key].pop(contract.RESOURCE_GPU)
        out.append(body)
    return out


def namespace(side: str, team: str, seed: int) -> str:
    return f"{side[0]}-{team}-s{seed}"


def kueue_objects(sc: Scenario, reclaim: str) -> list[tuple[str, dict[str, Any]]]:
    """The flavor and one ClusterQueue per team in one cohort (paths relative to Kueue's API)."""
    api = f"{kueue.GROUP}/{kueue.VERSION}"
    out: list[tuple[str, dict[str, Any]]] = [
        (
            "resourceflavors",
            {
                "apiVersion": api,
                "kind": "ResourceFlavor",
                "metadata": {"name": FLAVOR},
                "spec": {"nodeLabels": {POOL_LABEL: "kueue"}},
            },
        )
    ]
    for team in sc.teams:
        gpu: dict[str, Any] = {"name": KUEUE_GPU, "nominalQuota": team.guaranteed}
        if team.max is not None:
            gpu["borrowingLimit"] = team.max - team.guaranteed
        spec: dict[str, Any] = {
            "cohortName": COHORT,
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", KUEUE_GPU],
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": "memory", "nominalQuota": "4000Gi"},
                                gpu,
                            ],
                        }
                    ],
                }
            ],
        }
        if reclaim != "Never":
            spec["preemption"] = {"reclaimWithinCohort": reclaim}
        out.append(
            (
                "clusterqueues",
                {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": team.name}, "spec": spec},
            )
        )
    return out


def tessera_queue(team: Team) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "guaranteedGPUs": team.guaranteed,
        "weight": team.weight,
        "reclaim": {
            "mode": team.reclaim,
            "minRuntimeSeconds": team.min_runtime_s,
            "checkpointGraceSeconds": 0,
        },
    }
    if team.max is not None:
        spec["maxGPUs"] = team.max
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": team.name},
        "spec": spec,
    }


def labels(side: str, seed: int, app: str) -> dict[str, str]:
    return {BENCH_LABEL: f"s{seed}", SIDE_LABEL: side, APP_LABEL: app}


def container(resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": "train", "image": "registry.invalid/train:bench", "resources": resources}


def kueue_job(w: Work, seed: int) -> dict[str, Any]:
    """One Job of one pod asking the job's GPUs, in the team's LocalQueue."""
    gpus = str(w.gpus)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": w.app, "labels": {kueue.QUEUE_LABEL: w.team}},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels("kueue", seed, w.app)},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        container(
                            {
                                "requests": {"cpu": "1", "memory": "4Gi", KUEUE_GPU: gpus},
                                "limits": {KUEUE_GPU: gpus},
                            }
                        )
                    ],
                },
            },
        },
    }


def tessera_app(w: Work, seed: int, restart_s: float) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "App",
        "metadata": {"name": w.app},
        "spec": {
            "template": {
                "metadata": {"labels": labels("tessera", seed, w.app)},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [container({"requests": {"cpu": "1", "memory": "4Gi"}})],
                },
            },
            "jobs": [
                {
                    "name": "train",
                    "iterTotal": w.iterations,
                    "iterTimeSerialSeconds": w.iter_time,
                    "maxGPUs": w.gpus,
                    "checkpointSeconds": restart_s,
                }
            ],
        },
    }


class ScaledClock:
    """Scenario time for the operator: `speed` scenario seconds a wall second, from START."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    def __call__(self) -> float:
        return START + self.elapsed()


# --- the run ------------------------------------------------------------------------------------------------------


class Api:
    """The admin's HTTP client (what the bench writes and lists on the API server)."""

    def __init__(self, cp: ControlPlane, http: aiohttp.ClientSession) -> None:
        self.base = cp.server
        self.http = http

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ok: tuple[int, ...] = (200, 201),
        patch: str | None = None,
    ) -> Any:
        headers = {"Content-Type": patch} if patch else None
        async with self.http.request(method, self.base + path, json=body, headers=headers) as resp:
            text = await resp.text()
            if resp.status not in ok:
                raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {text[:400]}")
            return json.loads(text) if text else None


def pod_gpus(pod: dict[str, Any], side: str) -> int:
    name = contract.RESOURCE_GPU if side == "tessera" else KUEUE_GPU
    total = 0
    for c in pod["spec"].get("containers") or []:
        res = c.get("resources") or {}
        total += int((res.get("limits") or {}).get(name) or (res.get("requests") or {}).get(name) or 0)
    return total


class Trainer:
    """Both sides' jobs: creates them at their arrivals, plays their training from their Running pods,
    reports Tessera's progress, marks a finished job's pods Succeeded, and meters both sides."""

    def __init__(
        self, api: Api, sc: Scenario, apps: tuple[Work, ...], seed: int, clock: ScaledClock, restart_s: float
    ) -> None:
        self.api, self.sc, self.seed, self.clock, self.restart_s = api, sc, seed, clock, restart_s
        self.jobs = {side: {w.app: JobRun(w) for w in apps} for side in SIDES}
        self.meters = {side: Meter(sc.teams) for side in SIDES}
        self.last = 0.0
        self.last_report = 0.0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.errors: list[str] = []
        self.succeeded: set[str] = set()  # pods marked Succeeded
        self.pod_states: dict[str, list[int]] = {}

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(str(task.exception())[:400])

    async def create(self, side: str, w: Work) -> None:
        ns = namespace(side, w.team, self.seed)
        if side == "kueue":
            await self.api.call("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", kueue_job(w, self.seed))
        else:
            path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.PLURAL_APP}"
            await self.api.call("POST", path, tessera_app(w, self.seed, self.restart_s))

    async def succeed(self, ns: str, name: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": "train",
                        "ready": False,
                        "restartCount": 0,
                        "image": "registry.invalid/train:bench",
                        "imageID": "",
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "finishedAt": now,
                                "startedAt": now,
                            }
                        },
                    }
                ],
            }
        }
        await self.api.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{name}/status",
            body,
            ok=(200, 404),  # moved or preempted meanwhile: its next pods are marked
            patch="application/merge-patch+json",
        )

    async def report(self, ns: str, name: str, iterations: int) -> None:
        body = {"metadata": {"annotations": {contract.ANN_PROGRESS: json.dumps({"iterations": iterations})}}}
        await self.api.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{name}",
            body,
            ok=(200, 404),
            patch="application/merge-patch+json",
        )

    def finished(self) -> bool:
        return all(j.finished_at is not None and j.marked for side in SIDES for j in self.jobs[side].values())

    async def tick(self) -> None:
        t = self.clock.elapsed()
        for side in SIDES:
            for j in self.jobs[side].values():
                if not j.created and j.work.arrival <= t:
                    j.created = True
                    self.spawn(self.create(side, j.work))
        listing = await self.api.call("GET", f"/api/v1/pods?labelSelector={BENCH_LABEL}%3Ds{self.seed}")
        self.pod_states = {side: [0, 0, 0] for side in SIDES}  # not bound, bound and not running, running
        for pod in listing["items"]:
            phase = (pod.get("status") or {}).get("phase")
            if pod["metadata"].get("deletionTimestamp") or phase not in ("Pending", "Running"):
                continue
            at = 2 if phase == "Running" else 1 if pod["spec"].get("nodeName") else 0
            self.pod_states[pod["metadata"]["labels"][SIDE_LABEL]][at] += 1
        t = self.clock.elapsed()  # the pods as listed now
        running: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in listing["items"]:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Running":
                continue
            key = (meta["labels"][SIDE_LABEL], meta["labels"][APP_LABEL])
            running.setdefault(key, []).append(pod)
        report = t - self.last_report >= self.clock.speed  # once a wall second
        for side in SIDES:
            jobs = list(self.jobs[side].values())
            for j in jobs:
                j.advance(self.last, t)
            self.meters[side].sample(t, jobs)
            for j in jobs:
                pods = running.get((side, j.work.app), [])
                uids = frozenset(p["metadata"]["uid"] for p in pods)
                if j.finished_at is not None:
                    # Every Running pod of a finished job ends (one its system started after the finish too:
                    # it waits for them to end before it takes the job as done).
                    for p in pods:
                        if p["metadata"]["uid"] not in self.succeeded:
                            self.succeeded.add(p["metadata"]["uid"])
                            j.marked = True
                            self.spawn(self.succeed(p["metadata"]["namespace"], p["metadata"]["name"]))
                    j.pods, j.held = uids, sum(pod_gpus(p, side) for p in pods)
                    continue
                if uids != j.pods:
                    nodes = len({p["spec"].get("nodeName") for p in pods})
                    j.placed(t, uids, sum(pod_gpus(p, side) for p in pods), nodes, self.restart_s)
                if side == "tessera" and report and pods and int(j.done_iters) != j.reported:
                    j.reported = int(j.done_iters)
                    p = pods[0]["metadata"]
                    self.spawn(self.report(p["namespace"], p["name"], j.reported))
        if report:
            self.last_report = t
        self.last = t

    def progress_line(self) -> str:
        """Per side: jobs done, and each team's GPUs held / asked for by its live jobs."""
        parts = []
        for side in SIDES:
            jobs = list(self.jobs[side].values())
            teams = " ".join(
                f"{t.name[-1]} {sum(j.held for j in jobs if j.work.team == t.name)}/"
                f"{sum(j.work.gpus for j in jobs if j.work.team == t.name and j.created and j.finished_at is None)}"
                for t in self.sc.teams
            )
            u, b, r = self.pod_states.get(side, [0, 0, 0])
            parts.append(
                f"{side}: {sum(j.finished_at is not None for j in jobs)}/{len(jobs)} done, held/asked {teams}, "
                f"pods {u} unbound {b} bound {r} running"
            )
        return f"t={self.clock.elapsed() / 3600:.2f} h  " + "; ".join(parts)


async def run_seed(
    cp: ControlPlane, creds: Any, sc: Scenario, seed: int, args: argparse.Namespace
) -> dict[str, Figures]:
    apps = perturbed(sc.apps, seed, args.jitter_s)
    restart_s = args.restart_s if args.restart_s is not None else sc.restart_s
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(
        headers=headers, connector=aiohttp.TCPConnector(ssl=ctx, limit=16)
    ) as http:
        api = Api(cp, http)
        for team in sc.teams:
            for side in SIDES:
                ns = namespace(side, team.name, seed)
                lab = (
                    {contract.LABEL_QUEUE: team.name} if side == "tessera" else {kueue.MANAGED_LABEL: "true"}
                )
                await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": lab}})
                await wait_sa(api, ns)
            await api.call(
                "POST",
                f"/apis/{kueue.GROUP}/{kueue.VERSION}/namespaces/{namespace('kueue', team.name, seed)}/localqueues",
                {
                    "apiVersion": f"{kueue.GROUP}/{kueue.VERSION}",
                    "kind": "LocalQueue",
                    "metadata": {"name": team.name},
                    "spec": {"clusterQueue": team.name},
                },
            )
        clock = ScaledClock(args.speed)
        settings = {
            "lease_s": sc.lease_s,
            "tick_s": args.operator_tick or sc.lease_s / 10 / args.speed,
            "clock": clock,
            "preemption_grace_s": 0,
            "serving_stats_interval_s": 0,
            "seed": seed,
            "leftover_order": args.leftover_order,
        }
        async with running_operator(cp, creds, stop_timeout=60.0, **settings):
            clock.t0 = time.monotonic()  # scenario time 0: the first arrivals
            trainer = Trainer(api, sc, apps, seed, clock, restart_s)
            horizon = (max(w.arrival for w in apps) + sum(w.work for w in apps) / sc.capacity) * 4
            next_say = 0.0
            while not trainer.finished():
                await trainer.tick()
                if trainer.errors:
                    raise RuntimeError("; ".join(trainer.errors[:3]))
                if clock.elapsed() > horizon:
                    say(f"seed {seed}: gave up at {horizon / 3600:.1f} h (scenario time)")
                    break
                if time.monotonic() >= next_say:
                    say(f"seed {seed}: {trainer.progress_line()}")
                    if args.verbose:
                        say(f"  Queues: {await queue_line(api)}")
                    next_say = time.monotonic() + args.say_every
                await asyncio.sleep(args.tick)
            if trainer.tasks:
                await asyncio.gather(*trainer.tasks, return_exceptions=True)
            for side in SIDES:  # with the operator running: it removes its finalizers from the Apps
                for team in sc.teams:
                    ns = namespace(side, team.name, seed)
                    await api.call("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
    return {
        side: figures(side, seed, sc, list(trainer.jobs[side].values()), trainer.meters[side])
        for side in SIDES
    }


async def queue_line(api: Api) -> str:
    """Each Tessera Queue's share, GPUs held, objects waiting and why the first waits."""
    out = await api.call("GET", f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_QUEUE}")
    parts = []
    for q in out["items"]:
        st = q.get("status") or {}
        first = (st.get("pending") or [{}])[0]
        parts.append(
            f"{q['metadata']['name']} share {st.get('shareGPUs')} held {st.get('allocatedGPUs')} "
            f"waiting {st.get('waiting')} ({first.get('reason', '-')})"
        )
    return "; ".join(parts)


async def wait_sa(api: Api, ns: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await api.call("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@contextlib.contextmanager
def cluster(sc: Scenario, reclaim: str) -> Iterator[tuple[ControlPlane, Any]]:
    with kwok.kwok_control_plane() as cp:
        creds = prepare(cp)
        kwok.start_kwok(cp)
        kwok.create_nodes(cp, pool_nodes(sc, "tessera") + pool_nodes(sc, "kueue"))
        with (
            run_scheduling(cp, creds["scheduler"]),
            default_scheduler(cp),
            kueue.running_kueue(cp) as running,
        ):
            say(f"Kueue {running.version} running")
            for plural, body in kueue_objects(sc, reclaim):
                status, out = cp.request("POST", f"{kueue.API}/{plural}", body)
                if status != 201:
                    raise RuntimeError(
                        f"creating {body['kind']} {body['metadata']['name']}: {status} {str(out)[:400]}"
                    )
            for team in sc.teams:
                path = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_QUEUE}"
                status, out = cp.request("POST", path, tessera_queue(team))
                if status != 201:
                    raise RuntimeError(f"creating Queue {team.name}: {status} {str(out)[:400]}")
            yield cp, creds["operator"]


# --- the report ---------------------------------------------------------------------------------------------------


def seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def row(f: Figures) -> str:
    borrowed = sum(f.borrowed_gpu_h.values())
    side = f.side + (f" ({f.unfinished} unfinished)" if f.unfinished else "")
    return (
        f"| {f.seed} | {side} | {f.violation_gpu_s:.0f} | {f.longest_violation_s:.0f} | {f.mean_time_to_reclaim_s:.0f} "
        f"| {borrowed:.1f} | {f.utilisation:.3f} | {f.useful:.3f} | {f.worst_max_rho:.2f} | {f.mean_rho:.2f} "
        f"| {f.avg_jct_h:.2f} | {f.restarts} | {f.first_start_s:.0f} |"
    )


HEAD = (
    "| seed | side | viol GPU-s | longest s | reclaim s | borrowed GPU-h | alloc | useful | worst ρ | mean ρ | JCT h "
    "| starts | first start s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def sim_row(seed: int, label: str, q: dict[str, Any]) -> str:
    return (
        f"| {seed} | simulator: {label} | {q['violation_gpu_s']:.0f} | {q['longest_violation_s']:.0f} "
        f"| {q['mean_time_to_reclaim_s']:.0f} | | {q['utilisation']:.3f} | {q['useful']:.3f} "
        f"| {q['worst_max_rho']:.2f} | | {q['avg_jct_h']:.2f} | {q['starts']} | |"
    )


def summary(results: list[dict[str, Figures]]) -> str:
    lines = [
        "| side | worst ρ mean (worst) | mean ρ | viol GPU-s mean | longest s | useful | alloc | JCT h |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side in SIDES:
        fs = [r[side] for r in results]
        lines.append(
            f"| {side} | {statistics.fmean(f.worst_max_rho for f in fs):.2f} ({max(f.worst_max_rho for f in fs):.2f}) "
            f"| {statistics.fmean(f.mean_rho for f in fs):.2f} | {statistics.fmean(f.violation_gpu_s for f in fs):.0f} "
            f"| {max(f.longest_violation_s for f in fs):.0f} | {statistics.fmean(f.useful for f in fs):.3f} "
            f"| {statistics.fmean(f.utilisation for f in fs):.3f} | {statistics.fmean(f.avg_jct_h for f in fs):.2f} |"
        )
    lines += ["", "Per queue, mean over the seeds (worst ρ: the mean of the queue's max ρ):", ""]
    lines.append(
        "| queue | side | viol GPU-s | longest s | reclaim s | borrowed GPU-h | worst ρ | mean ρ | JCT h |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for q in results[0]["tessera"].by_queue:
        for side in SIDES:
            rows = [r[side].by_queue[q] for r in results]

            def mean(key: str, rows: list[QueueRow] = rows) -> float:
                vals = [getattr(x, key) for x in rows if not math.isnan(getattr(x, key))]
                return statistics.fmean(vals) if vals else math.nan

            lines.append(
                f"| {q} | {side} | {mean('violation_gpu_s'):.0f} | {mean('longest_violation_s'):.0f} "
                f"| {mean('mean_time_to_reclaim_s'):.0f} | {mean('borrowed_gpu_h'):.1f} | {mean('max_rho'):.2f} "
                f"| {mean('mean_rho'):.2f} | {mean('avg_jct_h'):.2f} |"
            )
    below = sum(r["tessera"].worst_max_rho < r["kueue"].worst_max_rho for r in results)
    useful = statistics.fmean(
        r["tessera"].useful / r["kueue"].useful for r in results if r["kueue"].useful > 0
    )
    lines.append("")
    lines.append(
        f"Tessera's worst ρ below Kueue's on {below} of {len(results)} seeds; useful utilisation {useful:.3f}× Kueue's."
    )
    return "\n".join(lines)


def sim_only(args: argparse.Namespace, sc: Scenario, restart_s: float) -> None:
    """The simulator alone on the seeds' workloads: Tessera's policy against its model of Kueue as the bench
    configures the real one (no cluster; seconds a seed)."""
    rows = []
    for seed in seeds(args.seeds):
        apps = perturbed(sc.apps, seed, args.jitter_s)
        m = simulated(args.scenario, apps, seed, restart_s, args.kueue_reclaim, args.leftover_order)
        rows.append(m)
        for label, q in m.items():
            print(sim_row(seed, label, q))
    t, k = [m["tessera"] for m in rows], [m["kueue"] for m in rows]
    below = sum(a["worst_max_rho"] < b["worst_max_rho"] for a, b in zip(t, k, strict=True))
    print(
        f"restart {restart_s:g} s, leftover order {args.leftover_order}: Tessera worst ρ mean "
        f"{statistics.fmean(a['worst_max_rho'] for a in t):.2f} (worst {max(a['worst_max_rho'] for a in t):.2f}), "
        f"useful {statistics.fmean(a['useful'] for a in t):.3f}, starts {statistics.fmean(a['starts'] for a in t):.0f}; "
        f"Kueue {statistics.fmean(b['worst_max_rho'] for b in k):.2f}, useful {statistics.fmean(b['useful'] for b in k):.3f}; "
        f"Tessera below on {below} of {len(rows)} seeds"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", type=Path, default=SCENARIO)
    p.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 1,3,5")
    p.add_argument("--speed", type=float, default=240.0, help="scenario seconds per wall second")
    p.add_argument("--restart-s", type=float, default=None, help="restart cost; default: the scenario's")
    p.add_argument("--jitter-s", type=float, default=600.0)
    p.add_argument("--tick", type=float, default=0.1, help="the trainer's period, wall seconds")
    p.add_argument("--leftover-order", choices=("random", "holders"), default="random", help="Tessera's")
    p.add_argument("--kueue-reclaim", choices=("Never", "LowerPriority", "Any"), default="Never")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--operator-tick",
        type=float,
        default=None,
        help="the operator's tick, wall seconds; default: a tenth of a lease",
    )
    p.add_argument("--verbose", action="store_true", help="Tessera's Queue statuses with each progress line")
    p.add_argument("--say-every", type=float, default=15.0, help="progress line period, wall seconds")
    p.add_argument(
        "--no-sim", action="store_true", help="skip the simulator's figures for the same workloads"
    )
    p.add_argument("--sim-only", action="store_true", help="the simulator alone on the seeds' workloads")
    args = p.parse_args()
    quiet_logging()
    sc = load(args.scenario)
    restart_s = args.restart_s if args.restart_s is not None else sc.restart_s
    if args.sim_only:
        sim_only(args, sc, restart_s)
        return
    results: list[dict[str, Figures]] = []
    sims: list[dict[str, dict[str, Any]]] = []
    with cluster(sc, args.kueue_reclaim) as (cp, creds):
        for seed in seeds(args.seeds):
            apps = perturbed(sc.apps, seed, args.jitter_s)
            sim = (
                {}
                if args.no_sim
                else simulated(args.scenario, apps, seed, restart_s, args.kueue_reclaim, args.leftover_order)
            )
            sims.append(sim)
            t0 = time.monotonic()
            got = asyncio.run(run_seed(cp, creds, sc, seed, args))
            results.append(got)
            say(f"seed {seed} in {time.monotonic() - t0:.0f} s")
            print(HEAD)
            for side in SIDES:
                print(row(got[side]))
            for label, q in sim.items():
                print(sim_row(seed, label, q))
            sys.stdout.flush()
            if args.json:
                out = [
                    {"real": {s: vars_of(r[s]) for s in SIDES}, "simulator": m}
                    for r, m in zip(results, sims, strict=True)
                ]
                args.json.write_text(json.dumps(out, indent=1))
    print()
    print(
        f"speed {args.speed:g}, restart {restart_s:g} s, Kueue reclaimWithinCohort {args.kueue_reclaim}, "
        f"Tessera leftover order {args.leftover_order}"
    )
    print(HEAD)
    for r, sim in zip(results, sims, strict=True):
        for side in SIDES:
            print(row(r[side]))
        for label, q in sim.items():
            print(sim_row(r["tessera"].seed, label, q))
    print()
    print(summary(results))
    if sims and all(sims):
        below = sum(m["tessera"]["worst_max_rho"] < m["kueue"]["worst_max_rho"] for m in sims)
        print(
            f"In the simulator, on the same workloads: Tessera's worst ρ below its Kueue model's on {below} of {len(sims)}."
        )


def vars_of(f: Any) -> Any:
    """A figures dataclass (nested ones too) as JSON-able dicts."""
    if hasattr(f, "__dataclass_fields__"):
        return {k: vars_of(getattr(f, k)) for k in f.__dataclass_fields__}
    if isinstance(f, dict):
        return {k: vars_of(v) for k, v in f.items()}
    return f


if __name__ == "__main__":
    main()
