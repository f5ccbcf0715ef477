"""The packing experiment as the chart deploys Tessera: every pod goes through the kube-scheduler that its
schedulerName names, with that scheduler's score plugins, weights and share of nodes scored, and the
extender's filter and priority where kube-scheduler calls it.

What is replayed of kube-scheduler (pkg/scheduler/schedule_one.go, framework/plugins):
- Filter: a node passes with the pod's CPU and memory free (NodeResourcesFit) and, for GPU pods, enough
  `tessera.io/gpu` device-plugin slots (`slots_per_gpu` per GPU). With `percentageOfNodesToScore` below 100
  the search stops once that many feasible nodes are found (0: adaptive, 50 − nodes/125 %, at least 5 % and
  100 nodes), starting where the last search stopped.
- The extender (for pods it is interested in: those with its managed resources, or every pod when it names
  none) filters those nodes by its GPU fit and returns priorities 0..10 (`packing.priorities`, the rule the
  extender runs, with its shape distribution learned from every pending pod). kube-scheduler adds
  priority × weight × MaxNodeScore / MaxExtenderPriority (× 10) to each node's total.
- Score plugins: NodeResourcesFit (LeastAllocated or MostAllocated over CPU and memory, integer 0..100) and
  NodeResourcesBalancedAllocation ((1 − std of the CPU and memory fractions) × 100), each × its weight. The
  other default score plugins (ImageLocality, InterPodAffinity, NodeAffinity, PodTopologySpread,
  TaintToleration) score every node alike for the trace's bare pods (no images on nodes, no affinity, no
  tolerations, no owners for default spread constraints), so they do not change the choice.
- selectHost: a node of the highest total, at random among equals (upstream's reservoir sampling).
A node picked that is not the extender's first choice still gets the GPUs the rule chose on it (bind).
With `dra` (`lanes.api: dra`, pods asking through claims that name no device) kube-scheduler's filter is the
DynamicResources plugin's (the node's slice can satisfy the claim) instead of device-plugin slots, and the GPUs
are the structured allocator's choice on the node picked: the first of the slice that fit (`first_devices`);
the extender's priorities (it reads the pod's claim) still choose the node.

How CPU-only pods are routed is read from the rendered chart too (`from_chart`): with `gpuNodes.reserve` the
agents taint their GPU nodes (the DaemonSet's `--reserve-node`), and the chart's MutatingAdmissionPolicy
sends the pods of the namespaces its binding selects to tessera-scheduler with the toleration; pods left to
default-scheduler then fit only nodes without GPUs (TaintToleration's filter). Without it, default-scheduler
places CPU-only pods over every node. The trace's pods are taken to live in one namespace whose labels the
caller gives (an ML team's namespace the admin labelled as documented, or not).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tessera.api.safe_load import load_yaml_documents
from tessera.policy.lanes.fragmentation import PackingState, Shape, fgd_integer_score, score_rows
from tessera.policy.lanes.packing import Pick, Tessera, all_rows, priorities

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
MIN_FEASIBLE_NODES = 100
# kube-scheduler's default score plugins and weights (v1 MultiPoint defaults)
DEFAULT_SCORE_WEIGHTS: Mapping[str, int] = {
    "NodeResourcesFit": 1,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
    "InterPodAffinity": 2,
    "NodeAffinity": 2,
    "PodTopologySpread": 2,
    "TaintToleration": 3,
}
VARYING = ("NodeResourcesFit", "NodeResourcesBalancedAllocation")  # the ones that tell trace nodes apart
NON_ZERO_CPU, NON_ZERO_MEMORY_MIB = 100.0, 200.0  # what scoring counts for a pod that requests none


@dataclass(frozen=True)
class Profile:
    """One kube-scheduler profile as far as it matters to packing."""

    scheduler: str
    weights: Mapping[str, int]  # enabled node-varying score plugins and their weights
    fit_strategy: str = "LeastAllocated"
    percentage: int = 0  # percentageOfNodesToScore; 0: adaptive
    extender_weight: int = 0  # 0: no extender prioritizes for this profile
    extender_all_pods: bool = False  # no managedResources: the extender sees CPU-only pods too


DEFAULT_SCHEDULER = Profile("default-scheduler", {k: DEFAULT_SCORE_WEIGHTS[k] for k in VARYING})


def first_devices(state: PackingState, row: int, shape: Shape) -> tuple[int, ...]:
    """The structured allocator's choice on `row`: the first `shape.gpus` GPUs, in slice order, that fit."""
    if not shape.gpus:
        return ()
    fits = np.flatnonzero(state.gpu_fits(np.array([row]), shape)[0])
    return tuple(int(c) for c in fits[: shape.gpus])


