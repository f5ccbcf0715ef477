"""The `tessera-agent` command line: run the node agent (device plugin, MPS, NVML telemetry, coordinator).

The flags fill one pydantic model (`config.AgentSettings`); a bad value is one line on stderr naming the flag
and the settings field, with exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tessera import logs
from tessera.api import contract
from tessera.policy.lanes.iteration import POLICIES

if TYPE_CHECKING:
    from pydantic import ValidationError
    from tessera.kube import KubeClient

    from tessera_agent.agent import NodeAgent
    from tessera_agent.config import AgentSettings
    from tessera_agent.enforce.dmem import DmemNode
    from tessera_agent.gpus.backend import GpuBackend
    from tessera_agent.gpus.inventory import NodePatcher
    from tessera_agent.kubelet.dra_plugin import DraApi
    from tessera_agent.lanes.restarts import KubernetesEventSink, KubernetesPodRestarter
    from tessera_agent.pods import NodePod, PodSource

log = logging.getLogger("tessera_agent")
PROG: Final = "tessera-agent"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Tessera node agent.")
    _node_options(p.add_argument_group("node"))
    _mps_options(p.add_argument_group("MPS"))
    _dmem_options(p.add_argument_group("GPU memory through cgroup dmem"))
    _socket_options(p.add_argument_group("node sockets"))
    _lane_options(p.add_argument_group("HP/BE lanes"))
    _dra_options(p.add_argument_group("DRA driver (--lanes-api dra)"))
    _demo_options(p.add_argument_group("without a GPU or a cluster"))
    p.add_argument(
        "--forget-nodes",
        action="store_true",
        help=f"remove the {contract.ANN_NODE_GPUS} annotation and the {contract.TAINT_GPU_NODE_KEY} taint from "
        "every Node and exit (the chart runs this before `helm uninstall` removes the agents)",
    )
    logs.add_arguments(p)
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="-v: INFO, -vv: DEBUG (lowers --log-level)"
    )
    return p


def _node_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--node", default=os.environ.get("NODE_NAME", ""), help="this node's name (default $NODE_NAME)"
    )
    # Device-plugin options default to None (the settings' default): given with DRA lanes, they are refused.
    g.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=None,
        help=f"the kubelet's device-plugin directory (default {contract.DEVICE_PLUGIN_DIR}; device plugin only)",
    )
    g.add_argument("--slots-per-gpu", type=int, default=contract.DEFAULT_SLOTS_PER_GPU)
    g.add_argument(
        "--extra-reserve-mib", type=int, default=0, help="memory kept off each GPU beyond the driver's"
    )
    g.add_argument(
        "--reserve-node",
        action="store_true",
        help=f"taint this Node {contract.TAINT_GPU_NODE_KEY}={contract.TAINT_GPU_NODE_VALUE}:"
        f"{contract.TAINT_GPU_NODE_EFFECT} so that only pods tolerating it (those tessera-scheduler places) "
        "land here; without it the agent removes that taint",
    )
    g.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=None,
        help=f"the kubelet's PodResources API socket, read by the lane audit (default {contract.POD_RESOURCES_SOCKET})",
    )
    g.add_argument(
        "--no-lane-audit",
        action="store_true",
        default=None,
        help="do not check running containers against their pods' lanes (the kubelet's PodResources API)",
    )
    g.add_argument(
        "--lane-audit-interval", type=float, default=None, help="seconds between two lane audits (default 10)"
    )
    g.add_argument(
        "--on-lane-mismatch",
        choices=("delete", "report"),
        default=None,
        help="what the lane audit does with a pod whose containers hold another pod's lane: delete it (its "
        "controller recreates it on its own lane; the default) or only report it (events, metric)",
    )
    g.add_argument("--metrics-port", type=int, default=9400, help="Prometheus port (0 = off)")
    g.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="port of /healthz (the event loop answers) and /readyz (the kubelet has taken the device plugin "
        "or the DRA driver), for the pod's probes (0 = off; the chart sets 9103)",
    )
    g.add_argument("--sample-interval", type=float, default=10.0, help="seconds between telemetry samples")
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds to finish in-flight work after SIGTERM before aborting it",
    )


def _mps_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--mps-root",
        type=Path,
        default=Path(contract.MPS_ROOT),
        help="host dir of each lane's own pipe/, log/ and shm/ (lanes/<pod or claim UID>/)",
    )
    g.add_argument("--mps-binary", default="nvidia-cuda-mps-control")
    g.add_argument(
        "--no-mps",
        action="store_true",
        help="run no MPS daemons: lanes' limits are then only declared in their env (needs --declared-only "
        "on a node with real GPUs)",
    )
    g.add_argument(
        "--mps-protocol",
        choices=("auto", "legacy", "v3"),
        default=None,
        help="legacy: an MPS control daemon per lane, its limits as the daemon's defaults; v3 (driver r615+): "
        "a namespace per lane, its container given only the namespace's socket directory; auto (default): v3 "
        "where the control binary offers namespaces",
    )
    g.add_argument(
        "--mps-server-sharing",
        choices=("lane", "gpu"),
        default=None,
        help="with v3: a daemon per lane (default, nothing shared) or per GPU set (lanes' kernels run "
        "concurrently; their server's /dev/shm is shared among them)",
    )
    g.add_argument(
        "--no-exclusive-process",
        action="store_true",
        default=None,
        help="leave GPUs' compute modes alone (default: EXCLUSIVE_PROCESS on a GPU one MPS daemon serves)",
    )
    g.add_argument(
        "--declared-only",
        action="store_true",
        default=None,
        help="allow --no-mps on real GPUs: limits declared in the env, which the workload can change",
    )
    g.add_argument(
        "--dev-root",
        type=Path,
        default=None,
        help="host dir of the driver's device nodes given to containers (default /dev; with "
        "--fake-gpu-backend, fake nodes are made here)",
    )
    g.add_argument(
        "--mem-limit-key",
        choices=["ordinal", "uuid"],
        default="ordinal",
        help="how CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names devices",
    )


def _dmem_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--dmem",
        choices=("auto", "required", "off"),
        default="auto",
        help="hold each lane's GPU memory in the kernel too: dmem.max (and dmem.min) on the lane's pod cgroup "
        "(cgroup v2 dmem controller, Linux 6.14+, an NVIDIA driver that registers its GPUs). auto: where "
        "offered; required: refuse to start where not; off: never (default auto)",
    )
    g.add_argument(
        "--no-dmem-guarantee",
        action="store_true",
        help="write only the hard limit (dmem.max), no guaranteed share (dmem.min) on pods and their ancestors",
    )
    g.add_argument(
        "--cgroup-root",
        type=Path,
        default=None,
        help="the host's /sys/fs/cgroup as mounted for the agent (default: the cgroup2 mount in "
        "/proc/self/mountinfo)",
    )


def _socket_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--coordinator-socket", type=Path, default=None, help="serve the lane coordinator here (opt-in)"
    )
    g.add_argument(
        "--progress-socket",
        type=Path,
        default=None,
        help=f"serve the progress endpoint here and inject {contract.ENV_PROGRESS_ENDPOINT} (opt-in)",
    )
    g.add_argument(
        "--socket-group",
        type=int,
        default=None,
        help="group id owning the coordinator and progress sockets (mode 0660); give workload pods this "
        "supplemental group",
    )
    g.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        help="where socket peers' <pid>/cgroup is read to find their pod (needs hostPID)",
    )
    g.add_argument(
        "--no-peer-check",
        action="store_true",
        help="let any process that can open the sockets act for any pod (demos without pods only)",
    )
    g.add_argument(
        "--lane-policy", choices=POLICIES, default="FAIR", help="coordinator's default lane policy"
    )


def _lane_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--hp-be-lanes",
        action="store_true",
        help="HP/BE lanes: latency-critical lanes get 100%% active threads and MPS client priority 0, "
        "best-effort ones the BE percentage and priority 1; at most one HP lane per GPU",
    )
    g.add_argument(
        "--hp-priority-class",
        action="append",
        default=None,
        help="a priorityClassName that makes a lane HP when its workload annotation names no class "
        f"(repeatable; default {contract.CLASS_LATENCY_CRITICAL})",
    )
    g.add_argument("--be-percent", type=int, default=50, help="BE active-thread percentage to start from")
    g.add_argument(
        "--be-feedback",
        action="store_true",
        help="bisect the BE percentage on the HP lane's iteration times (progress socket), applied by "
        f"deleting BE pods annotated {contract.ANN_CHECKPOINTS}=true; needs --hp-be-lanes, --progress-socket",
    )
    g.add_argument("--be-epsilon", type=float, default=0.15, help="target HP p99 <= (1+e) x alone")
    g.add_argument(
        "--be-min-interval",
        type=float,
        default=300.0,
        help="seconds between BE share changes on a GPU and between deletions of one pod",
    )
    g.add_argument("--be-hysteresis", type=int, default=5, help="points a BE share change must exceed")
    g.add_argument("--be-step-interval", type=float, default=30.0, help="seconds between loop steps")


def _dra_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--lanes-api",
        choices=("devicePlugin", "dra", "auto"),
        default="devicePlugin",
        help="how lanes reach pods: the device plugin (with the scheduler extender) or the DRA driver "
        f"{contract.DRA_DRIVER} (any scheduler; docs/dra.md); auto: the DRA driver when a dry-run "
        "ResourceSlice keeps its consumable capacity, else the device plugin with a Warning Event on the Node",
    )
    g.add_argument(
        "--kubelet-plugins-dir",
        type=Path,
        default=Path(contract.KUBELET_PLUGINS_DIR),
        help="the kubelet's plugins directory (<kubelet root>/plugins): the DRA socket and checkpoint",
    )
    g.add_argument(
        "--kubelet-registry-dir",
        type=Path,
        default=Path(contract.KUBELET_PLUGINS_REGISTRY_DIR),
        help="the kubelet's plugin registration directory (<kubelet root>/plugins_registry)",
    )
    g.add_argument(
        "--cdi-dir",
        type=Path,
        default=Path(contract.CDI_DIR),
        help="where CDI specs are written (containerd's)",
    )
    g.add_argument(
        "--dra-unhealthy-effect",
        choices=("NoSchedule", "NoExecute"),
        default="NoSchedule",
        help=f"effect of the device taint {contract.DRA_TAINT_UNHEALTHY} an unhealthy GPU gets: NoSchedule keeps "
        "new claims off it, NoExecute also evicts the pods of the claims on it (docs/dra.md)",
    )


def _demo_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--fake-gpus", type=int, default=0, help="use N fake GPUs and no Kubernetes API (demos)")
    g.add_argument(
        "--fake-pods",
        type=Path,
        default=None,
        help="with --fake-gpus: a JSON list of pod manifests standing in for the API server's pods",
    )
    g.add_argument(
        "--fake-gpu-backend",
        type=int,
        default=0,
        metavar="N",
        help="for testing without GPUs: N fake GPUs behind the NVML backend's interface; the Kubernetes API, "
        "the kubelet and the node sockets are real (pair it with --no-mps; with --dev-root, fake device "
        "nodes are made there)",
    )


# Flags are `--<dest with dashes>`; each fills the AgentSettings field of the same name (under `agent.` when
# it is an AgentConfig field) unless renamed here. `--no-x` flags fill `x` negated; None leaves the default.
_RENAMED: Final = {
    "node": "agent.node_name",
    "no_peer_check": "agent.peer_check",
    "no_lane_audit": "agent.lane_audit",
    "no_dmem_guarantee": "agent.dmem_guarantee",
    "hp_priority_class": "agent.hp_priority_classes",
    "be_min_interval": "agent.be_min_interval_s",
    "be_step_interval": "agent.be_step_interval_s",
    "lane_audit_interval": "agent.lane_audit_interval_s",
    "no_mps": "mps",
    "no_exclusive_process": "agent.exclusive_process",
    "sample_interval": "sample_interval_s",
    "shutdown_timeout": "shutdown_timeout_s",
}
_NOT_SETTINGS: Final = frozenset({"log_level", "log_format", "verbose", "forget_nodes"})


def settings_field(dest: str) -> str:
    """The AgentSettings field path a flag's argparse destination fills (`be_percent` → `agent.be_percent`)."""
    from tessera_agent.config import AgentSettings

    name = _RENAMED.get(dest, dest)
    return name if name.partition(".")[0] in AgentSettings.model_fields else f"agent.{name}"


