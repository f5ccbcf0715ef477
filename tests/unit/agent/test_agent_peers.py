"""Mapping a socket peer's cgroup to its pod (tessera_agent.lanes.peers): the path forms kubelet writes, and the ones
a workload could write below its own cgroup to pass for another pod."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from tessera_agent.lanes.peers import PeerRefused, PeerResolver, peer_credentials, pod_uid_from_cgroup_text
from tessera_agent.pods import StaticPodSource

from tests.integration.agent.peer_support import NODE, FakeProc, lane_pod, pod_uid

UID = "1f2e3d4c-0000-4000-8000-00000000abcd"
OTHER = "99999999-0000-4000-8000-000000000000"
SYSTEMD = UID.replace("-", "_")


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver, burstable / guaranteed / besteffort
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD}.slice/cri-containerd-1.scope",
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD}.slice/cri-containerd-1.scope",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD}.slice/crio-1.scope",
        # seen from the agent's own cgroup namespace
        f"0::/../../kubepods-burstable-pod{SYSTEMD}.slice/cri-containerd-1.scope",
        # kind nests kubelet's hierarchy under kubelet.slice
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{SYSTEMD}.slice/cri-containerd-1.scope",
        # cgroup v1, cgroupfs driver: a line per controller
        f"12:memory:/kubepods/burstable/pod{UID}/0abc\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/0abc\n"
        f"1:name=systemd:/kubepods/burstable/pod{UID}/0abc",
        f"4:pids:/kubepods/pod{UID}/0abc",
    ],
)
def test_kubelet_path_forms_name_the_pod(text: str) -> None:
    assert pod_uid_from_cgroup_text(text + "\n") == UID


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope",
        "0::/system.slice/containerd.service",
        "0::/",
        "",
        "garbage without colons",
        f"0::/kubepods/burstable/pod{UID[:-1]}/0abc",  # not a whole UID
        # v1 controllers that disagree: trust none
        f"12:memory:/kubepods/burstable/pod{UID}/0abc\n11:pids:/kubepods/burstable/pod{OTHER}/0abc",
    ],
)
def test_outside_a_pod_or_ambiguous_is_no_pod(text: str) -> None:
    assert pod_uid_from_cgroup_text(text) is None


def test_a_sub_cgroup_named_after_another_pod_does_not_change_the_pod() -> None:
    nested = f"0::/kubepods/burstable/pod{UID}/0abc/pod{OTHER}/kubepods-pod{OTHER.replace('-', '_')}.slice"
    assert pod_uid_from_cgroup_text(nested) == UID


async def test_resolver_maps_credentials_to_the_pod_on_this_node(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path)
    source = StaticPodSource([lane_pod("ml", "train", 1, "lane-1")])
    resolver = PeerResolver(NODE, source, proc_root=tmp_path)
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        creds = peer_credentials(a)
    assert (creds.pid, creds.uid, creds.gid) == (os.getpid(), os.getuid(), os.getgid())
    with pytest.raises(PeerRefused, match="not in a pod"):
        await resolver.pod_of(creds)  # no cgroup file for this pid yet
    fake.place(creds.pid, pod_uid(7))
    with pytest.raises(PeerRefused, match="not on node node-a"):
        await resolver.pod_of(creds)
    fake.place(creds.pid, pod_uid(1), form="cgroupfs")
    assert (await resolver.pod_of(creds)).key == "ml/train"
    creds0 = type(creds)(0, 0, 0)  # a peer in a PID namespace the agent cannot see
    with pytest.raises(PeerRefused, match="pid 0"):
        await resolver.pod_of(creds0)
