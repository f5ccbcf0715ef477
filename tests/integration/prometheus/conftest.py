"""`prometheus` fixture: start a real Prometheus scraping given targets; skipped when the binary is absent."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.requires import missing

from .prom_server import PrometheusServer, prometheus_binary

StartPrometheus = Callable[[Mapping[str, Sequence[str]]], PrometheusServer]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[StartPrometheus]:
    """Factory: prometheus({"job": ["127.0.0.1:9100"]}) -> a ready PrometheusServer, stopped at teardown."""
    binary = prometheus_binary()
    if binary is None:
        missing("prometheus binary not on PATH; install it with: bash hack/install-test-deps.sh")
    servers: list[PrometheusServer] = []

    def start(targets: Mapping[str, Sequence[str]]) -> PrometheusServer:
        server = PrometheusServer(binary, tmp_path / f"prometheus-{len(servers)}", targets)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop()