def profile_from_config(config: Mapping[str, Any], scheduler: str) -> Profile:
    """The profile `scheduler` of a KubeSchedulerConfiguration (v1), as it scores the trace's pods."""
    profiles = [p for p in config.get("profiles") or [] if p.get("schedulerName") == scheduler]
    if not profiles:
        raise ValueError(f"no profile {scheduler!r} in the scheduler configuration")
    prof = profiles[0]
    score = (prof.get("plugins") or {}).get("score") or {}
    weights = dict(DEFAULT_SCORE_WEIGHTS)
    for p in score.get("disabled") or []:
        if p["name"] == "*":
            weights.clear()
        weights.pop(p["name"], None)
    for p in score.get("enabled") or []:
        weights[p["name"]] = int(p.get("weight") or weights.get(p["name"], 1))
    strategy = "LeastAllocated"
    for pc in prof.get("pluginConfig") or []:
        if pc.get("name") == "NodeResourcesFit":
            strategy = ((pc.get("args") or {}).get("scoringStrategy") or {}).get("type", strategy)
    if strategy not in ("LeastAllocated", "MostAllocated"):
        raise ValueError(f"NodeResourcesFit scoring strategy {strategy!r} is not replayed")
    percentage = int(prof.get("percentageOfNodesToScore") or config.get("percentageOfNodesToScore") or 0)
    ext_weight, all_pods = 0, False
    for ext in config.get("extenders") or []:
        if ext.get("prioritizeVerb"):
            ext_weight += int(ext.get("weight") or 1)
            all_pods = all_pods or not ext.get("managedResources")
    return Profile(
        scheduler,
        {k: v for k, v in weights.items() if k in VARYING and v > 0},
        strategy,
        percentage,
        ext_weight,
        all_pods,
    )


