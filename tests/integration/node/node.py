"""A real one-node Kubernetes cluster for tests: the control plane of tests/integration/k8s, and a node.

The node is what a kubeadm worker runs, as processes of this test session:

  containerd   its own root, state, socket and runc root under the work dir; CRI on, cgroupfs, overlayfs;
               Debian's 1.6 or 2.x built from its Go module (hack/containerd-assets.sh), which reads CDI
               specs from the work dir's cdi/ (DRA drivers hand devices to containers as CDI devices)
  CNI          bridge (+ host-local IPAM) and portmap from Debian's containernetworking-plugins; containerd
               sets up loopback itself
  kube-proxy   iptables mode, leaving the host's conntrack and route_localnet settings alone
  kubelet      its own root dir and cgroup root; registers its Node and authenticates as
               `system:node:<name>` with a client certificate signed by the control plane's client CA
  cluster DNS  the `kube-dns` Service's records, answered by the harness from the API server (dns.py)

plus a kube-scheduler (the default one: the chart's own scheduler pod must be placed by something) and the
images of hack/images.sh (the project's pause image, the Tessera image built from the Dockerfile, the chart's
kube-scheduler image) imported into containerd. The API server listens on the host's address, so pods reach
it through the `kubernetes` Service's ClusterIP as in any cluster.

Teardown removes what the node made: pods are deleted through the API and awaited, the processes stopped by
their PIDs (containerd's shims included, found by the socket address on their command line), mounts under
the work dir and the network namespaces containerd created unmounted, the cgroups under the node's cgroup
root removed, iptables rules and chains that were not there before deleted, the bridge deleted and the
sysctls it set restored.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tessera.api import contract

from tests.integration.k8s.controlplane import (
    ROOT,
    SERVICE_RANGE,
    ControlPlane,
    NoBinaries,
    Process,
    control_plane,
    wait_until,
)
from tests.ports import free_port

from .dns import DOMAIN, ClusterDns

IMAGES_SCRIPT = ROOT / "hack" / "images.sh"
CONTAINERD_SCRIPT = ROOT / "hack" / "containerd-assets.sh"
# Which containerd the node runs: "built" (2.x from hack/containerd-assets.sh, CDI on) or "debian" (1.6, no
# CDI). The DRA tests need "built".
CONTAINERD_ENV = "TESSERA_NODE_CONTAINERD"
DEFAULT_CONTAINERD = "built"
CNI_BIN = Path("/usr/lib/cni")
CGROUP_V1 = Path("/sys/fs/cgroup")
# Controllers the kubelet needs on cgroup v1 (it creates its pod cgroups in each it finds mounted).
REQUIRED_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
# Pod network of the node's bridge: a /24 of its own (host-local), away from the Service range 10.0.0.0/24.
POD_SUBNET = "10.244.77.0/24"
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle")
# Every control plane controller but node IPAM (the bridge's host-local IPAM gives pod addresses) and TTL.
NODE_CONTROLLERS = "*,-nodeipam,-ttl"
NETNS_DIR = "/var/run/netns"
LOG_LINKS_DIR = "/var/log/containers"
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")


class NoNode(NoBinaries):
    """This machine cannot run the node (not root, no cgroups, a package missing); the tests skip, except
    in CI."""


def preflight(containerd: str = DEFAULT_CONTAINERD) -> None:
    """NoNode with the one thing missing, or nothing. Debian's containerd package is needed either way: its
    `ctr` imports the images and lists tasks (the 1.6 client speaks the 2.x API for these)."""
    if os.geteuid() != 0:
        raise NoNode("the node harness needs root (containerd, the kubelet, iptables, mounts)")
    missing = [c for c in REQUIRED_CONTROLLERS if not (CGROUP_V1 / c / "cgroup.procs").exists()]
    if missing:
        raise NoNode(f"no cgroup v1 hierarchy for {', '.join(missing)} under {CGROUP_V1}")
    tools = ["runc", "ctr", "iptables", "iptables-save", "conntrack", "buildah", "mmdebstrap", "gcc", "ip",
             "mount"]  # fmt: skip
    if containerd == "debian":
        tools += ["containerd", "containerd-shim-runc-v2"]
    absent = [t for t in tools if shutil.which(t) is None]
    absent += [
        str(CNI_BIN / p)
        for p in ("bridge", "host-local", "loopback", "portmap")
        if not (CNI_BIN / p).exists()
    ]
    if absent:
        raise NoNode(f"{', '.join(absent)} not found: run `bash hack/install-node-deps.sh`")


def host_address() -> str:
    """The host's IPv4 address on its default route's interface (the node's InternalIP)."""
    out = subprocess.run(
        ["ip", "-4", "-j", "route", "show", "default"], capture_output=True, text=True, check=True
    )
    routes = json.loads(out.stdout or "[]")
    devs = [r["dev"] for r in routes if "dev" in r]
    addrs = json.loads(
        subprocess.run(["ip", "-4", "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout
    )
    for iface in sorted(addrs, key=lambda a: a["ifname"] not in devs):
        for info in iface.get("addr_info", []):
            if info.get("scope") == "global":
                return str(info["local"])
    raise NoNode("the host has no global IPv4 address for the node (its InternalIP)")


def build_images(assets: Path) -> dict[str, str]:
    """hack/images.sh's images (built on first use, then from ~/.cache/tessera): name → reference, and
    `DIR` → the directory of their archives. The build's progress goes to this process's stderr."""
    proc = subprocess.run(
        ["bash", str(IMAGES_SCRIPT), str(assets)], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"hack/images.sh failed (exit {proc.returncode}); run it to see why")
    directory = Path(lines[-1])
    images = dict(line.split("=", 1) for line in (directory / "images.env").read_text().splitlines() if line)
    images["DIR"] = str(directory)
    return images


def built_containerd() -> Path:
    """The directory of containerd and its runc shim built from the Go module (built on first use, then from
    ~/.cache/tessera); the build's progress goes to this process's stderr."""
    proc = subprocess.run(["bash", str(CONTAINERD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise NoNode(f"hack/containerd-assets.sh failed (exit {proc.returncode}); run it to see why")
    return Path(lines[-1])


def _run(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)


def _iptables_state(cmd: str) -> dict[str, tuple[set[str], set[str]]]:
    """table → (chains, rules) as `<cmd>-save` prints them."""
    state: dict[str, tuple[set[str], set[str]]] = {}
    for table in TABLES:
        out = _run(f"{cmd}-save", "-t", table, check=False)
        chains = {ln[1:].split()[0] for ln in out.stdout.splitlines() if ln.startswith(":")}
        rules = {ln for ln in out.stdout.splitlines() if ln.startswith("-A ")}
        state[table] = (chains, rules)
    return state


@dataclass
class Node:
    """The node's processes and what it changed on the host, to undo. `plane` is its control plane."""

    plane: ControlPlane
    workdir: Path
    images: dict[str, str]
    name: str = "tessera-node"
    address: str = ""
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    processes: dict[str, Process] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # Resident memory of the chart's pods (MiB), taken while they run (test_helm_uninstall_…, before it).
    pod_memory: dict[str, float] = field(default_factory=dict)
    snapshotter: str = "overlayfs"
    # containerd 2.x built from its module (its directory), else Debian's 1.6 from PATH
    containerd_dir: Path | None = None
    _argv: dict[str, list[str]] = field(default_factory=dict)
    _env: dict[str, dict[str, str] | None] = field(default_factory=dict)
    _made_dirs: list[Path] = field(default_factory=list)
    _device_plugins_before: set[str] = field(default_factory=set)
    _restarts: dict[str, int] = field(default_factory=dict)
    dns: ClusterDns | None = None
    _sysctls: dict[str, str] = field(default_factory=dict)
    _iptables: dict[str, dict[str, tuple[set[str], set[str]]]] = field(default_factory=dict)
    _netns_before: set[str] | None = None  # None: /var/run/netns did not exist
    _log_links_before: set[str] | None = None  # None: /var/log/containers did not exist

    # --- paths -------------------------------------------------------------------------------------------
    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def cdi_dir(self) -> Path:
        """Where containerd reads CDI specs (with the built containerd; 1.6 reads none)."""
        return self.workdir / "cdi"

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        """Where the kubelet's device-plugin registration socket is: a fixed path, whatever its --root-dir
        (the kubelet's `pluginapi.DevicePluginPath`), so the chart's default. Made and removed by the node when
        it was not there before."""
        return KUBELET_DEVICE_PLUGINS

    @property
    def host_dir(self) -> Path:
        """A directory for the chart's hostPath volumes (MPS root, node sockets), private to this node."""
        return self.workdir / "host"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's cgroupRoot: its pods' cgroups live under /<this>/kubepods in every hierarchy."""
        return f"/tessera-node-{self.token}"

    @property
    def bridge(self) -> str:
        return f"tsr{self.token}"

    # --- start ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.monotonic()
        # Deepest first: the directories of /var/lib/kubelet/device-plugins that the node makes, to remove.
        self._made_dirs = [
            p for p in (KUBELET_DEVICE_PLUGINS, *KUBELET_DEVICE_PLUGINS.parents) if not p.exists()
        ]
        self._device_plugins_before = _listing(str(KUBELET_DEVICE_PLUGINS)) or set()
        for path in (
            self.workdir / "cni" / "net.d",
            self.device_plugin_dir,
            self.host_dir,
            self.workdir / "pod-logs",
        ):
            path.mkdir(parents=True, exist_ok=True)
        self._netns_before = _listing(NETNS_DIR)
        self._log_links_before = _listing(LOG_LINKS_DIR)
        self._iptables = {cmd: _iptables_state(cmd) for cmd in IPTABLES if shutil.which(f"{cmd}-save")}
        for key, value in SYSCTLS.items():
            path = Path("/proc/sys") / key
            if path.exists():
                self._sysctls[key] = path.read_text().strip()
                path.write_text(value)
        self._fence_service_range()
        self._make_cgroup_root()
        self._start_containerd()
        self.timings["containerd"] = time.monotonic() - t0
        self._import_images()
        self.timings["images imported"] = time.monotonic() - t0
        self._start_scheduler()
        self._start_kube_proxy()
        self.dns = ClusterDns(self.plane, self.address)
        self.dns.start()
        self._start_kubelet()
        self.timings["node ready"] = time.monotonic() - t0

    def _fence_service_range(self) -> None:
        """Refuse on this host any connection to the Service range that kube-proxy's rules did not
        translate (a ClusterIP it has not programmed yet, or no Service at all), from the host or a pod.

        Such a packet would otherwise leave by the default route, and this machine's upstream gateway
        accepts every TCP connection and answers HTTP 404: a client that connected to a new Service a
        moment before kube-proxy's sync kept its kept-alive connection to that gateway, so a CI-like run
        waited 300 s for the model "ready behind the ClusterIP" while the gateway pod answered 200. In a
        cluster such traffic goes nowhere; here it is reset at once and the client connects again.
        Removed with the rest of the node's iptables rules."""
        chain = "TESSERA-NODE-SERVICES"
        _run("iptables", "-w", "-N", chain)
        _run("iptables", "-w", "-A", chain, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
        _run("iptables", "-w", "-A", chain, "-j", "REJECT")  # UDP and the rest: ICMP port unreachable
        for hook in ("OUTPUT", "FORWARD"):  # after kube-proxy's DNAT (nat OUTPUT, PREROUTING)
            _run("iptables", "-w", "-I", hook, "-d", SERVICE_RANGE, "-j", chain)

    def _make_cgroup_root(self) -> None:
        for ctl in self._controllers():
            path = CGROUP_V1 / ctl / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            if ctl == "cpuset":  # a new cpuset cgroup has no CPUs or memory nodes until given its parent's
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (path / f).write_text((CGROUP_V1 / ctl / f).read_text())

    @staticmethod
    def _controllers() -> list[str]:
        return sorted(
            p.name for p in CGROUP_V1.iterdir() if (p / "cgroup.procs").exists() and p.name != "unified"
        )

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        proc = self.plane.spawn(name, argv, env)
        self.processes[name] = proc
        self._argv[name] = argv
        self._env[name] = env
        return proc

    def restart(self, name: str, *, kill: bool = False) -> Process:
        """Stop one of the node's processes (SIGKILL with `kill`, else SIGTERM) and start it again with the
        same arguments; the new log is `<name>-<n>.log`. containerd's shims, and so its containers, live on."""
        old = self.processes[name]
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old.popen.pid, 9)
            old.popen.wait(30)
        else:
            old.stop()
        self._restarts[name] = self._restarts.get(name, 0) + 1
        proc = self.plane.spawn(f"{name}-{self._restarts[name]}", self._argv[name], self._env.get(name))
        self.processes[name] = proc
        return proc

    def _start_containerd(self) -> None:
        d = self.workdir / "containerd"
        self.snapshotter = "overlayfs" if _overlay_works(self.workdir) else "native"
        config = self._containerd_config_v3() if self.containerd_dir else self._containerd_config_v2()
        (d).mkdir(parents=True, exist_ok=True)
        (d / "config.toml").write_text(config)
        self._write_cni_config()
        if self.containerd_dir is None:
            proc = self._spawn("containerd", ["containerd", "--config", str(d / "config.toml")])
        else:
            self.cdi_dir.mkdir(exist_ok=True)
            # its own runc shim first on PATH: containerd finds `containerd-shim-runc-v2` there
            env = {**os.environ, "PATH": f"{self.containerd_dir}:{os.environ.get('PATH', '')}"}
            argv = [str(self.containerd_dir / "containerd"), "--config", str(d / "config.toml")]
            proc = self._spawn("containerd", argv, env)
        wait_until(
            lambda: self.ctr("version", check=False).returncode == 0, 120, "containerd to answer", proc
        )

    def _containerd_config_v3(self) -> str:
        """containerd 2.x: config version 3, whose CRI settings are split into the images and runtime plugins.
        CDI has no switch in 2.x (always on; 1.7's `enable_cdi` is gone): the spec directories say where."""
        d = self.workdir / "containerd"
        images = "plugins.'io.containerd.cri.v1.images'"
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        return f"""version = 3
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{d}/containerd.ttrpc.sock"

[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/opt"

[{images}]
  snapshotter = "{self.snapshotter}"
  [{images}.pinned_images]
    sandbox = "{self.images["PAUSE_IMAGE"]}"

[{runtime}]
  cdi_spec_dirs = ["{self.cdi_dir}"]
  restrict_oom_score_adj = {str(not _has_sys_resource()).lower()}
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [{runtime}.cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{self.workdir / "cni" / "net.d"}"
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    def _containerd_config_v2(self) -> str:
        """Debian's containerd 1.6: config version 2, CDI off (1.6 has none)."""
        d = self.workdir / "containerd"
        snapshotter = self.snapshotter
        return f"""version = 2
root = "{d}/root"
state = "{d}/state"
plugin_dir = ""
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{d}/containerd.ttrpc.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images["PAUSE_IMAGE"]}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  restrict_oom_score_adj = {str(not _has_sys_resource()).lower()}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.workdir / "cni" / "net.d"}"
    max_conf_num = 1
"""

    def _write_cni_config(self) -> None:
        (self.workdir / "cni" / "net.d" / "10-tessera.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "tessera-test",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": self.bridge,
                            "isGateway": True,
                            "ipMasq": True,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.workdir / "cni" / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=1,
            )
        )

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args,
                    check=check, timeout=timeout)  # fmt: skip

    def _import_images(self) -> None:
        directory = Path(self.images["DIR"])
        for archive in sorted(directory.glob("*.tar")):
            self.ctr("images", "import", "--snapshotter", self.snapshotter, str(archive.resolve()))
        listed = self.ctr("images", "ls", "-q").stdout.split()
        for name in ("PAUSE_IMAGE", "TESSERA_IMAGE", "WORKER_IMAGE", "SCHEDULER_IMAGE"):
            if self.images.get(name):
                assert self.images[name] in listed, f"{self.images[name]} not imported: {listed}"

    def _start_scheduler(self) -> None:
        """The default kube-scheduler (cluster-admin's kubeconfig; one replica, no leader election)."""
        self._spawn(
            "kube-scheduler",
            [str(self.plane.assets / "kube-scheduler"), f"--kubeconfig={self.plane.kubeconfig}",
             "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
             "-v=2"],  # each attempt and its reason, for a test's failure to quote
        )  # fmt: skip

    def _start_kube_proxy(self) -> None:
        cert = self.plane.issue_client_cert("kube-proxy", "system:kube-proxy")
        kubeconfig = self.plane.write_kubeconfig(self.workdir / "kube-proxy.kubeconfig", cert=cert)
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.name,
            "bindAddress": self.address,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "clusterCIDR": POD_SUBNET,
            # Leave the host's conntrack table size and timeouts as they are (a shared machine).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            # NodePorts on 127.0.0.1 would need net.ipv4.conf.all.route_localnet=1 on the host.
            "iptables": {"localhostNodePorts": False},
            **({} if _has_sys_resource() else {"oomScoreAdj": 0}),
        }
        path = self.workdir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [str(self.plane.assets / "kube-proxy"), f"--config={path}", "-v=2"])

    def _start_kubelet(self) -> None:
        cert = self.plane.issue_client_cert("kubelet", f"system:node:{self.name}", ("system:nodes",))
        kubeconfig = self.plane.write_kubeconfig(self.workdir / "kubelet.kubeconfig", cert=cert)
        port, healthz = free_port(), free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # v1.35+ refuses cgroup v1 unless told; this machine has only v1 controllers.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.address,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            # The API server's requests (logs, exec) come without a client certificate: test-only trust.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.plane.client_ca[0])}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            "failSwapOn": False,
            "resolvConf": "/etc/resolv.conf",
            "clusterDNS": [self.dns.service_ip if self.dns else ""],
            "clusterDomain": DOMAIN,
            "serializeImagePulls": False,
            "rotateCertificates": False,
            # A shared disk: evict only on real exhaustion, never collect the imported images.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "5s",
            **({} if _has_sys_resource() else {"oomScoreAdj": 0}),
            "syncFrequency": "10s",
        }  # fmt: skip
        path = self.workdir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        labels = "nvidia.com/gpu.present=true,tessera.io/test-node=true"
        proc = self._spawn(
            "kubelet",
            [str(self.plane.assets / "kubelet"), f"--config={path}", f"--kubeconfig={kubeconfig}",
             f"--root-dir={self.kubelet_root}", f"--cert-dir={self.workdir / 'kubelet-pki'}",
             f"--hostname-override={self.name}", f"--node-ip={self.address}", f"--node-labels={labels}", "-v=2"],
        )  # fmt: skip
        wait_until(self.ready, 180, f"node {self.name} to be Ready without taints", proc)

    def node(self) -> dict[str, Any] | None:
        got = self.plane.get(f"/api/v1/nodes/{self.name}")
        return got if isinstance(got, dict) else None

    def ready(self) -> bool:
        node = self.node()
        if node is None:
            return False
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        # The lifecycle controller's not-ready/unreachable taints gone; the agent's GPU-node reservation
        # (chart value gpuNodes.reserve) is no sign of an unready node.
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != contract.TAINT_GPU_NODE_KEY]
        return conditions.get("Ready") == "True" and not taints

    # --- introspection ----------------------------------------------------------------------------------
    def memory_mib(self) -> dict[str, float]:
        """Resident memory of each process of the cluster (MiB), the control plane's included."""
        out: dict[str, float] = {}
        for proc in self.plane.processes:
            try:
                status = Path(f"/proc/{proc.popen.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    out[proc.name] = int(line.split()[1]) / 1024
        return out

    def pod_memory_mib(self) -> dict[str, float]:
        """Resident memory of each running pod's processes (MiB), by `<namespace>/<pod>`: the processes in
        the pod's memory cgroup (the kubelet names it `pod<uid>`), their VmRSS summed."""
        got = self.plane.get("/api/v1/pods") or {}
        names = {p["metadata"]["uid"]: f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                 for p in got.get("items") or []}  # fmt: skip
        out: dict[str, float] = {}
        top = CGROUP_V1 / "memory" / self.cgroup_root.lstrip("/")
        for procs in top.rglob("cgroup.procs"):
            uid = next((part[3:].replace("_", "-") for part in procs.parts if part.startswith("pod")), None)
            if uid not in names:
                continue
            for pid in procs.read_text().split():
                out[names[uid]] = out.get(names[uid], 0.0) + _rss_mib(pid)
        return out

    # --- stop ------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        errors: list[str] = []

        def step(what: str, fn: Any) -> None:
            try:
                fn()
            except Exception as err:  # every step runs: a failed one must not leave the rest undone
                errors.append(f"{what}: {err}")

        # The controllers would recreate what the kubelet is about to stop.
        for proc in self.plane.processes:
            if proc.name == "kube-controller-manager":
                step("stop kube-controller-manager", proc.stop)
        step("delete pods", self._delete_pods)
        for name in ("kubelet", "kube-proxy", "kube-scheduler"):
            if name in self.processes:
                step(f"stop {name}", self.processes[name].stop)
        step("remove containers", self._remove_containers)
        if self.dns is not None:
            step("stop the cluster DNS", self.dns.stop)
        if "containerd" in self.processes:
            step("stop containerd", self.processes["containerd"].stop)
        step("stop shims", self._stop_shims)
        step("unmount", self._unmount)
        step("network namespaces", self._remove_netns)
        step("cgroups", self._remove_cgroups)
        step("iptables", self._restore_iptables)
        step("bridge", lambda: _run("ip", "link", "del", self.bridge, check=False))
        step("sysctls", self._restore_sysctls)
        step("log links", self._remove_log_links)
        step("device-plugin directory", self._remove_device_plugin_files)
        if errors:
            raise RuntimeError("node teardown left things behind:\n" + "\n".join(errors))

    def _delete_pods(self) -> None:
        """Every pod deleted through the API (graceful), and the kubelet left to stop them."""
        if "kubelet" not in self.processes or self.processes["kubelet"].popen.poll() is not None:
            return
        status, body = self.plane.request("GET", "/api/v1/pods")
        if status != 200:
            return
        for pod in body.get("items", []):
            meta = pod["metadata"]
            self.plane.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
        # DaemonSets and Deployments recreate theirs: the kubelet's CRI state is what must empty. Pods that
        # still run when the deadline passes are removed through containerd next.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not self._running_containers(), 90, "the kubelet to stop every container")

    def _running_containers(self) -> list[str]:
        out = self.ctr("tasks", "ls", check=False)
        return [ln.split()[0] for ln in out.stdout.splitlines()[1:] if "RUNNING" in ln]

    def _remove_containers(self) -> None:
        if "containerd" not in self.processes or self.processes["containerd"].popen.poll() is not None:
            return
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 60
        while self._running_containers() and time.monotonic() < deadline:
            time.sleep(0.2)
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)

    def _stop_shims(self) -> None:
        """containerd's runc shims outlive it: each names our socket on its command line."""
        needle = str(self.containerd_socket).encode()
        for pid in _pids_with_cmdline(needle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)

    def _unmount(self) -> None:
        prefix = str(self.workdir) + "/"
        for _ in range(5):
            mounts = [m for m in _mountpoints() if m.startswith(prefix)]
            if not mounts:
                return
            for mount in sorted(mounts, key=len, reverse=True):
                if _run("umount", mount, check=False).returncode != 0:
                    _run("umount", "-l", mount, check=False)
        left = [m for m in _mountpoints() if m.startswith(prefix)]
        if left:
            raise RuntimeError(f"still mounted: {left}")

    def _remove_netns(self) -> None:
        """containerd 1.6 pins pod network namespaces under /var/run/netns (not under its state dir)."""
        for name in (_listing(NETNS_DIR) or set()) - (self._netns_before or set()):
            # mountinfo names the real path (/var/run is a link to /run on Debian)
            path = os.path.realpath(f"{NETNS_DIR}/{name}")
            if path in _mountpoints():
                _run("umount", path, check=False)
            with contextlib.suppress(OSError):
                os.remove(path)
        if self._netns_before is None:  # containerd made it, as a bind mount onto itself
            real = os.path.realpath(NETNS_DIR)
            if real in _mountpoints():
                _run("umount", real, check=False)
            with contextlib.suppress(OSError):
                os.rmdir(real)

    def _remove_cgroups(self) -> None:
        left = []
        # runc on a hybrid host also joins its containers to the cgroup v2 hierarchy ("unified").
        for ctl in [*self._controllers(), "unified"]:
            top = CGROUP_V1 / ctl / self.cgroup_root.lstrip("/")
            if not top.exists():
                continue
            for dirpath, _, _ in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
                deadline = time.monotonic() + 10
                while True:
                    try:
                        os.rmdir(dirpath)
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            left.append(dirpath)
                            break
                        time.sleep(0.1)
        if left:
            raise RuntimeError(f"cgroups left: {left}")

    def _restore_iptables(self) -> None:
        for cmd, before in self._iptables.items():
            after = _iptables_state(cmd)
            for table in TABLES:
                chains_before, rules_before = before.get(table, (set(), set()))
                chains_after, rules_after = after[table]
                for rule in sorted(rules_after - rules_before):
                    args = shlex.split(rule)
                    _run(cmd, "-w", "-t", table, "-D", *args[1:], check=False)
                new_chains = chains_after - chains_before
                for chain in new_chains:
                    _run(cmd, "-w", "-t", table, "-F", chain, check=False)
                for chain in new_chains:
                    _run(cmd, "-w", "-t", table, "-X", chain, check=False)

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            (Path("/proc/sys") / key).write_text(value)

    def _remove_device_plugin_files(self) -> None:
        """The kubelet's socket and checkpoint, the agent's socket; the directories if the node made them."""
        for name in (_listing(str(KUBELET_DEVICE_PLUGINS)) or set()) - self._device_plugins_before:
            with contextlib.suppress(OSError):
                (KUBELET_DEVICE_PLUGINS / name).unlink()
        for path in self._made_dirs:
            with contextlib.suppress(OSError):
                path.rmdir()

    def _remove_log_links(self) -> None:
        """The kubelet links every container's log into /var/log/containers (a fixed path)."""
        for name in (_listing(LOG_LINKS_DIR) or set()) - (self._log_links_before or set()):
            path = Path(LOG_LINKS_DIR) / name
            if path.is_symlink() and os.readlink(path).startswith(str(self.workdir)):
                path.unlink()
        if self._log_links_before is None:
            with contextlib.suppress(OSError):
                os.rmdir(LOG_LINKS_DIR)


