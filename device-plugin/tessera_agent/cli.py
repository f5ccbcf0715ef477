"""The `tessera-agent` command line: run the node agent (device plugin, MPS, NVML telemetry, coordinator)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tessera import logs
from tessera.api import contract
from tessera.policy.lanes.iteration import POLICIES

if TYPE_CHECKING:
    from .pods import PodInfo
    from .restarts import KubernetesEventSink, KubernetesPodRestarter

log = logging.getLogger("tessera_agent")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera-agent", description="Tessera node agent.")
    p.add_argument(
        "--node", default=os.environ.get("NODE_NAME", ""), help="this node's name (default $NODE_NAME)"
    )
    p.add_argument("--device-plugin-dir", type=Path, default=Path(contract.DEVICE_PLUGIN_DIR))
    p.add_argument("--slots-per-gpu", type=int, default=contract.DEFAULT_SLOTS_PER_GPU)
    p.add_argument(
        "--mps-root", type=Path, default=Path(contract.MPS_ROOT), help="host dir for pipe/, log/, shm/"
    )
    p.add_argument("--mps-binary", default="nvidia-cuda-mps-control")
    p.add_argument(
        "--no-mps", action="store_true", help="do not run the MPS control daemon (one runs elsewhere)"
    )
    p.add_argument(
        "--mem-limit-key",
        choices=["ordinal", "uuid"],
        default="ordinal",
        help="how CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names devices",
    )
    p.add_argument(
        "--extra-reserve-mib", type=int, default=0, help="memory kept off each GPU beyond the driver's"
    )
    p.add_argument("--metrics-port", type=int, default=9400, help="Prometheus port (0 = off)")
    p.add_argument("--sample-interval", type=float, default=10.0, help="seconds between telemetry samples")
    p.add_argument(
        "--coordinator-socket", type=Path, default=None, help="serve the lane coordinator here (opt-in)"
    )
    p.add_argument(
        "--progress-socket",
        type=Path,
        default=None,
        help=f"serve the progress endpoint here and inject {contract.ENV_PROGRESS_ENDPOINT} (opt-in)",
    )
    p.add_argument(
        "--socket-group",
        type=int,
        default=None,
        help="group id owning the coordinator and progress sockets (mode 0660); give workload pods this "
        "supplemental group",
    )
    p.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        help="where socket peers' <pid>/cgroup is read to find their pod (needs hostPID)",
    )
    p.add_argument(
        "--no-peer-check",
        action="store_true",
        help="let any process that can open the sockets act for any pod (demos without pods only)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds to finish in-flight work after SIGTERM before aborting it",
    )
    p.add_argument(
        "--lane-policy", choices=POLICIES, default="FAIR", help="coordinator's default lane policy"
    )
    p.add_argument(
        "--hp-be-lanes",
        action="store_true",
        help="HP/BE lanes: latency-critical lanes get 100%% active threads and MPS client priority 0, "
        "best-effort ones the BE percentage and priority 1; at most one HP lane per GPU",
    )
    p.add_argument(
        "--hp-priority-class",
        action="append",
        default=None,
        help="a priorityClassName that makes a lane HP when its workload annotation names no class "
        f"(repeatable; default {contract.CLASS_LATENCY_CRITICAL})",
    )
    p.add_argument("--be-percent", type=int, default=50, help="BE active-thread percentage to start from")
    p.add_argument(
        "--be-feedback",
        action="store_true",
        help="bisect the BE percentage on the HP lane's iteration times (progress socket), applied by "
        f"deleting BE pods annotated {contract.ANN_CHECKPOINTS}=true; needs --hp-be-lanes, --progress-socket",
    )
    p.add_argument("--be-epsilon", type=float, default=0.15, help="target HP p99 <= (1+e) x alone")
    p.add_argument(
        "--be-min-interval",
        type=float,
        default=300.0,
        help="seconds between BE share changes on a GPU and between deletions of one pod",
    )
    p.add_argument("--be-hysteresis", type=int, default=5, help="points a BE share change must exceed")
    p.add_argument("--be-step-interval", type=float, default=30.0, help="seconds between loop steps")
    p.add_argument("--fake-gpus", type=int, default=0, help="use N fake GPUs and no Kubernetes API (demos)")
    p.add_argument(
        "--fake-pods",
        type=Path,
        default=None,
        help="with --fake-gpus: a JSON list of pod manifests standing in for the API server's pods",
    )
    logs.add_arguments(p)
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="-v: INFO, -vv: DEBUG (lowers --log-level)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `tessera-agent --help | head -1`
        return logs.reader_went_away()


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    level = min(logging.getLevelNamesMapping()[args.log_level], logging.WARNING - 10 * min(args.verbose, 2))
    logs.setup(logging.getLevelName(level), args.log_format)
    from prometheus_client import start_http_server

    from .agent import NodeAgent, peer_resolver
    from .config import AgentConfig
    from .coordinator import LaneCoordinator
    from .inventory import KubernetesNodePatcher, NodePatcher
    from .metrics_factory import AgentMetrics
    from .mps import MpsManager
    from .pods import KubernetesPodSource, PodSource, StaticPodSource

    try:
        cfg = AgentConfig(
            node_name=args.node,
            device_plugin_dir=args.device_plugin_dir,
            slots_per_gpu=args.slots_per_gpu,
            mps_root=args.mps_root,
            mem_limit_key=args.mem_limit_key,
            extra_reserve_mib=args.extra_reserve_mib,
            coordinator_socket=args.coordinator_socket,
            progress_socket=args.progress_socket,
            socket_group=args.socket_group,
            peer_check=not args.no_peer_check,
            proc_root=args.proc_root,
            hp_be_lanes=args.hp_be_lanes,
            hp_priority_classes=tuple(args.hp_priority_class or (contract.CLASS_LATENCY_CRITICAL,)),
            be_percent=args.be_percent,
            be_feedback=args.be_feedback,
            be_epsilon=args.be_epsilon,
            be_min_interval_s=args.be_min_interval,
            be_hysteresis=args.be_hysteresis,
            be_step_interval_s=args.be_step_interval,
        )
        if args.be_feedback and args.fake_gpus:
            raise ValueError("--be-feedback deletes pods through the Kubernetes API; --fake-gpus has none")
        if args.shutdown_timeout <= 0 or args.shutdown_timeout != args.shutdown_timeout:
            raise ValueError(f"--shutdown-timeout must be a positive number, got {args.shutdown_timeout}")
        if args.fake_pods is not None and not args.fake_gpus:
            raise ValueError("--fake-pods needs --fake-gpus")
        fake_pods = _read_fake_pods(args.fake_pods) if args.fake_pods is not None else []
    except ValueError as err:
        print(f"tessera-agent: {err}", file=sys.stderr)
        return 2
    pods: PodSource
    patcher: NodePatcher | None
    restarter: KubernetesPodRestarter | None = None
    events: KubernetesEventSink | None = None
    if args.fake_gpus:
        from .fake_backend import FakeGpuBackend

        backend: object = FakeGpuBackend.uniform(args.fake_gpus)
        pods, patcher = StaticPodSource(fake_pods), None
    else:
        from .nvml_backend import NvmlGpuBackend, NvmlUnavailableError

        try:
            backend = NvmlGpuBackend()
        except NvmlUnavailableError as err:
            print(f"tessera-agent: {err} (use --fake-gpus N to try it without a GPU)", file=sys.stderr)
            return 1
        kube = KubernetesPodSource()
        pods, patcher = kube, KubernetesNodePatcher(kube.api)
        if cfg.be_feedback:
            from .restarts import KubernetesEventSink, KubernetesPodRestarter

            restarter = KubernetesPodRestarter(
                kube.api,
                min_interval_s=cfg.be_min_interval_s,
                hp_priority_classes=cfg.hp_priority_classes,
            )
            events = KubernetesEventSink(kube.api, cfg.node_name)
    metrics = AgentMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.registry)
    agent = NodeAgent(
        cfg,
        backend,  # type: ignore[arg-type]
        pods,
        patcher,
        metrics,
        mps=None if args.no_mps else MpsManager(cfg.mps_pipe_dir, cfg.mps_log_dir, binary=args.mps_binary),
        coordinator=LaneCoordinator(
            args.coordinator_socket,
            policy=args.lane_policy,
            peers=peer_resolver(cfg, pods),
            socket_group=cfg.socket_group,
        )
        if args.coordinator_socket
        else None,
        sample_interval_s=args.sample_interval,
        restarter=restarter,
        events=events,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(agent.run(stop))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not task.done():
            log.info("stopping: sockets closed to new work, %.0fs for in-flight work", args.shutdown_timeout)
            try:
                await asyncio.wait_for(asyncio.shield(task), args.shutdown_timeout)
            except TimeoutError:
                log.warning("in-flight work did not finish in %.0fs; aborting it", args.shutdown_timeout)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        task.result()

    asyncio.run(run())
    return 0


def _read_fake_pods(path: Path) -> list[PodInfo]:
    from .pods import pod_info_from_manifest

    try:
        items = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"--fake-pods {path}: {err}") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"--fake-pods {path}: expected a JSON list of pod manifests")
    return [pod_info_from_manifest(i) for i in items]


if __name__ == "__main__":
    sys.exit(main())