def nodes_to_find(total: int, percentage: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind."""
    if total < MIN_FEASIBLE_NODES or percentage >= 100:
        return total
    pct = percentage or max(5, 50 - total // 125)
    return max(MIN_FEASIBLE_NODES, total * pct // 100)


def plugin_scores(
    state: PackingState, rows: npt.NDArray[np.intp], shape: Shape, prof: Profile
) -> npt.NDArray[np.int64]:
    """Σ weight × score of the profile's node-varying score plugins, per row, as kube-scheduler computes them."""
    total = np.zeros(len(rows), dtype=np.int64)
    if not prof.weights:
        return total
    cap_cpu = np.maximum(state.cpu_cap[rows], 1.0)
    cap_mem = np.maximum(state.mem_cap[rows], 1.0)
    cpu_req = shape.cpu_milli or NON_ZERO_CPU
    mem_req = shape.memory_mib or NON_ZERO_MEMORY_MIB
    used_cpu = np.minimum(cap_cpu - state.cpu[rows] + cpu_req, cap_cpu)
    used_mem = np.minimum(cap_mem - state.mem[rows] + mem_req, cap_mem)
    w = prof.weights.get("NodeResourcesFit", 0)
    if w:
        if prof.fit_strategy == "LeastAllocated":
            per = ((cap_cpu - used_cpu) * 100 // cap_cpu) + ((cap_mem - used_mem) * 100 // cap_mem)
        else:
            per = (used_cpu * 100 // cap_cpu) + (used_mem * 100 // cap_mem)
        total += w * (per // 2).astype(np.int64)
    w = prof.weights.get("NodeResourcesBalancedAllocation", 0)
    if w:
        std = np.abs(used_cpu / cap_cpu - used_mem / cap_mem) / 2.0
        total += w * ((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)
    return total


@dataclass
class AsDeployed:
    """A PackingPolicy that places each pod as kube-scheduler would, as the chart configures it: GPU pods by
    `gpu_profile` (with the extender), CPU-only pods by `cpu_profile`, or first-fit with `cpu_first_fit`.
    With `gpu_nodes_reserved`, pods of any other profile than `gpu_profile` (they carry no toleration) fit
    only nodes without GPUs."""

    gpu_profile: Profile
    cpu_profile: Profile
    rule: Tessera = field(default_factory=Tessera)
    slots_per_gpu: int = 10
    cpu_first_fit: bool = False
    gpu_nodes_reserved: bool = False
    dra: bool = False
    name: str = "as-deployed"
    _start: dict[str, int] = field(default_factory=dict)
    _slots: npt.NDArray[np.float64] | None = None

    def choose(self, state: PackingState, shape: Shape, rng: random.Random) -> Pick | None:
        self.rule.distribution.observe(shape)  # the extender's watch sees every pending pod
        rows = all_rows(state)
        if self._slots is None or len(self._slots) != state.rows:
            self._slots = state.gpus[: state.rows] * self.slots_per_gpu
        kube_ok = (state.cpu[rows] >= shape.cpu_milli - 1e-9) & (state.mem[rows] >= shape.memory_mib - 1e-9)
        if shape.gpus and self.dra:
            kube_ok &= state.feasible(rows, shape)  # DynamicResources: the node's slice satisfies the claim
        elif shape.gpus:
            kube_ok &= self._slots >= shape.gpus
        prof = self.gpu_profile if shape.gpus else self.cpu_profile
        if self.gpu_nodes_reserved and prof.scheduler != self.gpu_profile.scheduler:
            kube_ok &= state.gpus[rows] == 0  # the GPU nodes' taint, which this pod does not tolerate
        if not shape.gpus and self.cpu_first_fit:
            ok = np.flatnonzero(kube_ok)
            return (int(ok[0]), ()) if len(ok) else None
        cand = self._search(rows, kube_ok, prof)
        extender = prof.extender_weight > 0 and (shape.gpus > 0 or prof.extender_all_pods)
        if extender:
            wl = self.rule.distribution.workload(state.models)
            quantize = fgd_integer_score if self.rule.integer_scores else None
            scored = score_rows(state, cand, shape, wl, self.rule.measure, quantize)
            cand = scored.rows  # the extender's filter: the nodes with the GPUs (and model) it asks for
        if not len(cand):
            return None
        total = plugin_scores(state, cand, shape, prof)
        if extender:
            scale = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
            total = total + priorities(scored) * prof.extender_weight * scale
        best = np.flatnonzero(total == total.max())
        i = int(best[rng.randrange(len(best))]) if len(best) > 1 else int(best[0])
        row = int(cand[i])
        if self.dra:
            return row, first_devices(state, row, shape)
        return row, (scored.gpus_of(i) if extender else ())

    def _search(
        self, rows: npt.NDArray[np.intp], ok: npt.NDArray[np.bool_], prof: Profile
    ) -> npt.NDArray[np.intp]:
        """The feasible nodes kube-scheduler's filter returns: from its last stop, until enough are found."""
        n = len(rows)
        want = nodes_to_find(n, prof.percentage)
        if want >= n:
            return rows[ok]
        start = self._start.get(prof.scheduler, 0)
        order = np.roll(np.arange(n), -start)
        hits = np.cumsum(ok[order])
        stop = int(np.searchsorted(hits, want)) + 1 if hits[-1] >= want else n  # nodes processed
        self._start[prof.scheduler] = (start + stop) % n
        picked = order[:stop]
        return rows[np.sort(picked[ok[picked]])]

    def placed(self, state: PackingState, pick: Pick, shape: Shape) -> None:
        if shape.gpus and self._slots is not None and not self.dra:
            self._slots[pick[0]] -= shape.gpus


@dataclass(frozen=True)
class ChartDeployment:
    """What a rendered chart configures for packing: tessera-scheduler's profile, the profile CPU-only pods of
    the trace's namespace go through, and whether GPU nodes are kept for tessera-scheduler's pods."""

    gpu_profile: Profile
    cpu_profile: Profile
    gpu_nodes_reserved: bool

    @property
    def routed(self) -> bool:
        """CPU-only pods go through tessera-scheduler."""
        return self.cpu_profile.scheduler == self.gpu_profile.scheduler

    def policy(self, rule: Tessera, *, slots_per_gpu: int = 10, dra: bool = False) -> AsDeployed:
        return AsDeployed(
            self.gpu_profile,
            self.cpu_profile,
            rule,
            slots_per_gpu=slots_per_gpu,
            gpu_nodes_reserved=self.gpu_nodes_reserved,
            dra=dra,
        )


def from_chart(
    objects: Sequence[Mapping[str, Any]], namespace: str, namespace_labels: Mapping[str, str]
) -> ChartDeployment:
    """The deployment the chart's rendered `objects` configure for pods of `namespace` (with those labels)."""
    config = _scheduler_config(objects)
    scheduler = str(config["profiles"][0]["schedulerName"])
    tessera = profile_from_config(config, scheduler)
    reserved = any(
        "--reserve-node" in (c.get("args") or [])
        for o in objects
        if o["kind"] == "DaemonSet"
        for c in o["spec"]["template"]["spec"]["containers"]
    )
    routed = any(
        o["kind"] == "MutatingAdmissionPolicyBinding"
        and _policy_sets_scheduler(objects, o["spec"]["policyName"], scheduler)
        and selects(o["spec"]["matchResources"].get("namespaceSelector") or {}, namespace, namespace_labels)
        for o in objects
    )
    return ChartDeployment(tessera, tessera if routed else DEFAULT_SCHEDULER, reserved)


def _scheduler_config(objects: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    for o in objects:
        text = (o.get("data") or {}).get("config.yaml", "") if o["kind"] == "ConfigMap" else ""
        if "KubeSchedulerConfiguration" in text:
            (config,) = load_yaml_documents(text, f"ConfigMap {o['metadata']['name']}")
            return dict(config)
    raise ValueError("the rendered chart holds no KubeSchedulerConfiguration (scheduler.enabled false?)")


def _policy_sets_scheduler(objects: Sequence[Mapping[str, Any]], name: str, scheduler: str) -> bool:
    """The MutatingAdmissionPolicy `name` writes `scheduler` as the pod's schedulerName."""
    for o in objects:
        if o["kind"] == "MutatingAdmissionPolicy" and o["metadata"]["name"] == name:
            patches = [m.get("jsonPatch", {}).get("expression", "") for m in o["spec"].get("mutations") or []]
            return any('"/spec/schedulerName"' in p and f'value: "{scheduler}"' in p for p in patches)
    return False


def selects(selector: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> bool:
    """A namespace label selector (matchLabels, matchExpressions) applied to a namespace, whose labels include
    kubernetes.io/metadata.name as the API server sets it."""
    have = {**labels, "kubernetes.io/metadata.name": namespace}
    if any(have.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in have and have[key] in values,
            "NotIn": key not in have or have[key] not in values,
            "Exists": key in have,
            "DoesNotExist": key not in have,
        }.get(op)
        if ok is None:
            raise ValueError(f"label selector operator {op!r} is not one of In, NotIn, Exists, DoesNotExist")
        if not ok:
            return False
    return True