def settings_from(args: argparse.Namespace) -> AgentSettings:
    """The parsed flags as settings; pydantic's ValidationError when a value or a combination is refused."""
    from tessera_agent.config import AgentSettings

    data: dict[str, Any] = {"agent": {}}
    for dest, value in vars(args).items():
        if dest in _NOT_SETTINGS or value is None:
            continue
        top, _, sub = settings_field(dest).partition(".")
        value = not value if dest.startswith("no_") else value
        if sub:
            data[top][sub] = value
        else:
            data[top] = value
    return AgentSettings.model_validate(data)


def settings_problem(err: ValidationError, args: argparse.Namespace) -> str:
    """One line naming each refused flag and its settings field: `--be-percent (agent.be_percent): ...`."""
    from tessera.api.resources import input_errors  # the resource models load only on errors

    flags = {settings_field(d): "--" + d.replace("_", "-") for d in vars(args) if d not in _NOT_SETTINGS}
    return "; ".join(
        f"{flags[path]} ({path}): {msg}" if path in flags else f"{path}: {msg}"
        for path, msg in input_errors(err)
    )


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `tessera-agent --help | head -1`
        return logs.reader_went_away()


def _main(argv: list[str] | None) -> int:
    from pydantic import ValidationError
    from tessera.api.safe_load import InputError

    from tessera_agent.pods import load_pod_manifests

    args = build_parser().parse_args(argv)
    _setup_logging(args)
    if args.forget_nodes:
        return asyncio.run(_forget_nodes())
    try:
        settings = settings_from(args)
        fake_pods = load_pod_manifests(settings.fake_pods) if settings.fake_pods is not None else []
    except ValidationError as err:
        return _refuse(settings_problem(err, args))
    except InputError as err:
        return _refuse(f"--fake-pods {err}")
    if settings.mps:
        from tessera_agent.enforce.mechanism import EnforcementError, check_mps_binary, mps_generation

        try:
            check_mps_binary(settings.mps_binary)
            generation = mps_generation(settings.mps_binary, settings.agent)
        except EnforcementError as err:
            return _refuse(str(err), code=1)
    else:
        generation = "legacy"
    settings = settings.model_copy(
        update={"agent": settings.agent.model_copy(update={"mps_protocol": generation})}
    )
    if settings.agent.lanes_api == "auto":  # decided once, before the kubelet hears of either API
        chosen = asyncio.run(_resolve_lanes_api(settings.agent.node_name, settings.agent.slots_per_gpu))
        settings = settings.model_copy(
            update={"agent": settings.agent.model_copy(update={"lanes_api": chosen})}
        )
    if settings.fake_gpus:
        cluster = _fake_cluster(settings, fake_pods)
    else:
        from tessera_agent.gpus.nvml_backend import NvmlUnavailableError

        try:
            cluster = _real_cluster(settings)
        except NvmlUnavailableError as err:
            return _refuse(f"{err} (use --fake-gpus N to try it without a GPU)", code=1)
    from tessera_agent.enforce.mechanism import EnforcementError, check_dmem

    try:
        dmem = check_dmem(settings.agent.dmem, cluster.backend.gpus(), settings.agent.cgroup_root)
    except EnforcementError as err:
        cluster.backend.close()
        return _refuse(str(err), code=1)
    agent = _build_agent(settings, cluster, dmem)
    asyncio.run(_run_until_signalled(agent, settings.shutdown_timeout_s, settings.health_port))
    return 0