def _rss_mib(pid: str) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return next((int(ln.split()[1]) / 1024 for ln in status.splitlines() if ln.startswith("VmRSS:")), 0.0)


def _has_sys_resource() -> bool:
    """Whether this process holds CAP_SYS_RESOURCE, which lowering an oom_score_adj below 0 needs.

    Some sandboxes (this project's dev machines among them) drop it even for root: runc then fails every pod
    sandbox ("failed to update /proc/self/oom_score_adj: Permission denied", seen by the kubelet only as
    "can't get final child's PID from pipe: EOF"), so containerd is told to keep scores at or above its own,
    and the kubelet and kube-proxy to leave their own score alone."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE = 24
    return False


def _listing(directory: str) -> set[str] | None:
    return set(os.listdir(directory)) if os.path.isdir(directory) else None


def _overlay_works(workdir: Path) -> bool:
    """Whether an overlay mount works under `workdir` (else containerd's native snapshotter is used)."""
    base = Path(tempfile.mkdtemp(prefix="overlay-check-", dir=workdir))
    for d in ("lower", "upper", "work", "merged"):
        (base / d).mkdir()
    options = f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work"
    ok = (
        _run("mount", "-t", "overlay", "overlay", "-o", options, str(base / "merged"), check=False).returncode
        == 0
    )
    if ok:
        _run("umount", str(base / "merged"), check=False)
    shutil.rmtree(base, ignore_errors=True)
    return ok


def _mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        points.append(point.encode().decode("unicode_escape"))
    return points


def _pids_with_cmdline(needle: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(entry))
    return pids


@contextlib.contextmanager
def one_node_cluster(containerd: str | None = None) -> Iterator[Node]:
    """The control plane on the host's address and the node; everything undone on exit. `containerd` is
    "built" or "debian" (default: $TESSERA_NODE_CONTAINERD, else DEFAULT_CONTAINERD)."""
    which = containerd or os.environ.get(CONTAINERD_ENV) or DEFAULT_CONTAINERD
    if which not in ("built", "debian"):
        raise ValueError(f"{CONTAINERD_ENV}={which!r}: expected 'built' or 'debian'")
    preflight(which)
    address = host_address()
    t0 = time.monotonic()
    with control_plane(bind_address=address, controllers=NODE_CONTROLLERS) as plane:
        control_plane_s = time.monotonic() - t0
        images = build_images(plane.assets)
        images_s = time.monotonic() - t0 - control_plane_s
        containerd_dir = built_containerd() if which == "built" else None
        workdir = Path(tempfile.mkdtemp(prefix="tessera-node-"))
        node = Node(plane, workdir, images, address=address, containerd_dir=containerd_dir)
        node.timings["control plane"] = control_plane_s
        node.timings["images built"] = images_s
        try:
            node.start()
            yield node
        finally:
            try:
                node.stop()
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
