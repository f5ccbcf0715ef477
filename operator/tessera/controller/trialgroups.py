"""A TrialGroup as the operator sees it: its GPU pool, Fluid's plan over it, and the trial pods the plan
calls for.

The group owns a fixed pool of GPUs (Fluid §3.4.1: n GPUs available to the group),
drawn once from the cluster's free GPUs — those no App lease, no other TrialGroup's pool and no other pod
holds — and recorded in the annotation `tessera.io/gpu-pool`, so a restarted operator keeps it. Fluid plans
on creation (StaticFluid, `plan_trial_group`) and again whenever a trial ends or the pool changes
(DynamicFluid, `dynamic_rescale` then `place`). Widths < 1 become lanes (tessera.io/gpu-memory and
tessera.io/gpu-compute on one GPU), widths >= 1 whole-GPU gangs. Policies are only called, never re-done.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera.api import contract
from tessera.api.resources import parse_trialgroup
from tessera.api.trialgroup import TrialGroupSpec, TrialSpec
from tessera.cluster import Cluster
from tessera.controller.apps import check_name, manifest_of
from tessera.controller.pods import PodPlan, gang_plans
from tessera.controller.view import PodInfo, split_gpu_id
from tessera.policy.fluid import (
    FluidConfig,
    RuntimeModel,
    TrialDemand,
    TrialGroupPlacement,
    dynamic_rescale,
    place,
    plan_makespan,
    plan_trial_group,
)

log = logging.getLogger(__name__)

DEFAULT_ITER_SECONDS = 1.0
"""Seconds per iteration assumed for a trial that declares none (only the ratios of h matter to Fluid)."""

ENDED = frozenset({"Completed", "Stopped"})


def fluid_config(spec: TrialGroupSpec, pool_size: int) -> FluidConfig:
    """FluidConfig from the spec. c defaults to FluidConfig's (2) when maxPackPerGPU is unset — Eq. 3.1
    needs measured packed iteration times the operator does not have before the trials run; d defaults
    to the pool size (the spec's "unset means the group's GPUs")."""
    f = spec.fluid
    return FluidConfig(
        max_pack=f.max_pack_per_gpu if f.max_pack_per_gpu is not None else FluidConfig().max_pack,
        max_workers=f.max_workers_per_trial or max(1, pool_size),
        epsilon=f.scaling_overhead_seconds,
        intra_gpu=f.enable_intra_gpu,
        inter_gpu=f.enable_inter_gpu,
        dynamic=f.enable_dynamic,
    )


def pool_size_wanted(spec: TrialGroupSpec, free: int) -> int:
    """spec.gpus when given; unset takes the free GPUs, at most one per trial (× maxWorkersPerTrial)."""
    if spec.gpus is not None:
        return spec.gpus
    per_trial = spec.fluid.max_workers_per_trial or 1
    return min(free, len(spec.trials) * per_trial)


@dataclass(slots=True)
class TrialState:
    """What the operator tracks per trial (mirrored in status.trials)."""

    phase: str = "Pending"
    width: Fraction | None = None
    iterations_done: int = 0
    result: float | None = None  # latest reported metric (status.trials[].result)
    failed: bool = False  # Stopped because a pod of its gang failed: state="failed" in the metrics


@dataclass(slots=True)
class TrialGroupRecord:
    namespace: str
    name: str
    uid: str
    spec: TrialGroupSpec
    body: Mapping[str, Any]
    pool: list[str] = field(default_factory=list)
    trials: dict[str, TrialState] = field(default_factory=dict)
    placement: TrialGroupPlacement | None = None
    last_rule: str | None = None
    last_time: str | None = None  # when the last plan was made (status.lastReallocation.time)
    # GPUs the group waits for that its queue's share has room for but that others hold: work waiting in
    # its queue, which the arbiter counts (and reclaims for) like an App's unmet demand.
    waiting_gpus: int = 0
    since: float = 0.0  # when the pool was taken (a queue's minimum runtime counts from here)
    # Waiting for a pool (for the Queue's status, whatever the cause): GPUs wanted, why (queue_status'
    # reasons), and since when.
    wants: int = 0
    wait_reason: str = ""
    wait_message: str = ""
    waiting_since: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def trial(self, name: str) -> TrialSpec:
        return next(t for t in self.spec.trials if t.name == name)

    def live(self) -> list[TrialSpec]:
        return [t for t in self.spec.trials if self.trials[t.name].phase not in ENDED]

    @property
    def done(self) -> bool:
        return not self.live()

    def h1(self, t: TrialSpec) -> float:
        """h_{i,1}: remaining single-GPU runtime from the budget and the iterations reported."""
        left = max(0, t.budget_iterations - self.trials[t.name].iterations_done)
        return left * (t.iter_time_seconds or DEFAULT_ITER_SECONDS)

    def demands(self, trials: Sequence[TrialSpec]) -> list[TrialDemand]:
        lane = self.spec.gpu.lane
        mem = lane.memory_mib if lane is not None else None
        return [TrialDemand(t.name, self.h1(t), mem) for t in trials]

    # --- planning ---------------------------------------------------------------------------------

    def plan(self, cluster: Cluster) -> TrialGroupPlacement:
        """StaticFluid the first time, DynamicFluid (Alg. 3.2) afterwards; then place on the pool."""
        live = self.live()
        if not live:
            self.placement = TrialGroupPlacement(widths={})
            return self.placement
        pool = [g for g in self.pool if g in cluster]
        if not pool:
            raise ValueError("none of the group's GPUs is in the cluster")
        config = fluid_config(self.spec, len(pool))
        demands = self.demands(live)
        if self.placement is None and all(self.trials[t.name].width is None for t in live):
            placement = plan_trial_group(cluster, pool, demands, config)
            self.last_rule = "static"
        else:
            current = [self._held_width(t.name) for t in live]
            rescales = dynamic_rescale(current, [d.h1 for d in demands], len(pool), config)
            widths = [Fraction(0)] * len(live)
            rules: dict[str, int] = {}
            for r in rescales:
                keep_static = not config.dynamic and r.current > 0
                widths[r.index] = r.current if keep_static else r.width
                rules[r.rule.value] = rules.get(r.rule.value, 0) + 1
            placement = place(cluster, pool, demands, widths, config.c)
            self.last_rule = ", ".join(f"{k}: {v}" for k, v in sorted(rules.items()))
        self.placement = placement
        for t in live:
            st = self.trials[t.name]
            st.width = placement.widths[t.name] if t.name not in placement.queued else None
            st.phase = "Queued" if t.name in placement.queued else "Running"
        return placement

    def _held_width(self, trial: str) -> Fraction:
        """The width a trial runs at now; 0 when it holds nothing (queued), which DynamicFluid starts."""
        if self.placement is not None and not self.placement.gpus_of(trial):
            return Fraction(0)
        w = self.trials[trial].width
        return w if w is not None else Fraction(0)

    # --- progress ---------------------------------------------------------------------------------

    def observe(self, pods: Sequence[PodInfo]) -> list[tuple[str, str]]:
        """Fold trial pods into per-trial progress; return (trial, new phase) for trials that ended now.

        A trial that reported its whole budget is Completed (its pods are left to exit); otherwise it ends
        when its pods exit: Succeeded at its budget is Completed; Succeeded earlier (the tuning algorithm
        stopped it, e.g. an ASHA rung) or Failed is Stopped."""
        by_trial: dict[str, list[PodInfo]] = {}
        for p in pods:
            label = p.labels.get(contract.LABEL_TRIAL)
            if label in self.trials:
                by_trial.setdefault(label, []).append(p)
        ended: list[tuple[str, str]] = []
        for t in self.live():
            st = self.trials[t.name]
            mine = by_trial.get(t.name, [])
            reported = [p.progress_iterations for p in mine if p.progress_iterations is not None]
            if reported:
                st.iterations_done = max(st.iterations_done, min(max(reported), t.budget_iterations))
            # The result is the metric of the furthest-along report (rank 0 and the others report alike).
            scored = [
                (p.progress_iterations or 0, p.progress_loss) for p in mine if p.progress_loss is not None
            ]
            if scored:
                st.result = max(scored, key=lambda s: s[0])[1]
            if st.iterations_done >= t.budget_iterations:
                # Its budget is done: Completed now, not once its pods exit a moment later (the progress
                # report and the exit are separate writes). A re-plan in between saw a live trial with no
                # work left (h = 0), queued it and deleted its pods before they could succeed.
                st.phase = "Completed"
                ended.append((t.name, st.phase))
                continue
            current = set(self._plan_pod_names(t.name))
            gang = [p for p in mine if p.name in current and not p.deleting]
            if not gang or len(gang) < len(current):
                continue
            if all(p.phase == "Succeeded" for p in gang):
                if st.iterations_done >= t.budget_iterations or not reported:
                    st.iterations_done = t.budget_iterations
                    st.phase = "Completed"
                else:
                    st.phase = "Stopped"
                ended.append((t.name, st.phase))
            elif any(p.phase == "Failed" for p in gang):
                st.phase = "Stopped"
                st.failed = True
                ended.append((t.name, "Stopped"))
        return ended

    # --- pods and status --------------------------------------------------------------------------

    def _plan_pod_names(self, trial: str) -> list[str]:
        return [p.name for p in self.pod_plans() if p.labels[contract.LABEL_TRIAL] == trial]

    def pod_plans(self) -> list[PodPlan]:
        """One pod per packed trial (its lane), one per node of a multi-GPU trial's gang (ranked)."""
        if self.placement is None:
            return []
        live = {t.name for t in self.live()}
        plans: list[PodPlan] = []
        for trial, gpus in sorted(self.placement.gangs.items()):
            if trial in live:
                plans += self._plans(trial, gpus)
        for gid, lanes in sorted(self.placement.lanes.items()):
            for lane in lanes:
                if lane.trial_id in live:
                    plans += self._plans(lane.trial_id, [gid], lane.memory_mib, lane.compute_percent)
        return plans

    def _plans(
        self,
        trial: str,
        gpus: Sequence[str],
        memory_mib: int | None = None,
        compute_percent: int | None = None,
    ) -> list[PodPlan]:
        return gang_plans(
            gpus,
            base=f"{self.name}-{trial}",
            labels={contract.LABEL_TRIALGROUP: self.name, contract.LABEL_TRIAL: trial},
            env={
                contract.ENV_TRIAL: trial,
                contract.ENV_TRIAL_CONFIG: json.dumps(self.trial(trial).config, sort_keys=True),
            },
            workload=contract.WORKLOAD_TRIAL,
            memory_mib=memory_mib,
            compute_percent=compute_percent,
        )

    def status(self, now_stamp: str) -> dict[str, Any]:
        """status of the TrialGroup (TrialGroupStatus on the wire)."""
        trials = []
        running = 0
        for t in self.spec.trials:
            st = self.trials[t.name]
            entry: dict[str, Any] = {"name": t.name, "phase": st.phase, "iterationsDone": st.iterations_done}
            if st.result is not None:
                entry["result"] = st.result
            if st.phase not in ENDED:
                entry["h1Seconds"] = self.h1(t)
            gpus = self.placement.gpus_of(t.name) if self.placement and st.phase not in ENDED else ()
            if st.width is not None and gpus:
                running += 1
                entry["width"] = float(st.width)
                node, _ = split_gpu_id(gpus[0])
                where: dict[str, Any] = {"node": node, "gpuIndices": [split_gpu_id(g)[1] for g in gpus]}
                if st.width < 1:
                    assert self.placement is not None
                    lanes = self.placement.lanes.get(gpus[0], ())
                    where["packSlot"] = next(i for i, ln in enumerate(lanes) if ln.trial_id == t.name)
                entry["placement"] = where
            trials.append(entry)
        live = [t for t in self.live() if self.trials[t.name].width is not None]
        makespan = (
            plan_makespan(
                [self.h1(t) for t in live],
                [self.trials[t.name].width or Fraction(0) for t in live],
                [RuntimeModel()] * len(live),
            )
            if live
            else 0.0
        )
        done = sum(1 for t in self.spec.trials if self.trials[t.name].phase in ENDED)
        out: dict[str, Any] = {
            "phase": "Succeeded" if self.done else ("Running" if running else "Pending"),
            "trialsRunning": running,
            "trialsDone": done,
            "gpus": len(self.pool),
            "trials": trials,
        }
        if math.isfinite(makespan):
            out["estimatedMakespanSeconds"] = makespan
        if self.last_rule is not None:
            out["lastReallocation"] = {"time": now_stamp, "rule": self.last_rule}
        return out


def parse_pool(raw: str | None) -> list[str]:
    """The pool annotation: a JSON list of "node/index" GPU ids (anything else is ignored, logged)."""
    if not raw:
        return []
    try:
        data = json.loads(raw)
        if isinstance(data, list) and all(isinstance(g, str) and "/" in g for g in data):
            for g in data:
                split_gpu_id(g)
            return list(data)
    except (json.JSONDecodeError, ValueError):
        pass
    log.warning("ignoring %s that is not a JSON list of node/index: %r", contract.ANN_GPU_POOL, raw[:80])
    return []


def record_from_body(body: Mapping[str, Any]) -> TrialGroupRecord:
    """Parse a TrialGroup (raises ManifestError) and recover its pool, widths and progress."""
    check_name(body, contract.LABEL_TRIALGROUP)
    tg = parse_trialgroup(manifest_of(body))
    meta = body["metadata"]
    status: Mapping[str, Any] = body.get("status") or {}
    rec = TrialGroupRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        spec=tg.spec,
        body=body,
        pool=parse_pool((meta.get("annotations") or {}).get(contract.ANN_GPU_POOL)),
        trials={t.name: TrialState() for t in tg.spec.trials},
    )
    for ts in status.get("trials") or []:
        st = rec.trials.get(str(ts.get("name")))
        if st is None:
            continue
        st.phase = str(ts.get("phase") or "Pending")
        st.iterations_done = int(ts.get("iterationsDone") or 0)
        if isinstance(ts.get("result"), int | float):
            st.result = float(ts["result"])
        if ts.get("width") and ts.get("placement"):
            st.width = Fraction(ts["width"]).limit_denominator(64)
    return rec