async def _resolve_lanes_api(node: str, slots: int) -> str:
    from tessera.kube import KubeClient, default_config

    from tessera_agent.kubelet.dra_auto import agent_lanes_api

    api = KubeClient(default_config())  # its own: a client's connections belong to one event loop
    try:
        return await agent_lanes_api(api, node, slots)
    finally:
        await api.close()


async def _forget_nodes() -> int:
    from tessera.kube import KubeClient, default_config

    from tessera_agent.gpus.inventory import forget_nodes

    api = KubeClient(default_config())
    try:
        changed = await forget_nodes(api)
    finally:
        await api.close()
    log.info(
        "removed %s and the %s taint from %d node(s): %s",
        contract.ANN_NODE_GPUS,
        contract.TAINT_GPU_NODE_KEY,
        len(changed),
        ", ".join(changed),
    )
    return 0


def _refuse(problem: str, code: int = 2) -> int:
    print(f"{PROG}: {problem}", file=sys.stderr)
    return code


def _setup_logging(args: argparse.Namespace) -> None:
    level = min(logging.getLevelNamesMapping()[args.log_level], logging.WARNING - 10 * min(args.verbose, 2))
    logs.setup(logging.getLevelName(level), args.log_format)


@dataclass
class _Cluster:
    """Where the agent's GPUs and pods come from, and what it writes back to the API server."""

    backend: GpuBackend
    pods: PodSource
    patcher: NodePatcher | None = None
    restarter: KubernetesPodRestarter | None = None
    events: KubernetesEventSink | None = None
    dra: DraApi | None = None
    api: KubeClient | None = None  # the API server, where there is one (the lane audit deletes through it)


