"""A real Kubernetes control plane for tests, in the envtest convention.

etcd + kube-apiserver + kube-controller-manager (and, on demand, a kube-scheduler pointed at an extender),
all on free loopback ports, one set per test session. Binaries are found in the directory named by
`TESSERA_K8S_ASSETS` (or envtest's `KUBEBUILDER_ASSETS`), else built from their Go modules by
`hack/k8s-assets.sh` (a cache under ~/.cache/tessera answers at once once built); etcd comes from PATH
(Debian's `etcd-server`). Every process is started in its own session and stopped by its PID; a component
that fails to start raises with the tail of its log, so a broken start says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
ASSETS_SCRIPT = ROOT / "hack" / "k8s-assets.sh"
# The one version the suite runs: what hack/k8s/go.mod requires of k8s.io/kubernetes.
_REQUIRE = re.search(
    r"^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)\s*$", (ROOT / "hack/k8s/go.mod").read_text(), re.M
)
assert _REQUIRE, "hack/k8s/go.mod requires no k8s.io/kubernetes version"
K8S_VERSION = _REQUIRE.group(1)
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE_BINARIES = ("kubelet", "kube-proxy")
ADMIN_TOKEN = "tessera-test-admin"
SERVICE_RANGE = "10.0.0.0/24"  # the API server's --service-cluster-ip-range
# Every request a ServiceAccount makes (the components run as theirs), as the authorizer saw it: verb,
# resource, namespace, response code. Admin and the control plane's own requests are not recorded.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
}


class NoBinaries(RuntimeError):
    """The control plane's binaries are not on this machine (the tests skip, except in CI)."""


