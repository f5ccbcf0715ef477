"""The operator's in-cluster login addresses the API server as client-go does, by the Service's env vars."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from tessera.controller import handlers


@pytest.fixture
def service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t", default_namespace="ns")

    monkeypatch.setattr(kopf, "login_with_service_account", fake)


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.0.0.1", "443", "https://10.0.0.1:443"),
        ("fd00::1", "6443", "https://[fd00::1]:6443"),
        ("", "", "https://kubernetes.default.svc"),  # the env vars unset: kopf's own address stays
    ],
)
def test_in_cluster_login_uses_the_service_env_not_dns(
    service_account: None, monkeypatch: pytest.MonkeyPatch, host: str, port: str, server: str
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    conn = handlers.login_in_cluster()
    assert conn is not None
    assert (conn.server, conn.token, conn.default_namespace) == (server, "t", "ns")


def test_outside_a_cluster_there_is_no_in_cluster_login(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: None)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert handlers.login_in_cluster() is None
