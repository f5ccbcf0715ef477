"""Names shared by every component: API group, resources, annotations, labels, env.

One module so the operator, extender, node agent and chart can never disagree on a spelling.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "tessera.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

KIND_APP: Final = "App"
KIND_TRIALGROUP: Final = "TrialGroup"
KIND_MODELDEPLOYMENT: Final = "ModelDeployment"
KIND_QUEUE: Final = "Queue"
PLURAL_APP: Final = "apps"
PLURAL_TRIALGROUP: Final = "trialgroups"
PLURAL_MODELDEPLOYMENT: Final = "modeldeployments"
PLURAL_QUEUE: Final = "queues"
CATEGORY: Final = "tessera"

# Extended resources on pods, read by tessera.api.quantity.resource_quantity (canonical quantities: gpu-memory
# counts MiB when plain or decimal-suffixed, `8k` = 8000 MiB; a binary suffix is bytes, `16Gi` = 16384 MiB).
RESOURCE_GPU: Final = f"{GROUP}/gpu"  # GPUs spanned (virtual slots advertised by the agent)
RESOURCE_GPU_MEMORY: Final = f"{GROUP}/gpu-memory"  # MiB per GPU
RESOURCE_GPU_COMPUTE: Final = f"{GROUP}/gpu-compute"  # percent of one GPU's SMs

# Virtual device slots the agent advertises per physical GPU for tessera.io/gpu.
DEFAULT_SLOTS_PER_GPU: Final = 10

# Dynamic Resource Allocation (resource.k8s.io/v1): the agent's driver publishes one device per GPU with
# consumable capacity; a claim's lane is its share of both capacities (docs/dra.md).
DRA_DRIVER: Final = f"gpu.{GROUP}"
DRA_DEVICE_CLASS: Final = DRA_DRIVER  # the chart's DeviceClass, selecting the driver's GPUs
# device taint (KEP-5055) on a GPU the agent found unhealthy (a critical XID): NoSchedule, or NoExecute to evict
DRA_TAINT_UNHEALTHY: Final = f"{DRA_DRIVER}/unhealthy"
DRA_CAPACITY_MEMORY: Final = "memory"  # bytes of the GPU's usable memory
DRA_CAPACITY_COMPUTE: Final = "computeShare"  # percent of the GPU's SMs (MPS active thread percentage)
DRA_CAPACITY_CLIENTS: Final = "clients"  # MPS client slots: each allocation takes one (slotsPerGpu per GPU)
DRA_ATTRIBUTE_UUID: Final = "uuid"  # device attribute: the GPU's UUID (the operator's claims select by it)
DRA_ATTRIBUTE_PCIE_ROOT: Final = "pcieRoot"  # device attribute: the GPU's PCIe root complex (pci0000:3a)
DRA_ATTRIBUTE_NUMA_NODE: Final = "numaNode"  # device attribute: the GPU's NUMA node, where known
DRA_CDI_KIND: Final = f"{DRA_DRIVER}/lane"  # CDI vendor/class of the devices NodePrepareResources returns

# Annotations.
ANN_PLACEMENT: Final = f"{GROUP}/placement"  # operator → extender: node + GPU indices
ANN_ASSIGNMENT: Final = f"{GROUP}/assignment"  # extender → agent: node, GPU UUIDs, lane, memory, compute
ANN_GPU_MODELS: Final = f"{GROUP}/gpu-models"  # user → extender: GPU models a pod accepts ("a100|h100")
ANN_WORKLOAD: Final = f"{GROUP}/workload"  # training | trial | serving [+ class]
ANN_NODE_GPUS: Final = f"{GROUP}/gpus"  # agent → everyone: per-GPU inventory on the Node
# agent → admins: JSON {limit: mechanism} of what enforces each lane limit on the Node (docs/node-agent.md)
ANN_NODE_LANE_ENFORCEMENT: Final = f"{GROUP}/lane-enforcement"
ANN_PROGRESS: Final = f"{GROUP}/progress"  # workload → operator: iterations done (pod annotation)
ANN_ALLOCATED: Final = f"{GROUP}/allocated"  # agent: device IDs Allocate gave this pod (marks it served)
ANN_GPU_POOL: Final = f"{GROUP}/gpu-pool"  # operator: GPUs a TrialGroup owns (JSON ["node/index", ...])
# extender → kube-scheduler: bumped on a pod it refused everywhere once room frees on a node it refused, so
# the pod is retried (its update requeues it) rather than waiting for the next cluster event
ANN_RETRY: Final = f"{GROUP}/retry"

# Labels.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "tessera"
LABEL_APP: Final = f"{GROUP}/app"
LABEL_TRIALGROUP: Final = f"{GROUP}/trialgroup"
LABEL_MODELDEPLOYMENT: Final = f"{GROUP}/modeldeployment"
LABEL_JOB: Final = f"{GROUP}/job"
LABEL_TRIAL: Final = f"{GROUP}/trial"
LABEL_ROLE: Final = f"{GROUP}/role"  # worker | gateway
LABEL_LEASE: Final = f"{GROUP}/lease"
LABEL_QUEUE: Final = f"{GROUP}/queue"  # on a Namespace: the Queue its objects belong to
# Pods that are not Tessera's own (plain pods, Jobs' pods) asking for tessera.io/gpu in a namespace with the
# queue label wait in its queue: the chart's MutatingAdmissionPolicy gives them this scheduling gate and the
# label below at creation; the operator removes the gate once the queue has room (docs/queues.md).
SCHEDULING_GATE_QUEUE: Final = f"{GROUP}/queue"
LABEL_QUEUED: Final = f"{GROUP}/queued"  # "true": the pod counts against its namespace's queue
# How the operator groups queued pods (a group is admitted whole): the Job a pod belongs to.
LABEL_JOB_NAME: Final = "batch.kubernetes.io/job-name"

WORKLOAD_TRAINING: Final = "training"
WORKLOAD_TRIAL: Final = "trial"
WORKLOAD_SERVING: Final = "serving"

SCHEDULER_NAME: Final = "tessera-scheduler"
# GPU nodes kept for tessera-scheduler (chart value gpuNodes.reserve): the agent taints its Node with this,
# and every pod tessera-scheduler should place carries the matching toleration (the operator's pods, and
# pods of the namespaces the chart's MutatingAdmissionPolicy routes).
TAINT_GPU_NODE_KEY: Final = f"{GROUP}/gpu-node"
TAINT_GPU_NODE_VALUE: Final = "reserved"
TAINT_GPU_NODE_EFFECT: Final = "NoSchedule"
# The chart routes pods of namespaces labelled `<this>: "true"` to tessera-scheduler (its default selector).
LABEL_GPU_NODES_NAMESPACE: Final = f"{GROUP}/gpu-nodes"
FINALIZER: Final = f"{GROUP}/cleanup"
# The arbiter's renewal ledger (controller/ledger.py): a ConfigMap in the operator's namespace naming the
# leases renewed in rounds whose App status does not show the new expiry yet; read before the first round.
LEDGER_CONFIGMAP: Final = "tessera-arbiter-ledger"
LEDGER_KEY: Final = "ledger"  # its data key (JSON)

# Env injected into containers.
ENV_CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
ENV_MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"
ENV_MPS_ACTIVE_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PINNED_DEVICE_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_CLIENT_PRIORITY: Final = "CUDA_MPS_CLIENT_PRIORITY"  # 0 normal (HP lane), 1 below normal (BE lane)
ENV_LANE_ID: Final = "TESSERA_LANE_ID"
ENV_RANK: Final = "TESSERA_RANK"
ENV_WORLD_SIZE: Final = "TESSERA_WORLD_SIZE"
ENV_PROGRESS_ENDPOINT: Final = "TESSERA_PROGRESS_ENDPOINT"
ENV_COORDINATOR_SOCKET: Final = "TESSERA_COORDINATOR_SOCKET"
ENV_JOB: Final = "TESSERA_JOB"
ENV_TRIAL: Final = "TESSERA_TRIAL"
ENV_TRIAL_CONFIG: Final = "TESSERA_TRIAL_CONFIG"  # a trial's hyper-parameters (JSON object)
ENV_MODEL: Final = "TESSERA_MODEL"  # the model a serving worker loads
ENV_REPLICA: Final = "TESSERA_REPLICA"  # a serving worker's replica index

# Device plugin.
DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET: Final = DEVICE_PLUGIN_DIR + "kubelet.sock"
# The kubelet's DRA side: drivers' sockets under plugins/, registration sockets in plugins_registry/ (both
# under the kubelet's --root-dir), CDI specs where containerd's cdi_spec_dirs default looks.
KUBELET_PLUGINS_DIR: Final = "/var/lib/kubelet/plugins"
POD_RESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's PodResources API
KUBELET_PLUGINS_REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"
CDI_DIR: Final = "/var/run/cdi"
AGENT_SOCKET_NAME: Final = "tessera-gpu.sock"
MPS_ROOT: Final = "/run/tessera/mps"
MPS_CONTAINER_ROOT: Final = "/mps"

METRIC_PREFIX: Final = "tessera_"

# Interference profile of a GPU workload (pod annotation): "compute" | "memory" | "unknown" | a measured
# fraction in [0, 1] of GPU time that is compute-bound. The workload class rides on ANN_WORKLOAD as
# "<kind>:<class>", class "latency-critical" | "best-effort" (default best-effort).
ANN_PROFILE: Final = f"{GROUP}/profile"
CLASS_LATENCY_CRITICAL: Final = "latency-critical"
CLASS_BEST_EFFORT: Final = "best-effort"
# A best-effort pod that checkpoints and may be restarted by the node agent to apply a new BE compute share
# (Orion-style feedback): annotation value "true".
ANN_CHECKPOINTS: Final = f"{GROUP}/checkpoints"
# On a latency-critical pod: its p99 latency (seconds; iteration time for training) on a GPU of its own, the
# baseline of the node agent's BE feedback loop where the GPU never ran the HP lane alone.
ANN_P99_DEDICATED: Final = f"{GROUP}/p99-dedicated-seconds"
# Path (in the container) of the node-local HP-busy flag file the agent publishes for BE lanes that throttle.
ENV_HP_BUSY_FILE: Final = "TESSERA_HP_BUSY_FILE"

# Serving gateway (Open Inference Protocol v2 over HTTP): request headers the gateway reads.
HEADER_APP: Final = "x-tessera-app"  # application tag of a request (Orloj's per-application histograms)
HEADER_DEADLINE_MS: Final = "x-tessera-deadline-ms"  # optional per-request latency budget, milliseconds


def gpu_node_toleration() -> dict[str, str]:
    """The toleration of the GPU-node taint (a fresh dict: callers put it into manifests)."""
    return {
        "key": TAINT_GPU_NODE_KEY,
        "operator": "Equal",
        "value": TAINT_GPU_NODE_VALUE,
        "effect": TAINT_GPU_NODE_EFFECT,
    }