def go_assets(env: str, script: str, what: str, tools: tuple[str, ...]) -> Path:
    """The directory a `hack/*-assets.sh` script prints as its last line, holding `tools`: `$env` when set
    (hack/test.sh exports it), else the script's build (from its cache once built). NoBinaries saying what
    is missing, or where there is no Go to build it."""
    named = os.environ.get(env)
    if named:
        path = Path(named)
        missing = [t for t in tools if not (path / t).exists()]
        if missing:
            raise NoBinaries(f"{env}={path} lacks {', '.join(missing)}")
        return path
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        raise NoBinaries(f"no {what} and no Go to build it: install Go, or set {env}")
    proc = subprocess.run(
        ["bash", str(ROOT / "hack" / script)], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise NoBinaries(f"hack/{script} failed (exit {proc.returncode}); run it to see why")
    return Path(lines[-1])


def build_assets() -> Path:
    """The directory `hack/k8s-assets.sh` prints: built from Go modules on first use, then from its cache.

    The build's progress goes to this process's stderr (pytest shows it with -s); a failed build says why.
    """
    if shutil.which("go") is None:
        raise NoBinaries(
            "no Kubernetes binaries and no Go to build them: install Go, or set TESSERA_K8S_ASSETS"
        )
    proc = subprocess.run(["bash", str(ASSETS_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise NoBinaries(f"hack/k8s-assets.sh failed (exit {proc.returncode}); run it to see why")
    return Path(lines[-1])


def find_assets() -> tuple[Path, Path]:
    """(directory of the Kubernetes binaries, etcd binary), or NoBinaries saying what is missing."""
    assets: Path | None = None
    for var in ("TESSERA_K8S_ASSETS", "KUBEBUILDER_ASSETS"):
        if os.environ.get(var):
            assets = Path(os.environ[var])
            missing = [b for b in BINARIES if not (assets / b).exists()]
            if missing:
                raise NoBinaries(f"{var}={assets} lacks {', '.join(missing)}")
            break
    if assets is None:
        assets = build_assets()
    etcd = (assets / "etcd") if (assets / "etcd").exists() else shutil.which("etcd")
    if not etcd:
        raise NoBinaries("no etcd on PATH: run `bash hack/install-test-deps.sh` (Debian's etcd-server)")
    if not shutil.which("openssl"):
        raise NoBinaries("no openssl on PATH (the service-account key): run `bash hack/install-test-deps.sh`")
    return assets, Path(etcd)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout)


def wait_until(check: Any, timeout: float, what: str, proc: Process | None = None) -> Any:
    """Poll `check` until truthy; the deadline bounds failure only. A component that exits fails at once."""
    deadline = time.monotonic() + timeout
    last_err: BaseException | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) while {what}:\n{proc.tail()}")
        try:
            result = check()
            if result:
                return result
        except Exception as err:
            last_err = err
        time.sleep(0.1)
    detail = f"\nlast error: {last_err}" if last_err else ""
    log = f"\n{proc.name} log:\n{proc.tail()}" if proc else ""
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}{detail}{log}")


# The controllers the API-only tests run: no node IPAM, no node lifecycle (their nodes have no kubelet to
# heartbeat, so they would be tainted unreachable), no TTL annotations.
API_ONLY_CONTROLLERS = "*,-nodeipam,-nodelifecycle,-ttl"


@dataclass
class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager; `kubeconfig` is cluster-admin's.

    The API server listens on `bind_address`, loopback by default. Given an address of the host's (the node
    harness does), it also advertises it: the `kubernetes` Service then has that endpoint, so pods reach the
    API server through the Service's ClusterIP as in any cluster. Clients authenticate with a token, or with
    a certificate `issue_client_cert` signs with the plane's client CA (a kubelet as `system:node:<name>`);
    the Node authorizer runs before RBAC, as kubeadm sets it up.
    """

    assets: Path
    etcd_bin: Path
    workdir: Path
    processes: list[Process] = field(default_factory=list)
    api_port: int = 0
    kubeconfig: Path = Path()
    bind_address: str = "127.0.0.1"
    controllers: str = API_ONLY_CONTROLLERS
    apiserver_args: tuple[str, ...] = ()  # appended to kube-apiserver's flags
    controller_manager_args: tuple[str, ...] = ()  # appended to kube-controller-manager's flags

    @property
    def server(self) -> str:
        return f"https://{self.bind_address}:{self.api_port}"

    @property
    def loopback(self) -> bool:
        return self.bind_address.startswith("127.")

    @property
    def ca_file(self) -> Path:
        """The API server's self-signed serving certificate (and its CA): what clients verify it with."""
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def client_ca(self) -> tuple[Path, Path]:
        """(certificate, key) of the CA the API server accepts client certificates from."""
        return self.workdir / "certs" / "client-ca.crt", self.workdir / "certs" / "client-ca.key"

    def issue_client_cert(
        self, name: str, common_name: str, organizations: tuple[str, ...] = ()
    ) -> tuple[Path, Path]:
        """A client certificate (CN = user, O = groups) signed by the client CA: (certificate, key)."""
        certs = self.workdir / "certs"
        key, csr, crt = certs / f"{name}.key", certs / f"{name}.csr", certs / f"{name}.crt"
        subject = "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"
        ca_crt, ca_key = self.client_ca
        subprocess.run(
            ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
             "-keyout", str(key), "-out", str(csr)],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-out", str(crt)],
            check=True, capture_output=True,
        )  # fmt: skip
        return crt, key

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def audit_offset(self) -> int:
        """Where the audit log ends now: pass it to `audit` to see only the requests made from here on."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit(self, username: str, offset: int = 0) -> list[dict[str, Any]]:
        """The API server's audit events (metadata level) of the requests `username` made after `offset`."""
        if not self.audit_log.exists():
            return []
        with self.audit_log.open("rb") as f:
            f.seek(offset)
            lines = f.read().split(b"\n")[:-1]  # the last may still be being written
        events = (json.loads(line) for line in lines if line.strip())
        return [e for e in events if e["user"]["username"] == username]

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """Start a process of the test cluster (own session, log in the work dir); stopped with the plane."""
        log = self.workdir / f"{name}.log"
        popen = subprocess.Popen(
            argv,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.workdir,
            env=env,
        )
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def start(self) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(parents=True)
        key, crt = self.workdir / "sa.key", self.workdir / "sa.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=sa",
             "-keyout", str(key), "-out", str(crt)],
            check=True, capture_output=True,
        )  # fmt: skip
        ca_crt, ca_key = self.client_ca
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=tessera-test-client-ca", "-keyout", str(ca_key), "-out", str(ca_crt)],
            check=True, capture_output=True,
        )  # fmt: skip
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))

        client, peer = free_port(), free_port()
        etcd = self.spawn(
            "etcd",
            [str(self.etcd_bin), "--data-dir", str(self.workdir / "etcd"), "--name", "test",
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"test=http://127.0.0.1:{peer}",
             "--unsafe-no-fsync"],
        )  # fmt: skip
        wait_until(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=2).status == 200,
            60, "etcd to be healthy", etcd,
        )  # fmt: skip

        self.api_port = free_port()
        api = self.spawn(
            "kube-apiserver",
            [str(self.assets / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{client}",
             f"--bind-address={self.bind_address}", f"--secure-port={self.api_port}",
             f"--advertise-address={self.bind_address}",
             # On loopback no pod reaches the API server through the `kubernetes` Service, and since v1.36
             # the endpoint reconciler refuses a loopback address for it.
             *(["--endpoint-reconciler-type=none"] if self.loopback else []),
             f"--service-cluster-ip-range={SERVICE_RANGE}", f"--cert-dir={certs}",
             f"--token-auth-file={tokens}", f"--client-ca-file={ca_crt}",
             "--authorization-mode=Node,RBAC", "--allow-privileged=true",
             # `kubectl logs` and exec reach a kubelet at its node's InternalIP (its Hostname may not resolve).
             "--kubelet-preferred-address-types=InternalIP",
             f"--service-account-key-file={crt}", f"--service-account-signing-key-file={key}",
             "--service-account-issuer=https://kubernetes.default.svc",
             f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
             "--profiling=false", *self.apiserver_args],
        )  # fmt: skip
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        wait_until(lambda: self.ca_file.exists(), 60, "the API server's serving certificate", api)
        self.write_kubeconfig(self.kubeconfig, token=ADMIN_TOKEN)
        wait_until(lambda: self.get("/readyz") == "ok", 120, "the API server to be ready", api)

        self.spawn(
            "kube-controller-manager",
            [str(self.assets / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
             "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
             f"--controllers={self.controllers}", f"--root-ca-file={self.ca_file}",
             f"--service-account-private-key-file={key}", "--concurrent-gc-syncs=5",
             *self.controller_manager_args],
        )  # fmt: skip

    def write_kubeconfig(
        self, path: Path, *, token: str | None = None, cert: tuple[Path, Path] | None = None
    ) -> Path:
        """A kubeconfig for this server with a bearer token, or a client (certificate, key)."""
        user: dict[str, str] = {"token": token} if token is not None else {}
        if cert is not None:
            user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u"}}],
            "current-context": "test",
        }  # fmt: skip
        path.write_text(yaml.safe_dump(doc))
        return path

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(
        self, method: str, path: str, body: Any = None, *, token: str = ADMIN_TOKEN,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:  # fmt: skip
        """One API call as `token` (admin by default): (HTTP status, decoded JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        return body if status == 200 else None

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as cluster-admin: the one `hack/cli-assets.sh` builds (of this release) when
        `TESSERA_CLI_DIR` names it, as hack/test.sh does, else the one on PATH."""
        built = Path(os.environ.get("TESSERA_CLI_DIR") or "/nonexistent") / "kubectl"
        kubectl = str(built) if built.exists() else shutil.which("kubectl")
        if kubectl is None:
            raise NoBinaries("kubectl is not on PATH (or set TESSERA_CLI_DIR: hack/cli-assets.sh)")
        return subprocess.run(
            [kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            check=check, capture_output=True, text=True, input=stdin, timeout=120,
        )  # fmt: skip

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()


@contextlib.contextmanager
def default_scheduler(cluster: ControlPlane) -> Iterator[Process]:
    """kube-scheduler with its default profile (DRA's allocator included), as cluster-admin: it binds the pods
    that name no scheduler and allocates their claims, as in any cluster. Stopped on exit."""
    sched = cluster.spawn(
        f"kube-scheduler-default-{secrets.token_hex(3)}",
        [str(cluster.assets / "kube-scheduler"), f"--kubeconfig={cluster.kubeconfig}", "--leader-elect=false",
         "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "-v=2"],
    )  # fmt: skip
    try:
        wait_until(
            lambda: "Starting Kubernetes Scheduler" in sched.log.read_text(), 60, "kube-scheduler", sched
        )
        yield sched
    finally:
        sched.stop()


@contextlib.contextmanager
def control_plane(
    bind_address: str = "127.0.0.1",
    controllers: str = API_ONLY_CONTROLLERS,
    apiserver_args: tuple[str, ...] = (),
    controller_manager_args: tuple[str, ...] = (),
) -> Iterator[ControlPlane]:
    assets, etcd = find_assets()
    workdir = Path(tempfile.mkdtemp(prefix="tessera-k8s-"))
    plane = ControlPlane(
        assets,
        etcd,
        workdir,
        bind_address=bind_address,
        controllers=controllers,
        apiserver_args=apiserver_args,
        controller_manager_args=controller_manager_args,
    )
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