def recover_placement(rec: TrialGroupRecord, cluster: Cluster) -> None:
    """After a restart: re-place the running trials at their recorded widths (same inputs, same GPUs), so
    the pods already there keep their names and nothing is recreated."""
    live = [t for t in rec.live() if rec.trials[t.name].width is not None]
    if not live or not rec.pool or not all(g in cluster for g in rec.pool):
        return
    config = fluid_config(rec.spec, len(rec.pool))
    widths = [rec.trials[t.name].width or Fraction(0) for t in live]
    rec.placement = place(cluster, rec.pool, rec.demands(live), widths, config.c)


def pool_annotation(pool: Sequence[str]) -> str:
    return json.dumps(sorted(pool, key=lambda g: (split_gpu_id(g)[0], split_gpu_id(g)[1])))


def choose_pool(cluster: Cluster, free: Sequence[str], n: int) -> list[str]:
    """n GPUs for a new group, as few nodes as possible (trial gangs then stay on one node)."""
    per_node: dict[str, list[str]] = {}
    for g in cluster.sorted(free):
        per_node.setdefault(split_gpu_id(g)[0], []).append(g)
    fitting = [gs for gs in per_node.values() if len(gs) >= n]
    if fitting:
        return min(fitting, key=len)[:n]
    out: list[str] = []
    for gs in sorted(per_node.values(), key=len, reverse=True):
        out.extend(gs[: n - len(out)])
        if len(out) == n:
            break
    return out