def _fake_cluster(settings: AgentSettings, fake_pods: list[NodePod]) -> _Cluster:
    """Fake GPUs and the given pods, no API server (demos and tests)."""
    from tessera_agent.gpus.fake_backend import FakeGpuBackend
    from tessera_agent.pods import StaticPodSource

    return _Cluster(FakeGpuBackend.uniform(settings.fake_gpus), StaticPodSource(fake_pods))


def _real_cluster(settings: AgentSettings) -> _Cluster:
    """NVML's GPUs (or --fake-gpu-backend's) and the API server's pods; NvmlUnavailableError without a driver."""
    from tessera_agent.gpus.inventory import KubernetesNodePatcher
    from tessera_agent.pods import KubernetesPodSource

    backend: GpuBackend
    if settings.fake_gpu_backend:
        from tessera_agent.gpus.fake_backend import FakeGpuBackend

        backend = FakeGpuBackend.uniform(settings.fake_gpu_backend)
        if settings.agent.dev_root != Path("/dev"):
            from tessera_agent.enforce.device_nodes import make_fake_device_nodes

            make_fake_device_nodes(backend.gpus(), settings.agent.dev_root)
    else:
        from tessera_agent.gpus.nvml_backend import NvmlGpuBackend

        backend = NvmlGpuBackend()
    kube = KubernetesPodSource()
    cluster = _Cluster(backend, kube, KubernetesNodePatcher(kube.api))
    cfg = settings.agent
    if cfg.lanes_api == "dra":
        from tessera_agent.kubelet.dra_plugin import KubernetesDraApi

        cluster.dra = KubernetesDraApi(kube.api)
    from tessera_agent.lanes.restarts import KubernetesEventSink, KubernetesPodRestarter

    cluster.events = KubernetesEventSink(kube.api, cfg.node_name)  # the lane audit's and the BE loop's
    cluster.api = kube.api
    if cfg.be_feedback:
        cluster.restarter = KubernetesPodRestarter(
            kube.api, min_interval_s=cfg.be_min_interval_s, hp_priority_classes=cfg.hp_priority_classes
        )
    return cluster


