"""The node's cluster DNS: the A records CoreDNS's `kubernetes` plugin serves, answered from the API server.

Pods find each other and Services by name (a ModelDeployment's gateway names its workers
`<pod>.<name>-workers.<namespace>.svc`; the operator reads the gateway at `<name>-gateway.<namespace>.svc`),
and no CoreDNS image can be had without a registry. So the harness answers those names itself: a UDP server
on the host's address behind a `kube-dns` Service in kube-system, whose ClusterIP the kubelet writes into
every pod's resolv.conf (`clusterDNS`), reached through kube-proxy like any Service. It answers

  <service>.<namespace>.svc.<domain>           the Service's ClusterIP (a headless one: its pods' IPs)
  <hostname>.<subdomain>.<namespace>.svc.<domain>   the IP of the pod with that hostname and subdomain

and NXDOMAIN for every other name (nothing outside the cluster is forwarded).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import struct
import threading
import time
from typing import Any

from tests.integration.k8s.controlplane import ControlPlane

DOMAIN = "cluster.local"
SERVICE_IP = "10.0.0.10"  # in the control plane's Service range (SERVICE_RANGE, 10.0.0.0/24)
TYPE_A, CLASS_IN = 1, 1
NOERROR, NXDOMAIN, FORMERR = 0, 3, 1


def _question(packet: bytes) -> tuple[str, int, int]:
    """(name, type, offset after the question) of a query's first question."""
    labels, pos = [], 12
    while (n := packet[pos]) != 0:
        if n & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(packet[pos + 1 : pos + 1 + n].decode("ascii", "replace"))
        pos += 1 + n
    qtype, _ = struct.unpack("!HH", packet[pos + 1 : pos + 5])
    return ".".join(labels).lower(), qtype, pos + 5


def answer(packet: bytes, lookup: Any) -> bytes:
    """The reply to one query; `lookup(name)` gives its IPv4 addresses, or None when the name does not exist."""
    (ident,) = struct.unpack("!H", packet[:2])
    try:
        name, qtype, end = _question(packet)
    except (ValueError, IndexError, struct.error):
        return struct.pack("!HHHHHH", ident, 0x8180 | FORMERR, 0, 0, 0, 0)
    found = lookup(name)
    addresses = found if found is not None and qtype == TYPE_A else []
    rcode = NXDOMAIN if found is None else NOERROR
    header = struct.pack("!HHHHHH", ident, 0x8180 | rcode, 1, len(addresses), 0, 0)
    records = b"".join(
        struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, 5, 4) + socket.inet_aton(a) for a in addresses
    )
    return header + packet[12:end] + records


def query(name: str, server: tuple[str, int], timeout: float = 5.0) -> str:
    """One A query for `name` sent to `server` over UDP, as a pod's resolver sends it: the answer's rcode
    and addresses with the time it took, or why none came (for a failed test's diagnosis)."""
    ident = secrets.randbits(16)
    packet = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
    packet += b"".join(bytes([len(part)]) + part.encode() for part in name.split(".")) + b"\0"
    packet += struct.pack("!HH", TYPE_A, CLASS_IN)
    t0 = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(packet, server)
            reply, _ = sock.recvfrom(4096)
        except OSError as err:
            return f"no answer from {server[0]}:{server[1]} ({err!r}) after {time.monotonic() - t0:.2f}s"
    rcode = struct.unpack("!H", reply[2:4])[0] & 0xF
    count = struct.unpack("!H", reply[6:8])[0]
    # This server's answers follow the echoed question, 16 bytes each (a name pointer, type, class, TTL,
    # length, and the 4-byte address last).
    addresses = [
        socket.inet_ntoa(reply[at + 12 : at + 16]) for at in range(len(packet), len(packet) + 16 * count, 16)
    ]
    return f"rcode {rcode} {sorted(addresses)} from {server[0]}:{server[1]} in {time.monotonic() - t0:.2f}s"


class ClusterDns:
    """The DNS server (a thread of the test process) and its `kube-dns` Service."""

    def __init__(self, plane: ControlPlane, address: str) -> None:
        self.plane = plane
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 0))
        self.address, self.port = address, self.sock.getsockname()[1]
        self.service_ip = SERVICE_IP
        self.queries = 0
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)

    def start(self) -> None:
        self._thread.start()
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system"},
            "spec": {
                "clusterIP": SERVICE_IP,
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": self.port}],
            },
        }
        status, body = self.plane.request("POST", "/api/v1/namespaces/kube-system/services", service)
        assert status == 201, body
        # No selector: the endpoint is given, as an EndpointSlice kube-proxy reads.
        endpoints = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-harness",
                "namespace": "kube-system",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "tessera-node-harness",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
            "ports": [{"name": "dns", "port": self.port, "protocol": "UDP"}],
        }
        status, body = self.plane.request(
            "POST", "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", endpoints
        )
        assert status == 201, body

    def stop(self) -> None:
        # shutdown wakes the thread blocked in recvfrom (close alone would not), then it sees the error.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(10)

    def _serve(self) -> None:
        while True:
            try:
                packet, peer = self.sock.recvfrom(4096)
            except OSError:
                return  # closed
            if peer is None:
                return  # shut down
            self.queries += 1
            try:
                reply = answer(packet, self.lookup)
            except Exception:  # a failed API read is SERVFAIL, and the server goes on
                reply = packet[:2] + struct.pack("!H", 0x8182) + b"\0" * 8
            with contextlib.suppress(OSError):
                self.sock.sendto(reply, peer)

    def lookup(self, name: str) -> list[str] | None:
        suffix = f".svc.{DOMAIN}"
        if not name.endswith(suffix):
            return None
        parts = name[: -len(suffix)].split(".")
        if len(parts) == 2:
            service, namespace = parts
            svc = self.plane.get(f"/api/v1/namespaces/{namespace}/services/{service}")
            if not isinstance(svc, dict):
                return None
            ip = svc["spec"].get("clusterIP")
            if ip and ip != "None":
                return [ip]
            selector = ",".join(f"{k}%3D{v}" for k, v in (svc["spec"].get("selector") or {}).items())
            return [ip for pod in self._pods(namespace, selector) if (ip := pod["status"].get("podIP"))]
        if len(parts) == 3:
            host, subdomain, namespace = parts
            return [
                ip
                for pod in self._pods(namespace)
                if pod["spec"].get("hostname") == host
                and pod["spec"].get("subdomain") == subdomain
                and (ip := pod["status"].get("podIP"))
            ] or None
        return None

    def _pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        got = self.plane.get(f"/api/v1/namespaces/{namespace}/pods{query}") or {}
        return [p for p in got.get("items") or [] if not p["metadata"].get("deletionTimestamp")]
