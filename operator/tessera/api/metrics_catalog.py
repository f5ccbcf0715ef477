"""The metric catalogue: every `tessera_*` series the project exports, in one place.

Pure data (no prometheus-client import) so that every component, the chart's dashboards and the tests read
the same names. `tessera.metrics` turns entries into prometheus-client objects for the operator, extender,
gateway and simulator; `tessera_agent.metrics_factory` does the same for the node agent.

Label conventions (docs/architecture.md "How the parts talk"): `namespace`, one of `app` | `trialgroup` |
`modeldeployment` naming the custom resource, `node`, `gpu` (the GPU's index on its node) and `lane`.
Per-lane series also carry `pod` so they join with DCGM's and HAMi's per-container series
(namespace/pod/container/lane labels, like HAMi's hami_container_* series). Ratios are 0..1 and
sizes are bytes, as Prometheus naming asks; DCGM_FI_DEV_GPU_UTIL (percent) maps to
`tessera_gpu_utilization_ratio * 100`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Component(StrEnum):
    """The processes that export metrics. The simulator writes the operator's and gateway's series so a
    dashboard can show a what-if run next to the live cluster."""

    OPERATOR = "operator"
    EXTENDER = "extender"
    AGENT = "agent"
    GATEWAY = "gateway"
    SIMULATOR = "simulator"


_NAME_RE: Final = re.compile(r"^tessera_[a-z][a-z0-9_]*[a-z0-9]$")
_LABEL_RE: Final = re.compile(r"^[a-z][a-z0-9_]*$")
# Suffixes Prometheus itself derives from counters and histograms; a base name must not end in them.
_DERIVED_SUFFIXES: Final = ("_bucket", "_count", "_sum", "_created")
# Label names Prometheus reserves or adds on scrape; exporting them would be silently renamed.
_RESERVED_LABELS: Final = frozenset({"le", "quantile", "job", "instance"})


@dataclass(frozen=True)
class MetricSpec:
    """One exported series family.

    `name` is the name PromQL sees: counters end in `_total`; histograms are queried through the derived
    `<name>_bucket`, `<name>_sum` and `<name>_count`.
    """

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    components: frozenset[Component]
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"metric name {self.name!r} must match {_NAME_RE.pattern}")
        if self.name.endswith(_DERIVED_SUFFIXES):
            raise ValueError(f"metric name {self.name!r} must not end in one of {_DERIVED_SUFFIXES}")
        if (self.type is MetricType.COUNTER) != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name!r}: counters, and only counters, end in '_total'")
        if not self.help.strip():
            raise ValueError(f"metric {self.name!r} needs a help text")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"metric {self.name!r} repeats a label in {self.labels}")
        for label in self.labels:
            if not _LABEL_RE.match(label) or label in _RESERVED_LABELS:
                raise ValueError(f"metric {self.name!r}: label {label!r} is not allowed")
        if not self.components:
            raise ValueError(f"metric {self.name!r} must name at least one exporting component")
        if self.buckets and self.type is not MetricType.HISTOGRAM:
            raise ValueError(f"metric {self.name!r}: only histograms take buckets")
        if self.type is MetricType.HISTOGRAM and list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"metric {self.name!r}: buckets must be strictly increasing")

    @property
    def series_names(self) -> tuple[str, ...]:
        """Every name under which this family appears in PromQL."""
        if self.type is MetricType.HISTOGRAM:
            return (self.name, f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


_OP: Final = Component.OPERATOR
_EXT: Final = Component.EXTENDER
_AGENT: Final = Component.AGENT
_GW: Final = Component.GATEWAY
_SIM: Final = Component.SIMULATOR

# Latency buckets (seconds) for request paths that answer in milliseconds: extender verbs, serving requests.
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Auction rounds solve a small optimisation per lease period (Themis §3.3); seconds, wider range.
AUCTION_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0)
# Batch sizes are powers of two up to the largest batches Orloj/Symphony evaluate.
BATCH_BUCKETS: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)

_NS_APP: Final = ("namespace", "app")
_NS_TG: Final = ("namespace", "trialgroup")
_NS_MD: Final = ("namespace", "modeldeployment")
_GPU: Final = ("node", "gpu", "uuid")
_LANE: Final = ("node", "gpu", "lane", "namespace", "pod")

CATALOG: Final[tuple[MetricSpec, ...]] = (
    # --- every component -------------------------------------------------------------------------------
    MetricSpec(
        "tessera_build_info",
        MetricType.GAUGE,
        "Always 1; labels carry the running component and Tessera version.",
        ("component", "version"),
        frozenset({_OP, _EXT, _AGENT, _GW, _SIM}),
    ),
    # --- team queues (tessera.policy.queues) --------------------------------------------------------------
    *(
        MetricSpec(f"tessera_queue_{name}", MetricType.GAUGE, help_, ("queue",), frozenset({_OP}))
        for name, help_ in (
            ("guaranteed_gpus", "GPUs a Queue is guaranteed (spec.guaranteedGPUs)."),
            ("share_gpus", "GPUs the division entitles a Queue to this round."),
            (
                "allocated_gpus",
                "GPUs the objects of a Queue hold now (Apps, TrialGroup pools, serving replicas).",
            ),
            ("borrowed_gpus", "GPUs a Queue holds above its guarantee."),
            ("lent_gpus", "Guaranteed GPUs of a Queue it leaves to other queues now."),
            ("waiting", "Objects of a Queue waiting for GPUs, of every kind."),
            ("max_rho", "Largest finish-time fairness rho among a Queue's Apps, against the Queue's share."),
        )
    ),
    MetricSpec(
        "tessera_queue_kind_allocated_gpus",
        MetricType.GAUGE,
        "GPUs the objects of one kind (App, TrialGroup, ModelDeployment, Pod: admitted pods and Jobs' pods) of a Queue hold now.",
        ("queue", "kind"),
        frozenset({_OP}),
    ),
    MetricSpec(
        "tessera_queue_pending",
        MetricType.GAUGE,
        "Objects of one kind (App, TrialGroup, ModelDeployment, Pod: gated pod groups) of a Queue waiting for GPUs.",
        ("queue", "kind"),
        frozenset({_OP}),
    ),
    # --- fairness: Themis (Mahajan et al., NSDI'20) ---------------------------------------------------------
    MetricSpec(
        "tessera_app_rho",
        MetricType.GAUGE,
        "Finish-time fairness rho = T_shared / T_independent of an App (1 = as fast as its fair share).",
        _NS_APP,
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_app_t_shared_seconds",
        MetricType.GAUGE,
        "Estimated finish time of an App in the shared cluster (T_shared), seconds since it started.",
        _NS_APP,
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_app_t_independent_seconds",
        MetricType.GAUGE,
        "Estimated finish time of an App alone on its 1/N share of the cluster (T_independent), seconds.",
        _NS_APP,
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_app_gpus",
        MetricType.GAUGE,
        "GPUs an App holds under its current leases.",
        _NS_APP,
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_namespace_gpus",
        MetricType.GAUGE,
        "GPUs held by all Tessera workloads of a namespace, by workload kind (training, trial, serving).",
        ("namespace", "workload"),
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_lease_changes_total",
        MetricType.COUNTER,
        "Lease events per App: granted, renewed, revoked or expired.",
        ("namespace", "app", "change"),
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_auction_rounds_total",
        MetricType.COUNTER,
        "Themis arbiter auction rounds run.",
        (),
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_arbiter_ledger_writes_total",
        MetricType.COUNTER,
        "Writes of the arbiter's renewal ledger (one per round that renewed leases), by result: written, or "
        "failed (the round then wrote the renewed Apps' statuses instead).",
        ("result",),
        frozenset({_OP}),
    ),
    MetricSpec(
        "tessera_arbiter_ledger_apps",
        MetricType.GAUGE,
        "Apps in the renewal ledger last written: leases renewed whose App status does not show it yet.",
        (),
        frozenset({_OP}),
    ),
    MetricSpec(
        "tessera_auction_duration_seconds",
        MetricType.HISTOGRAM,
        "Wall time of one arbiter round: offers, bids and the partial-allocation auction.",
        (),
        frozenset({_OP, _SIM}),
        AUCTION_BUCKETS,
    ),
    MetricSpec(
        "tessera_pending_pods",
        MetricType.GAUGE,
        "Tessera pods waiting for a GPU, by namespace and workload kind (training, trial, serving).",
        ("namespace", "workload"),
        frozenset({_OP, _SIM}),
    ),
    # --- tuning: Fluid (Yu's dissertation ch. 3) ------------------------------------------------------------
    MetricSpec(
        "tessera_trialgroup_trials",
        MetricType.GAUGE,
        "Trials of a TrialGroup by state (pending, running, completed, stopped, failed).",
        ("namespace", "trialgroup", "state"),
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_trial_width",
        MetricType.GAUGE,
        "Fluid width w_i of a trial: the GPU share water-filling gives it (0.5 = half a GPU, 2 = two GPUs).",
        ("namespace", "trialgroup", "trial"),
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_trial_progress_ratio",
        MetricType.GAUGE,
        "Fraction of a trial's iteration budget done (0..1).",
        ("namespace", "trialgroup", "trial"),
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_trialgroup_best_objective",
        MetricType.GAUGE,
        "Best objective value reported so far by any trial of a TrialGroup.",
        _NS_TG,
        frozenset({_OP, _SIM}),
    ),
    # --- utilisation: lanes and GPUs (node agent, NVML; Salus lanes) ----------------------------------------
    MetricSpec(
        "tessera_gpu_utilization_ratio",
        MetricType.GAUGE,
        "GPU busy fraction from NVML (DCGM_FI_DEV_GPU_UTIL / 100).",
        _GPU,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_gpu_memory_used_bytes",
        MetricType.GAUGE,
        "GPU memory in use from NVML (DCGM_FI_DEV_FB_USED in bytes).",
        _GPU,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_gpu_memory_total_bytes",
        MetricType.GAUGE,
        "GPU memory capacity from NVML.",
        _GPU,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_gpu_healthy",
        MetricType.GAUGE,
        "1 if the agent advertises the GPU as Healthy to the kubelet, else 0.",
        _GPU,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_lane_memory_used_bytes",
        MetricType.GAUGE,
        "Device memory used by the processes of a lane, from NVML per-process samples.",
        _LANE,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_lane_memory_limit_bytes",
        MetricType.GAUGE,
        "MPS pinned device memory limit of a lane (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).",
        _LANE,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_lane_compute_limit_ratio",
        MetricType.GAUGE,
        "MPS active thread share of a lane (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / 100).",
        _LANE,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_lane_utilization_ratio",
        MetricType.GAUGE,
        "SM busy fraction attributed to a lane's processes from NVML per-process utilisation samples.",
        _LANE,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_lane_over_limit",
        MetricType.GAUGE,
        "1 while a lane's processes use more device memory than its MPS pinned limit, else 0.",
        _LANE,
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_lane_be_compute_ratio",
        MetricType.GAUGE,
        "Active-thread share the BE feedback loop gives best-effort lanes on a GPU with a high-priority lane.",
        ("node", "uuid"),
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_lane_be_restarts_total",
        MetricType.COUNTER,
        "Best-effort pods restarted to apply a new BE share, by the reason (over-target, under-target).",
        ("node", "uuid", "reason"),
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_device_plugin_allocations_total",
        MetricType.COUNTER,
        "Device plugin Allocate calls answered, by result (ok, error).",
        ("node", "result"),
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_agent_lane_mismatches_total",
        MetricType.COUNTER,
        "Pods whose containers the kubelet gave devices that Allocate served for another pod's lane (or for "
        "none), found by the lane audit against the kubelet's PodResources API, by action (deleted, reported).",
        ("node", "action"),
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_agent_lane_enforcement",
        MetricType.GAUGE,
        "1 for the mechanism that enforces each lane limit on this node, by limit (memory, compute, isolation, "
        "devices) and mechanism (mps-namespace, mps-daemon-per-lane, declared-only, lane-directories, "
        "namespace-directories, device-nodes, device-nodes+exclusive-process; memory dmem+<MPS mechanism>, or "
        "dmem, where the cgroup dmem controller holds it too).",
        ("node", "limit", "mechanism"),
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_agent_lane_dmem_bytes",
        MetricType.GAUGE,
        "The cgroup dmem limit the agent wrote on a lane's pod cgroup, by GPU and limit (max: the hard limit, "
        "min: the guaranteed share).",
        ("node", "namespace", "pod", "gpu", "limit"),
        frozenset({_AGENT}),
    ),
    MetricSpec(
        "tessera_agent_dmem_failures_total",
        MetricType.COUNTER,
        "cgroup dmem limits the agent could not write or release on a lane's pod cgroup (each also logged, the "
        "first for a pod as a Warning event on it).",
        ("node",),
        frozenset({_AGENT}),
    ),
    # --- extender (kube-scheduler extender API) -------------------------------------------------------------
    MetricSpec(
        "tessera_extender_request_duration_seconds",
        MetricType.HISTOGRAM,
        "Latency of scheduler extender calls by verb (filter, prioritize, bind).",
        ("verb",),
        frozenset({_EXT}),
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "tessera_extender_requests_total",
        MetricType.COUNTER,
        "Scheduler extender calls by verb and result (ok, error).",
        ("verb", "result"),
        frozenset({_EXT}),
    ),
    MetricSpec(
        "tessera_extender_binds_total",
        MetricType.COUNTER,
        "Bind calls by outcome (ok, lost_race: the GPUs filled up between filter and bind, or the node was "
        "still handing a GPU to another pod; error) and a fixed reason code (none, no_fit, placed_elsewhere, "
        "pod_not_found, pod_recreated, node_mismatch, api_error, handoff_pending, claim_unread).",
        ("outcome", "reason"),
        frozenset({_EXT}),
    ),
    MetricSpec(
        "tessera_extender_rejected_nodes_total",
        MetricType.COUNTER,
        "Nodes filter rejected, by reason code (no_inventory, no_gpu_request, bad_request, bad_placement, "
        "placed_elsewhere, no_fit).",
        ("reason",),
        frozenset({_EXT}),
    ),
    MetricSpec(
        "tessera_gpu_memory_allocated_bytes",
        MetricType.GAUGE,
        "GPU memory the extender has assigned to lanes on a GPU (its accounting of tessera.io/gpu-memory).",
        ("node", "gpu"),
        frozenset({_EXT}),
    ),
    MetricSpec(
        "tessera_gpu_compute_allocated_ratio",
        MetricType.GAUGE,
        "Share of a GPU's SMs the extender has assigned to lanes (its accounting of tessera.io/gpu-compute).",
        ("node", "gpu"),
        frozenset({_EXT}),
    ),
    # --- serving: gateway (Orloj, Symphony) -----------------------------------------------------------------
    MetricSpec(
        "tessera_serving_requests_total",
        MetricType.COUNTER,
        "Requests finished by a ModelDeployment's gateway, by outcome: slo_met, slo_missed, dropped, rejected (the model refused the input).",
        (*_NS_MD, "outcome"),
        frozenset({_GW, _SIM}),
    ),
    MetricSpec(
        "tessera_serving_request_latency_seconds",
        MetricType.HISTOGRAM,
        "End-to-end request latency at the gateway (queueing + batch execution).",
        _NS_MD,
        frozenset({_GW, _SIM}),
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "tessera_serving_batch_size",
        MetricType.HISTOGRAM,
        "Sizes of the batches the gateway dispatched to workers.",
        _NS_MD,
        frozenset({_GW, _SIM}),
        BATCH_BUCKETS,
    ),
    MetricSpec(
        "tessera_serving_queue_length",
        MetricType.GAUGE,
        "Requests waiting in a gateway's queue.",
        _NS_MD,
        frozenset({_GW, _SIM}),
    ),
    MetricSpec(
        "tessera_serving_slo_seconds",
        MetricType.GAUGE,
        "Latency SLO of a ModelDeployment.",
        _NS_MD,
        frozenset({_GW, _SIM}),
    ),
    MetricSpec(
        "tessera_serving_replicas",
        MetricType.GAUGE,
        "Worker replicas of a ModelDeployment: desired (Symphony's load-proportional count) and ready.",
        (*_NS_MD, "state"),
        frozenset({_OP, _SIM}),
    ),
    MetricSpec(
        "tessera_serving_predicted_slo_attainment_ratio",
        MetricType.GAUGE,
        "SLO attainment the AlpaServe planner's simulation predicts for a serving pool member under its plan (the observed one: tessera_serving_requests_total by outcome).",
        (*_NS_MD, "pool"),
        frozenset({_OP}),
    ),
)

_BY_NAME: Final = {spec.name: spec for spec in CATALOG}
if len(_BY_NAME) != len(CATALOG):  # pragma: no cover - guarded by tests; fails at import on a typo
    raise ValueError("metric catalogue has a duplicate name")


def get(name: str) -> MetricSpec:
    """The catalogue entry for `name`; accepts a histogram's `_bucket`/`_sum`/`_count` series too."""
    spec = _BY_NAME.get(name) or _BY_NAME.get(base_name(name))
    if spec is None or name not in spec.series_names:
        raise KeyError(f"{name!r} is not in the Tessera metric catalogue (tessera.api.metrics_catalog)")
    return spec


def base_name(series: str) -> str:
    """The family name a series belongs to (`x_bucket` -> `x` for a histogram `x`)."""
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix):
            stem = series[: -len(suffix)]
            if stem in _BY_NAME and _BY_NAME[stem].type is MetricType.HISTOGRAM:
                return stem
    return series


def all_series_names() -> frozenset[str]:
    """Every series name PromQL can select from Tessera's exporters."""
    return frozenset(n for spec in CATALOG for n in spec.series_names)


def for_component(component: Component | str) -> tuple[MetricSpec, ...]:
    """The entries one component exports, in catalogue order."""
    try:
        comp = Component(component)
    except ValueError:
        known = ", ".join(c.value for c in Component)
        raise ValueError(f"unknown component {component!r}; expected one of: {known}") from None
    return tuple(spec for spec in CATALOG if comp in spec.components)