def _build_agent(settings: AgentSettings, cluster: _Cluster, dmem_node: DmemNode | None = None) -> NodeAgent:
    """The agent's parts wired together; the metrics server started when a port is given."""
    from prometheus_client import start_http_server

    from tessera_agent.agent import NodeAgent, peer_resolver
    from tessera_agent.enforce.compute_mode import ComputeModes
    from tessera_agent.enforce.lane_daemons import LaneDaemons
    from tessera_agent.enforce.lane_dirs import LaneDirs
    from tessera_agent.gpus.backend import ComputeModeControl
    from tessera_agent.lanes.coordinator import LaneCoordinator
    from tessera_agent.metrics_factory import AgentMetrics

    cfg = settings.agent
    metrics = AgentMetrics()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=metrics.registry)
    coordinator = None
    if cfg.coordinator_socket is not None:
        peers = peer_resolver(cfg, cluster.pods)
        coordinator = LaneCoordinator(
            cfg.coordinator_socket, policy=settings.lane_policy, peers=peers, socket_group=cfg.socket_group
        )
    compute_modes = None
    if settings.mps and cfg.exclusive_process and isinstance(cluster.backend, ComputeModeControl):
        compute_modes = ComputeModes(cluster.backend, cfg.mps_root / "compute-modes.json")
    daemons = LaneDaemons(
        LaneDirs(cfg.mps_root),
        mps=settings.mps,
        binary=settings.mps_binary,
        mem_limit_key=cfg.mem_limit_key,
        layout=cfg.lane_layout(),
        compute_modes=compute_modes,
    )
    from tessera_agent.enforce.mechanism import mechanisms, report

    enforcement = mechanisms(
        settings.mps,
        cfg.lane_layout(),
        exclusive_process=compute_modes is not None,
        dmem=dmem_node is not None,
    )
    dmem = None
    if dmem_node is not None:
        from tessera_agent.enforce.dmem import DmemLimits
        from tessera_agent.enforce.dmem_lanes import DmemLanes

        dmem = DmemLanes(
            DmemLimits(dmem_node, guarantee=cfg.dmem_guarantee, state_path=cfg.mps_root / "dmem-pods.json"),
            cfg.node_name,
            required=cfg.dmem == "required",
            metrics=metrics,
            events=cluster.events,
            gpu_index={g.uuid: g.index for g in cluster.backend.gpus()},
        )
    report(cfg.node_name, enforcement, metrics)
    audit = None
    if cfg.lane_audit and cfg.lanes_api == "devicePlugin" and cluster.api is not None:
        from tessera_agent.kubelet.lane_audit import LaneAudit
        from tessera_agent.kubelet.pod_resources import KubeletPodResources

        audit = LaneAudit(
            cfg.node_name,
            KubeletPodResources(cfg.pod_resources_socket, cfg.resource_name),
            cluster.pods,
            cluster.events,
            cluster.api,
            metrics,
            on_mismatch=cfg.on_lane_mismatch,
        )
    return NodeAgent(
        cfg,
        cluster.backend,
        cluster.pods,
        cluster.patcher,
        metrics,
        daemons=daemons,
        coordinator=coordinator,
        sample_interval_s=settings.sample_interval_s,
        restarter=cluster.restarter,
        events=cluster.events,
        dra=cluster.dra,
        audit=audit,
        enforcement=enforcement,
        dmem=dmem,
    )


async def _run_until_signalled(agent: NodeAgent, shutdown_timeout_s: float, health_port: int = 0) -> None:
    """Run the agent until it ends or SIGTERM/SIGINT; then give in-flight work `shutdown_timeout_s`. With
    `health_port`, the probe endpoints answer for as long as the agent runs."""
    from tessera_agent.health import HealthServer

    health = HealthServer(health_port, agent.readiness) if health_port else None
    if health is not None:
        await health.start()
    try:
        await _run_agent(agent, shutdown_timeout_s)
    finally:
        if health is not None:
            await health.stop()


async def _run_agent(agent: NodeAgent, shutdown_timeout_s: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(agent.run(stop))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        log.info("stopping: sockets closed to new work, %.0fs for in-flight work", shutdown_timeout_s)
        try:
            await asyncio.wait_for(asyncio.shield(task), shutdown_timeout_s)
        except TimeoutError:
            log.warning("in-flight work did not finish in %.0fs; aborting it", shutdown_timeout_s)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    task.result()


if __name__ == "__main__":
    sys.exit(main())
